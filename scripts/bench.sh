#!/usr/bin/env bash
# make bench: every benchmark of this machine, and PNG plots (packed
# against per-block over block counts).
#
#   out/bench/go-bench.txt     go test -bench of every package: the single-rank
#                              benchmarks (devalloc's BenchmarkAlloc, packing's
#                              BenchmarkGather, gemm's GPU benchmarks, ...) with
#                              their ratios as metrics; -short keeps the alloc
#                              cycles small, BENCH_FULL=1 runs them at full size
#   out/bench/solve.jsonl      ranktest -json summaries, -mode packed and perblock
#   out/bench/exchange.jsonl   distbench exchange, every host mode
#   out/bench/solve-host.png, out/bench/exchange-host.png
#
# Knobs: BENCH_OUT (default out/bench), RANKS (default 2; the exchange takes
# exactly 2), BENCH_GO=0 skips the Go benchmarks, BLOCKS (default "250 500
# 1000 2000 4000").
set -euo pipefail
cd "$(dirname "$0")/.."
out=${BENCH_OUT:-out/bench}
ranks=${RANKS:-2}
blocks=${BLOCKS:-"250 500 1000 2000 4000"}
mkdir -p "$out" bin

mpirun_flags=(--oversubscribe)
[ "$(id -u)" = 0 ] && mpirun_flags+=(--allow-run-as-root)
go build -tags mpi -o bin/ranktest-mpi ./cmd/ranktest
go build -tags mpi -o bin/distbench-mpi ./cmd/distbench
mpi() { mpirun "${mpirun_flags[@]}" -n "$ranks" "$@"; }

if [ "${BENCH_GO:-1}" != 0 ]; then
  short=-short
  [ "${BENCH_FULL:-0}" = 1 ] && short=
  echo "bench: go test -bench ./... $short" >&2
  # shellcheck disable=SC2086
  go test -run '^$' -bench . -benchmem $short ./... | tee "$out/go-bench.txt"
fi

: >"$out/solve.jsonl"
for mode in packed perblock; do
  for b in $blocks; do
    echo "bench: solve -mode $mode -blocks $b" >&2
    mpi bin/ranktest-mpi -backend "${BACKEND:-auto}" -mode "$mode" -blocks "$b" -iters 10 -json | tail -n 1 >>"$out/solve.jsonl"
  done
done

: >"$out/exchange.jsonl"
for b in $blocks; do
  echo "bench: exchange -blocks $b" >&2
  mpi bin/distbench-mpi exchange -backend "${BACKEND:-auto}" -blocks "$b" -block-bytes 256 >>"$out/exchange.jsonl"
done

# The plotter is a module of its own (tools/), so that the library's
# go.mod needs only what the library uses.
go -C tools build -o "$PWD/bin/benchplot" ./benchplot
bin/benchplot -title "solve, $ranks ranks, this machine" -o "$out/solve-host.png" "$out/solve.jsonl"
bin/benchplot -bench exchange -title "exchange of 256 B blocks, $ranks ranks, this machine" -o "$out/exchange-host.png" "$out/exchange.jsonl"
echo "bench: results and plots in $out" >&2
