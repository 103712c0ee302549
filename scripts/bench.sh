#!/usr/bin/env bash
# make bench: every benchmark of this machine, written as JSON lines and
# drawn as PNG plots (packed against per-block over block counts).
#
#   out/bench/go-bench.txt     go test -bench of every package
#   out/bench/solve.jsonl      ranktest -json summaries, -mode packed and perblock
#   out/bench/exchange.jsonl   ranktest -bench exchange, packed/perblock/raw
#   out/bench/alloc.jsonl, gemm.jsonl, pack.jsonl   the other ranktest benchmarks
#   docs/img/solve-host.png, docs/img/exchange-host.png
#
# Knobs: BENCH_OUT (default out/bench), RANKS (default 2), BENCH_GO=0 skips
# the Go benchmarks, BLOCKS (default "250 500 1000 2000 4000").
set -euo pipefail
cd "$(dirname "$0")/.."
out=${BENCH_OUT:-out/bench}
ranks=${RANKS:-2}
blocks=${BLOCKS:-"250 500 1000 2000 4000"}
mkdir -p "$out" docs/img bin

mpirun_flags=(--oversubscribe)
[ "$(id -u)" = 0 ] && mpirun_flags+=(--allow-run-as-root)
go build -tags mpi -o bin/ranktest-mpi ./cmd/ranktest
rt() { mpirun "${mpirun_flags[@]}" -n "$ranks" bin/ranktest-mpi -backend "${BACKEND:-auto}" "$@"; }

if [ "${BENCH_GO:-1}" != 0 ]; then
  echo "bench: go test -bench ./..." >&2
  go test -run '^$' -bench . -benchmem ./... | tee "$out/go-bench.txt"
fi

: >"$out/solve.jsonl"
for mode in packed perblock; do
  for b in $blocks; do
    echo "bench: solve -mode $mode -blocks $b" >&2
    rt -mode "$mode" -blocks "$b" -iters 10 -json | tail -n 1 >>"$out/solve.jsonl"
  done
done

: >"$out/exchange.jsonl"
for b in $blocks; do
  echo "bench: exchange -blocks $b" >&2
  rt -bench exchange -blocks "$b" -block-bytes 256 >>"$out/exchange.jsonl"
done

for name in alloc gemm pack; do
  echo "bench: $name" >&2
  bin/ranktest-mpi -backend "${BACKEND:-auto}" -bench "$name" >"$out/$name.jsonl"
done

# The plotter is a module of its own (tools/), so that the library's
# go.mod needs only what the library uses.
go -C tools build -o "$PWD/bin/benchplot" ./benchplot
bin/benchplot -title "solve, $ranks ranks, this machine" -o docs/img/solve-host.png "$out/solve.jsonl"
bin/benchplot -bench exchange -title "exchange of 256 B blocks, $ranks ranks, this machine" -o docs/img/exchange-host.png "$out/exchange.jsonl"
echo "bench: results in $out, plots in docs/img" >&2
