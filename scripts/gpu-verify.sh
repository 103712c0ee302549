#!/usr/bin/env bash
# The whole GPU verification, in two halves.
#
#   scripts/gpu-verify.sh build
#       Here (Go, no GPU): builds every GPU test binary (the single-rank
#       benchmarks are in those of devalloc, packing and gemm), ranktest (with
#       and without MPI) and distbench-mpi into gpubin/ (stripped, to fit the
#       transfer).
#
#   scripts/gpu-verify.sh build-base COMMIT
#       Here: ranktest and ranktest-mpi of an older commit, built in a
#       temporary worktree, into gpubin/base/, for the turns step.
#
#   scripts/gpu-verify.sh run OUTDIR [STEP...]
#       On the GPU machine (repository root, no Go, gpubin/ carried along):
#       runs each step under its own timeout and writes to OUTDIR:
#       summary.txt, machine.txt, the benchmarks' output (*.jsonl, bench-*.txt),
#       the summaries (goals.txt, exchange-summary.log, turns.txt) and logs.tgz
#       with every step's log.
#       Steps (default: all but turns and sweep):
#         abi        scripts/check-cuda-abi.sh: every hand declaration vs the headers
#         cudart     internal/cudart tests, real libcudart: kernels, copies, timing, IPC between two processes
#         devalloc   devalloc tests, DISTBUF_REQUIRE_GPU=1 (conformance on the pool and the fallback)
#         loaders    internal/nvrtc, internal/cublas tests
#         packing    packing tests on the GPU
#         gemm       gemm tests on the GPU
#         memcheck   the GPU tests of devalloc, packing and gemm under compute-sanitizer memcheck
#         racecheck  the same under racecheck
#         alloc      devalloc's BenchmarkAlloc on the GPU: every mode, devalloc in turns with the
#                    same cycles and pairs in C (vs-c), driver calls per pair and cycle (pairs
#                    1000x, cycles 200x); then retained and large-only with
#                    DISTBUF_CUDA_SETDEVICE=always; a summary against the goals
#         bench      gemm's GPU benchmarks and packing's BenchmarkGather on the GPU
#         mpi        cluster MPI tests under mpirun -n 2, msg's under -n 3, on the GPU
#         msgcheck   msg's fault matrix and node-local windows under memcheck (-n 3)
#         examples   msg's runnable examples, unchanged, and TestLibraryHeldBuffers (a phase that frees
#                    what it allocated reads LiveBuffers == 0) on the CUDA backend under mpirun -n 1, 3
#                    and 5, then Example_contraction under memcheck (-n 2)
#         exchange   distbench exchange under mpirun -n 2 on the GPU; then the host
#                    packed / raw goal as docs/PERFORMANCE.md measures it (2000
#                    exchanges of packed, persistent, packed-mpi and raw in turns), three times,
#                    and the three runs' median (exchange-summary.log)
#         solve      ranktest (the main job) under mpirun -n 2 on the GPU
#         goals      scripts/solve-goals.sh, 5 rounds: the main job's figures against their
#                    goals (1, 2 and 8 ranks, host, perblock, MPS, the GEMM kernel)
#         sweep      the solve, packed and perblock, over 250 to 4000 blocks per rank (for the plot)
#         turns      scripts/solve-turns.sh: gpubin/base/ against gpubin/ in turns (not in the default)
#         staged     the device exchange on the staged route (256 MiB each way, 2 ranks) at chunk
#                    sizes from 256 KiB to 16 MiB, against MPI's pinned rate in each run
#                    (staged-chunks.jsonl; not in the default)
#         mpibench   MPI ping-pong from Go against the same loop in C, 64 KiB to 4 MiB
#         soak       a short ranktest soak under compute-sanitizer
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=gpubin

