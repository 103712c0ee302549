#!/usr/bin/env bash
# GPU allocator benchmarks (make gpu-bench).
#
#   scripts/gpu-bench.sh          here: builds gpubin/ (scripts/gpu-test.sh
#                                 build) and prints the device command
#   scripts/gpu-bench.sh run [DIR] on the GPU machine: ranktest -bench alloc
#                                 and devalloc's CUDA Go benchmarks, writing
#                                 DIR/bench-alloc.jsonl and DIR/gobench.log
#                                 (DIR defaults to $OUT, else gpulogs)
#
# The figures and the commands go into docs/PERFORMANCE.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = run ]; then
  shift
  exec scripts/gpu-test.sh run "${1:-${OUT:-gpulogs}}" bench gobench
fi
scripts/gpu-test.sh build >/dev/null
cat <<'MSG'
Built gpubin/. On the GPU machine, from the repository root (carry gpubin/):

  scripts/gpu-bench.sh run "$OUT"

(device tool: command 'scripts/gpu-bench.sh run "$OUT"', carry ["gpubin"], timeout_s 600)
Results: $OUT/bench-alloc.jsonl (one JSON line per result; the "retained"
lines carry vs_threshold0 and vs_cudamalloc) and $OUT/gobench.log.
MSG
