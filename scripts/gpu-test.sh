#!/usr/bin/env bash
# GPU verification of the CUDA backend, in two halves:
#
#   scripts/gpu-test.sh build
#       Here (Go, no GPU): builds the test binaries and ranktest into gpubin/
#       and prints the command to run on the GPU machine.
#
#   scripts/gpu-test.sh run [LOGDIR] [STEP...]
#       On the GPU machine (repository root, no Go; gpubin/ carried along):
#       runs the steps, each under a timeout, writing LOGDIR/<step>.log and
#       LOGDIR/summary.txt (LOGDIR defaults to $OUT, else gpulogs). Steps,
#       all but gobench by default, about 9 minutes at most in all:
#         abi        scripts/check-cuda-abi.sh: declarations vs the headers
#         cudart     the loader's tests, real libcudart included
#         devalloc   devalloc's tests with DISTBUF_REQUIRE_GPU=1: conformance
#                    on the pool and on the cudaMalloc fallback, host waits,
#                    backend details (host and fake-runtime tests run too)
#         memcheck   the GPU tests under compute-sanitizer --tool memcheck
#         racecheck  the GPU tests under compute-sanitizer --tool racecheck
#         bench      ranktest -backend cuda -bench alloc (JSON lines)
#         gobench    devalloc's CUDA Go benchmarks
#       It exits non-zero if any step fails.
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=gpubin
GPU_TESTS='^TestCUDA(Conformance|ConformanceFallback|HostWaitCallback|BackendDetails)$'

build() {
  set -e
  mkdir -p "$BIN"
  go test -c -o "$BIN/devalloc.test" ./devalloc
  go test -c -o "$BIN/cudart.test" ./internal/cudart
  go build -o "$BIN/ranktest" ./cmd/ranktest
  ls -l "$BIN"
  cat <<MSG

Built $BIN/. On the GPU machine, from the repository root (carry $BIN/):

  scripts/gpu-test.sh run "\$OUT"

(device tool: command 'scripts/gpu-test.sh run "\$OUT"', carry ["$BIN"], timeout_s 600)
MSG
}

# step NAME SECONDS DIR CMD...: runs CMD in DIR under a timeout, logging.
step() {
  local name=$1 secs=$2 dir=$3
  shift 3
  local start=$SECONDS rc
  echo "== $name (limit ${secs}s): (cd $dir && $*)"
  (cd "$dir" && timeout -k 10 "$secs" "$@") >"$LOG/$name.log" 2>&1
  rc=$?
  local verdict=ok
  if [ $rc -ne 0 ]; then
    verdict="FAILED (rc $rc$([ $rc -eq 124 ] && echo ', timed out'))"
    failed+=("$name")
    tail -n 40 "$LOG/$name.log"
  fi
  echo "$name: $verdict in $((SECONDS - start))s" | tee -a "$LOG/summary.txt"
}

run() {
  LOG=${1:-${OUT:-gpulogs}}
  shift || true
  local steps=("$@")
  if [ ${#steps[@]} -eq 0 ]; then
    steps=(abi cudart devalloc memcheck racecheck bench)
  fi
  mkdir -p "$LOG"
  : >"$LOG/summary.txt"
  for b in devalloc.test cudart.test ranktest; do
    if [ ! -x "$BIN/$b" ]; then
      echo "gpu-test: $BIN/$b missing: run 'scripts/gpu-test.sh build' on a machine with Go first" >&2
      exit 1
    fi
  done
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
    command -v compute-sanitizer || echo "no compute-sanitizer on PATH"
  } >"$LOG/machine.txt"
  export DISTBUF_REQUIRE_GPU=1
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  failed=()
  for s in "${steps[@]}"; do
    case $s in
      abi) step abi 45 . scripts/check-cuda-abi.sh ;;
      cudart) step cudart 45 internal/cudart ../../$BIN/cudart.test -test.v -test.count=1 -test.timeout 40s ;;
      devalloc) step devalloc 110 devalloc ../$BIN/devalloc.test -test.v -test.count=1 -test.timeout 100s ;;
      # API errors are not reported: the suite provokes them on purpose
      # (a 512 TiB allocation, cudaEventQuery answering not-ready).
      memcheck) step memcheck 150 devalloc "$sanitizer" --tool memcheck --error-exitcode 1 --report-api-errors no \
        ../$BIN/devalloc.test -test.v -test.count=1 -test.run "$GPU_TESTS" -test.timeout 140s ;;
      racecheck) step racecheck 100 devalloc "$sanitizer" --tool racecheck --error-exitcode 1 --report-api-errors no \
        ../$BIN/devalloc.test -test.v -test.count=1 -test.run "$GPU_TESTS" -test.timeout 90s ;;
      bench) step bench 100 . sh -c "$BIN/ranktest -backend cuda -bench alloc > '$LOG/bench-alloc.jsonl'" ;;
      gobench) step gobench 90 devalloc ../$BIN/devalloc.test -test.run '^$' -test.bench CUDA -test.benchtime 300x ;;
      *) echo "gpu-test: unknown step $s" >&2; exit 2 ;;
    esac
  done
  if [ ${#failed[@]} -ne 0 ]; then
    echo "gpu-test: FAILED: ${failed[*]} (logs in $LOG)"
    exit 1
  fi
  echo "gpu-test: all steps passed (logs in $LOG)"
}

case ${1:-} in
  build) build ;;
  run) shift; run "$@" ;;
  *) echo "usage: scripts/gpu-test.sh build | run [LOGDIR] [abi|cudart|devalloc|memcheck|racecheck|bench|gobench ...]" >&2; exit 2 ;;
esac