build() {
  set -e
  rm -rf "$BIN"
  mkdir -p "$BIN"
  local ld=(-ldflags "-s -w")
  for p in devalloc internal/cudart internal/nvrtc internal/cublas internal/nccl packing gemm; do
    go test -c "${ld[@]}" -o "$BIN/$(echo "$p" | tr / -).test" "./$p"
  done
  for p in cluster msg; do
    go test -c -tags mpi "${ld[@]}" -o "$BIN/$p-mpi.test" "./$p"
  done
  go test -c -tags mpi "${ld[@]}" -o "$BIN/mpibench.test" ./cluster/internal/mpibench
  go build "${ld[@]}" -o "$BIN/ranktest" ./cmd/ranktest
  go build -tags mpi "${ld[@]}" -o "$BIN/ranktest-mpi" ./cmd/ranktest
  go build -tags mpi "${ld[@]}" -o "$BIN/distbench-mpi" ./cmd/distbench
  du -sh "$BIN"
}

step() { # step NAME SECONDS CMD...: CMD may call the functions below
  local name=$1 secs=$2
  shift 2
  local start=$SECONDS rc
  echo "== $name (limit ${secs}s): $*" | tee -a "$LOG/summary.txt"
  timeout -k 10 "$secs" bash -c "$*" >"$LOG/$name.log" 2>&1
  rc=$?
  local verdict=ok
  if [ $rc -ne 0 ]; then
    verdict="FAILED (rc $rc$([ $rc -eq 124 ] && echo ', timed out'))"
    failed+=("$name")
  fi
  echo "$name: $verdict in $((SECONDS - start))s" | tee -a "$LOG/summary.txt"
}

# allocsummary FILE...: BenchmarkAlloc's figures that have goals, one
# line per sub-benchmark, with the goals' verdicts (go test -v output).
allocsummary() {
  command -v python3 >/dev/null || { echo "allocsummary: no python3; see the benchmark output"; return 0; }
  python3 - "$@" <<'PY'
import re, sys
keys = ("vs-c", "nosync-vs-c", "vs-large-only", "twin-vs-large-only", "vs-cudamalloc", "vs-threshold0", "large-only-vs-c",
        "driver-calls-per-cycle", "c-driver-calls-per-cycle", "driver-calls-per-alloc", "driver-calls-per-free",
        "c-driver-calls-per-pair", "c-in-turns-us")
for path in sys.argv[1:]:
    print("==", path)
    # go test prints a benchmark's logs before its result line, and again
    # for each b.N it tries: the verdicts seen since the last result line
    # (the last of each) belong to the next one.
    rows, pending = [], {}  # rows: name, figures, goals
    for line in open(path):
        f = line.split()
        if line.startswith("BenchmarkAlloc/") and len(f) > 3:
            name = re.sub(r"^BenchmarkAlloc/(backend=cuda/)?|-\d+$", "", f[0])
            rows.append((name, {f[i + 1]: f[i] for i in range(2, len(f) - 1, 2)}, pending))
            pending = {}
        elif "goal " in line:
            what, _, verdict = line.split("goal ", 1)[1].strip().rpartition(": ")
            pending[what] = verdict
    for name, figures, goals in rows:
        shown = " ".join(f"{k}={figures[k]}" for k in keys if k in figures)
        median = float(figures.get("ns/op", "nan")) / 1e3
        verdicts = ", ".join(f"{g} {v}" for g, v in goals.items())
        print(f"{name:52} {median:>12.3f} us  {shown}" + (f"  [goals: {verdicts}]" if verdicts else ""))
PY
}

# exchsummary FILE...: the host packed / raw goal over the runs, one line
# each, then their median, which the verdict is on (one run moves by a
# tenth from the next on the lent machines).
exchsummary() {
  command -v python3 >/dev/null || { echo "exchsummary: no python3; see the JSON lines"; return 0; }
  python3 - "$@" <<'PY'
import json, statistics, sys
ratios = []
for path in sys.argv[1:]:
    med, reads = {}, {}
    for line in open(path):
        r = json.loads(line)
        if r.get("bench") == "exchange" and r.get("backend") == "host":
            med[r["mode"]] = r["median_us"]
            reads[r["mode"]] = r.get("extra", {}).get("route")
    if "packed" in med and "raw" in med:
        ratios.append(med["packed"] / med["raw"])
        line = f"{path}: packed {med['packed']:.1f} us (route: {reads['packed']}), raw {med['raw']:.1f} us, packed / raw {ratios[-1]:.3f}"
        if "packed-mpi" in med:
            line += f"; packed-mpi {med['packed-mpi']:.1f} us, packed-mpi / raw {med['packed-mpi'] / med['raw']:.3f}"
        print(line)
if ratios:
    m = statistics.median(ratios)
    print(f"packed / raw over {len(ratios)} run(s): median {m:.3f} (goal <= 1.15: {'met' if m <= 1.15 else 'MISSED'})")
PY
}

