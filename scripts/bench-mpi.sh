#!/usr/bin/env bash
# MPI benchmarks of the cluster binding under `mpirun -n 2`: ping-pong
# latency and bandwidth from 8 B to 4 MiB and the message rate of 8 B and
# 512 B messages, each written once in C (straight MPI) and once in Go
# (through cluster) in the same binary, run in alternating chunks so both
# see the same machine load; go/c is the median over chunk pairs of the Go
# time over the C time. The collectives of an exchange's control path
# (Alltoall of one int64, Allreduce of 7, Barrier) are timed the same way,
# MPI's own against cluster's bounded ones (the ...Within functions);
# bounded/mpi is their median ratio. Then the Go loops again with every MPI call
# funnelled to one thread (DISTBUF_MPI_THREAD=funneled), the design the
# package does not use by default. Each benchmark runs ROUNDS times
# (default 3); the summary gives the median over rounds. Raw `go test
# -bench` lines (benchstat input) go to $BENCH_OUT, by default
# bin/bench-mpi.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
MPIRUN=${MPIRUN:-mpirun}
ROUNDS=${ROUNDS:-3}
run_timeout=${MPI_BENCH_TIMEOUT:-600}

flags=()
if "$MPIRUN" --version 2>&1 | grep -q "Open MPI"; then
  [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
  flags+=(--oversubscribe)
fi
# shellcheck disable=SC2206
flags+=(${MPIRUN_FLAGS:-})

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p bin
out=${BENCH_OUT:-bin/bench-mpi.txt}
bin="$tmp/mpibench.test"
"$GO" test -c -tags mpi -o "$bin" ./cluster/internal/mpibench

run() { # design, bench regexp, iterations
  local design=$1 pattern=$2 iters=$3
  echo "bench-mpi: $MPIRUN -n 2 mpibench.test -test.bench '$pattern' -test.benchtime ${iters}x -test.count $ROUNDS (DISTBUF_MPI_THREAD=$design)" >&2
  # shellcheck disable=SC2086
  DISTBUF_MPI_THREAD=$design timeout --kill-after=10 "$run_timeout" \
    "$MPIRUN" "${flags[@]}" -x DISTBUF_MPI_THREAD -n 2 "$bin" \
    -test.run '^$' -test.bench "$pattern" -test.benchtime "${iters}x" -test.count "$ROUNDS" |
    tee -a "$out" | grep '^Benchmark' >&2 || return 1
}

: >"$out"
run multiple 'PingPong/bytes=(8|64|512|4096)/' 20000
run multiple 'PingPong/bytes=(32768|65536|262144)/' 2000
run multiple 'PingPong/bytes=(1048576|4194304)/' 300
run multiple 'MessageRate' 2000
run funneled 'PingPong/bytes=(8|512|65536)/' 20000
run funneled 'MessageRate' 2000
run multiple 'Collective' 5000
run funneled 'Collective' 2000
echo "bench-mpi: raw results in $out" >&2

# Summary: for each benchmark and size, the median over rounds of each
# reported metric; latency in us one way, rates in messages a second.
awk '
function median(key,   n, i, j, v, tmp) {
  n = cnt[key]
  if (n == 0) return ""
  for (i = 1; i <= n; i++) v[i] = val[key, i]
  for (i = 2; i <= n; i++) { tmp = v[i]; for (j = i - 1; j >= 1 && v[j] > tmp; j--) v[j + 1] = v[j]; v[j + 1] = tmp }
  return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
/^Benchmark/ {
  split($1, part, "/")
  bench = part[1]; sub(/^Benchmark/, "", bench)
  bytes = part[2]; sub(/^bytes=/, "", bytes)
  thread = part[3]; sub(/^thread=/, "", thread); sub(/-[0-9]+$/, "", thread)
  if (bench == "Collective") next
  row = bench SUBSEP bytes
  if (!(row in seen)) { seen[row] = 1; rows[++nrows] = row }
  for (i = 3; i < NF; i++) {
    unit = $(i + 1)
    if (unit !~ /^(c-us\/oneway|go-us\/oneway|go\/c|c-msgs\/s|go-msgs\/s)$/) continue
    key = row SUBSEP thread SUBSEP unit
    val[key, ++cnt[key]] = $i
  }
}
END {
  printf "%-12s %8s | %12s %12s %7s | %14s\n", "benchmark", "bytes", "C", "Go", "Go/C", "Go funnelled"
  for (r = 1; r <= nrows; r++) {
    split(rows[r], rb, SUBSEP)
    unit = rb[1] == "PingPong" ? "us/oneway" : "msgs/s"
    c = median(rows[r] SUBSEP "multiple" SUBSEP "c-" unit)
    g = median(rows[r] SUBSEP "multiple" SUBSEP "go-" unit)
    q = median(rows[r] SUBSEP "multiple" SUBSEP "go/c")
    f = median(rows[r] SUBSEP "funneled" SUBSEP "go-" unit)
    printf "%-12s %8s | %12s %12s %7s | %14s   %s\n", rb[1], rb[2], c, g, q, f, unit
  }
}' "$out"

# The collectives: per operation and design, the median over rounds.
awk '
function median(key,   n, i, j, v, tmp) {
  n = cnt[key]
  if (n == 0) return ""
  for (i = 1; i <= n; i++) v[i] = val[key, i]
  for (i = 2; i <= n; i++) { tmp = v[i]; for (j = i - 1; j >= 1 && v[j] > tmp; j--) v[j + 1] = v[j]; v[j + 1] = tmp }
  return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
/^BenchmarkCollective\// {
  n = split($1, part, "/")
  op = part[2]; sub(/^op=/, "", op)
  if (n > 3) op = op "/" part[3]
  thread = part[n]; sub(/^thread=/, "", thread); sub(/-[0-9]+$/, "", thread)
  row = op SUBSEP thread
  if (!(row in seen)) { seen[row] = 1; rows[++nrows] = row }
  for (i = 3; i < NF; i++) {
    unit = $(i + 1)
    if (unit !~ /^(mpi-us|bounded-us|bounded\/mpi)$/) continue
    val[row SUBSEP unit, ++cnt[row SUBSEP unit]] = $i
  }
}
END {
  if (nrows == 0) exit
  printf "\n%-16s %-9s | %10s %12s %12s\n", "collective", "design", "MPI us", "bounded us", "bounded/MPI"
  for (r = 1; r <= nrows; r++) {
    split(rows[r], rb, SUBSEP)
    printf "%-16s %-9s | %10s %12s %12s\n", rb[1], rb[2], median(rows[r] SUBSEP "mpi-us"), median(rows[r] SUBSEP "bounded-us"), median(rows[r] SUBSEP "bounded/mpi")
  }
}' "$out"
