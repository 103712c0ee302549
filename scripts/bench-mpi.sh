#!/usr/bin/env bash
# MPI benchmarks of the cluster binding under `mpirun -n 2`: ping-pong
# latency and bandwidth from 8 B to 4 MiB and the message rate of 8 B and
# 512 B messages, each written once in C (straight MPI) and once in Go
# (through cluster) in the same binary, then the Go loops again with every
# MPI call funnelled to one thread. Each benchmark runs ROUNDS times (C and
# Go alternating); the summary gives medians and the Go/C ratio of medians.
# Raw `go test -bench` lines (benchstat input) go to $BENCH_OUT
# (default bench-mpi.txt in a temporary directory, path printed).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
MPIRUN=${MPIRUN:-mpirun}
ROUNDS=${ROUNDS:-5}
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
out=${BENCH_OUT:-$tmp/bench-mpi.txt}
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
run multiple 'PingPong/bytes=(8|64|512|4096)/' 10000
run multiple 'PingPong/bytes=(32768|65536|262144|1048576|4194304)/' 1000
run multiple 'MessageRate' 2000
run funneled 'PingPong/bytes=(8|512|65536)/' 10000
run funneled 'MessageRate' 2000

echo "bench-mpi: raw results in $out" >&2
if [ -z "${BENCH_OUT:-}" ]; then cp "$out" ./bench-mpi.last.txt 2>/dev/null && echo "bench-mpi: copied to bench-mpi.last.txt" >&2; fi

# Summary: medians over the rounds, and Go/C ratios.
awk '
function median(key,   n, i, j, v, tmp) {
  n = cnt[key]
  for (i = 1; i <= n; i++) v[i] = val[key, i]
  for (i = 2; i <= n; i++) { tmp = v[i]; for (j = i - 1; j >= 1 && v[j] > tmp; j--) v[j + 1] = v[j]; v[j + 1] = tmp }
  return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
/^Benchmark/ {
  split($1, part, "/")
  bench = part[1]; sub(/^Benchmark/, "", bench)
  bytes = part[2]; sub(/^bytes=/, "", bytes)
  impl = part[3]; sub(/^impl=/, "", impl)
  thread = part[4]; sub(/^thread=/, "", thread); sub(/-[0-9]+$/, "", thread)
  metric = ""
  for (i = 3; i <= NF; i++) {
    if (bench == "PingPong" && $(i + 1) == "us/oneway") metric = $i
    if (bench == "MessageRate" && $(i + 1) == "msgs/s") metric = $i
  }
  key = bench SUBSEP bytes SUBSEP impl SUBSEP thread
  if (!(key in cnt)) { order[++nkeys] = key }
  cnt[key]++; val[key, cnt[key]] = metric
  if (!((bench SUBSEP bytes) in seenrow)) { seenrow[bench SUBSEP bytes] = 1; rows[++nrows] = bench SUBSEP bytes }
}
END {
  printf "\n%-12s %9s %12s %12s %8s %14s\n", "benchmark", "bytes", "C", "Go", "Go/C", "Go funnelled"
  for (r = 1; r <= nrows; r++) {
    split(rows[r], rb, SUBSEP); b = rb[1]; s = rb[2]
    unit = b == "PingPong" ? "us/oneway" : "msgs/s"
    c = ((b SUBSEP s SUBSEP "c" SUBSEP "multiple") in cnt) ? median(b SUBSEP s SUBSEP "c" SUBSEP "multiple") : ""
    g = ((b SUBSEP s SUBSEP "go" SUBSEP "multiple") in cnt) ? median(b SUBSEP s SUBSEP "go" SUBSEP "multiple") : ""
    f = ((b SUBSEP s SUBSEP "go" SUBSEP "funneled") in cnt) ? median(b SUBSEP s SUBSEP "go" SUBSEP "funneled") : ""
    ratio = ""
    if (c != "" && g != "" && c > 0 && g > 0) ratio = sprintf("%.2f", b == "PingPong" ? g / c : c / g)
    printf "%-12s %9s %12s %12s %8s %14s   (%s, median of rounds; Go/C is time ratio)\n", b, s, c, g, ratio, f, unit
  }
}' "$out"