gotest() { # gotest PKGDIR BINARY ARGS...: a test binary runs in its package directory
  local dir=$1 bin=$2
  shift 2
  (cd "$dir" && "$OLDPWD/$BIN/$bin" -test.count=1 -test.v "$@")
}

sanitize() { # sanitize TOOL
  local tool=$1 cs=/usr/local/cuda/bin/compute-sanitizer
  local common=(--tool "$tool" --error-exitcode 1 --report-api-errors no)
  [ "$tool" = memcheck ] && common+=(--leak-check no)
  (cd devalloc && $cs "${common[@]}" "$OLDPWD/$BIN/devalloc.test" -test.count=1 -test.v -test.run '^TestCUDA(Conformance|ConformanceFallback|HostWaitCallback|BackendDetails|Reuse)$' -test.timeout 150s) || return 1
  # gemm's small-block kernel stages tiles in shared memory: racecheck too
  if [ "$tool" = racecheck ]; then
    (cd gemm && $cs "${common[@]}" "$OLDPWD/$BIN/gemm.test" -test.count=1 -test.run 'ContractionsSizes/cuda' -test.timeout 200s)
    return
  fi
  (cd packing && $cs "${common[@]}" "$OLDPWD/$BIN/packing.test" -test.count=1 -test.run 'CUDA|Device|Kernel|OnHostGPU' -test.timeout 120s) &&
    (cd gemm && $cs "${common[@]}" "$OLDPWD/$BIN/gemm.test" -test.count=1 -test.run 'Contractions|SharedBuffer|RunOn|TwoStreams' -test.timeout 200s)
}


run() {
  local out=${1:?usage: gpu-verify.sh run OUTDIR [STEP...]}
  shift
  LOG=$(mktemp -d)
  export BIN LOG
  export -f gotest sanitize allocsummary exchsummary
  local steps=("$@")
  [ ${#steps[@]} -eq 0 ] && steps=(abi cudart devalloc loaders packing gemm memcheck racecheck alloc bench mpi msgcheck examples exchange solve goals mpibench soak)
  mkdir -p "$LOG"
  : >"$LOG/summary.txt"
  failed=()
  export DISTBUF_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; mpirun --version | head -1; } >"$LOG/machine.txt" 2>&1
  for s in "${steps[@]}"; do
    case $s in
      abi) step abi 60 "grep -n -A3 'cudaMemcpyBatchAsync(' /usr/local/cuda/include/cuda_runtime_api.h | head -20; scripts/check-cuda-abi.sh" ;;
      cudart) step cudart 90 gotest internal/cudart internal-cudart.test -test.timeout 80s ;;
      devalloc) step devalloc 150 gotest devalloc devalloc.test -test.timeout 140s ;;
      loaders) step loaders 90 "gotest internal/nvrtc internal-nvrtc.test && gotest internal/cublas internal-cublas.test" ;;
      packing) step packing 150 gotest packing packing.test -test.timeout 140s ;;
      gemm) step gemm 150 gotest gemm gemm.test -test.timeout 140s ;;
      memcheck) step memcheck 240 sanitize memcheck ;;
      racecheck) step racecheck 240 sanitize racecheck ;;
      alloc)
        # The pairs and then the cycles, each in one process: a ratio's
        # baseline (cudamalloc, threshold0) is measured earlier in the same one.
        step bench-alloc 400 "{ gotest devalloc devalloc.test -test.run '^\$' -test.bench 'Alloc/backend=cuda/pair/' -test.benchtime 1000x -test.timeout 380s &&
          gotest devalloc devalloc.test -test.run '^\$' -test.bench 'Alloc/backend=cuda/(cycle|large-only|packed)/' -test.benchtime 200x -test.timeout 380s; } > $LOG/bench-alloc.txt"
        step bench-alloc-setdevice 200 "DISTBUF_CUDA_SETDEVICE=always gotest devalloc devalloc.test -test.run '^\$' -test.bench 'Alloc/backend=cuda/(cycle|large-only)/(mode|allocator)=retained\$/' -test.benchtime 200x -test.timeout 190s > $LOG/bench-alloc-setdevice-always.txt"
        step alloc-summary 30 "allocsummary $LOG/bench-alloc.txt $LOG/bench-alloc-setdevice-always.txt" ;;
      bench)
        step bench-gemm 200 "gotest gemm gemm.test -test.run '^\$' -test.bench 'BatchedVsLoop|GroupedVsPerShape|Spectrum|KernelCrossover' -test.benchtime 20x -test.timeout 190s > $LOG/bench-gemm.txt"
        step bench-pack 120 "gotest packing packing.test -test.run '^\$' -test.bench 'Gather/backend=cuda' -test.benchtime 20x -test.timeout 110s > $LOG/bench-pack.txt" ;;
      mpi)
        # A missing binary fails its step (the step runs and cannot start it).
        step mpi-cluster 120 "cd cluster && mpirun --allow-run-as-root --oversubscribe -n 2 ../$BIN/cluster-mpi.test -test.count=1 -test.v"
        # Three ranks: the fault matrix needs a faulty sender, a victim and a bystander.
        step mpi-msg 300 "cd msg && DISTBUF_BACKEND=cuda mpirun --allow-run-as-root --oversubscribe -x DISTBUF_BACKEND -x DISTBUF_REQUIRE_GPU -n 3 ../$BIN/msg-mpi.test -test.count=1 -test.v -test.timeout 280s" ;;
      msgcheck)
        # The staged and node-local paths of msg, fault matrix included, under memcheck on every rank.
        step msg-memcheck 400 "cd msg && DISTBUF_BACKEND=cuda mpirun --allow-run-as-root --oversubscribe -x DISTBUF_BACKEND -x DISTBUF_REQUIRE_GPU -n 3 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 1 --report-api-errors no --leak-check no ../$BIN/msg-mpi.test -test.count=1 -test.run 'TestFaultMatrix|TestNodeLocalWindows|TestSendBuffersOfAnotherAllocator|TestJoinedSendBuffers' -test.timeout 380s" ;;
      examples)
        step examples 240 "cd msg && for n in 1 3 5; do DISTBUF_BACKEND=cuda mpirun --allow-run-as-root --oversubscribe -x DISTBUF_BACKEND -x DISTBUF_REQUIRE_GPU -n \$n ../$BIN/msg-mpi.test -test.count=1 -test.run 'Example|TestLibraryHeldBuffers' -test.v || exit 1; done"
        step examples-memcheck 240 "cd msg && DISTBUF_BACKEND=cuda mpirun --allow-run-as-root --oversubscribe -x DISTBUF_BACKEND -x DISTBUF_REQUIRE_GPU -n 2 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 1 --report-api-errors no --leak-check no ../$BIN/msg-mpi.test -test.count=1 -test.run Example_contraction -test.v" ;;
      exchange)
        step bench-exchange 180 "mpirun --allow-run-as-root --oversubscribe -n 2 $BIN/distbench-mpi exchange -backend cuda > $LOG/bench-exchange.jsonl"
        step bench-exchange-host 120 "for r in 1 2 3; do mpirun --allow-run-as-root --oversubscribe -n 2 $BIN/distbench-mpi exchange -mode packed,persistent,packed-mpi,raw -iters 2000 > $LOG/exchange-host-\$r.jsonl || exit 1; done"
        step exchange-summary 30 "exchsummary $LOG/exchange-host-1.jsonl $LOG/exchange-host-2.jsonl $LOG/exchange-host-3.jsonl" ;;
      solve)
        step solve 180 "mpirun --allow-run-as-root --oversubscribe -n 2 $BIN/ranktest-mpi -backend cuda -iters 200 -json"
        step solve-perblock 180 "mpirun --allow-run-as-root --oversubscribe -n 2 $BIN/ranktest-mpi -backend cuda -mode perblock -iters 10 -json" ;;
      goals) step goals 900 "scripts/solve-goals.sh $BIN $LOG/goals 5 && cp $LOG/goals/goals.txt $LOG/goals.txt" ;;
      turns) step turns 1500 "scripts/solve-turns.sh $BIN/base $BIN $LOG/turns 3 && cp $LOG/turns/turns.txt $LOG/turns.txt" ;;
      sweep) step solve-sweep 300 "for mode in packed perblock; do for b in 250 500 1000 2000 4000; do mpirun --allow-run-as-root --oversubscribe -n 2 $BIN/ranktest-mpi -backend cuda -mode \$mode -blocks \$b -iters 5 -json | tail -n 1 >> $LOG/solve-sweep.jsonl || exit 1; done; done" ;;
      staged) step staged 400 "for c in 256KiB 512KiB 1MiB 2MiB 4MiB 8MiB 16MiB; do DISTBUF_MSG_TRANSPORT=staged DISTBUF_MSG_CHUNK=\$c mpirun --allow-run-as-root --oversubscribe -x DISTBUF_MSG_TRANSPORT -x DISTBUF_MSG_CHUNK -n 2 $BIN/distbench-mpi exchange -backend cuda -mode device -iters 20 | tail -n 1 >> $LOG/staged-chunks.jsonl || exit 1; done" ;;
      mpibench) step mpibench 240 "mpirun --allow-run-as-root --oversubscribe -n 2 $BIN/mpibench.test -test.run '^\$' -test.bench 'PingPong/bytes=(65536|262144|1048576|4194304)/' -test.benchtime 1000x -test.count 3" ;;
      soak) step soak 300 "mpirun --allow-run-as-root --oversubscribe -n 2 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 1 --report-api-errors no $BIN/ranktest-mpi -backend cuda -iters 20 -blocks 1000 -json" ;;
      *) echo "unknown step $s" | tee -a "$LOG/summary.txt"; failed+=("$s") ;;
    esac
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]}" | tee -a "$LOG/summary.txt"
  else
    echo "all steps passed" | tee -a "$LOG/summary.txt"
  fi
  mkdir -p "$out"
  (cd "$LOG" && tar czf "$out/logs.tgz" ./*)
  cp "$LOG/summary.txt" "$LOG/machine.txt" "$out/"
  [ -f "$LOG/goals.txt" ] && cp "$LOG/goals.txt" "$out/"
  [ -f "$LOG/exchange-summary.log" ] && cp "$LOG/exchange-summary.log" "$out/"
  [ -f "$LOG/turns.txt" ] && cp "$LOG/turns.txt" "$out/"
  cp "$LOG"/*.jsonl "$LOG"/bench-*.txt "$out/" 2>/dev/null
  [ ${#failed[@]} -eq 0 ]
}

# build_base COMMIT: ranktest of COMMIT into gpubin/base/ (after build).
build_base() {
  set -e
  local commit=${1:?usage: gpu-verify.sh build-base COMMIT}
  local wt ld=(-ldflags "-s -w")
  wt=$(mktemp -d)
  git worktree add -q --detach "$wt" "$commit"
  mkdir -p "$BIN/base"
  (cd "$wt" && go build "${ld[@]}" -o "$OLDPWD/$BIN/base/ranktest" ./cmd/ranktest &&
    go build -tags mpi "${ld[@]}" -o "$OLDPWD/$BIN/base/ranktest-mpi" ./cmd/ranktest)
  git worktree remove --force "$wt"
  git rev-parse "$commit" >"$BIN/base/COMMIT"
  du -sh "$BIN/base"
}

case ${1:-} in
  build) build ;;
  build-base) shift; build_base "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,41p' "$0"; exit 2 ;;
esac
