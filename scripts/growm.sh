#!/usr/bin/env bash
# The retention question on the GPU: how far m grows under each policy and
# what a solve costs, through distbuf and in plain CUDA C (shared/anchors'
# maxm.cu) on the same machine, in two halves.
#
#   scripts/growm.sh build [ANCHOR]
#       Here (Go, no GPU): ranktest with and without MPI and the devalloc
#       test binary into gpubin/, with the anchor program's source
#       (ANCHOR, default ../shared/anchors/maxm.cu).
#
#   scripts/growm.sh run OUTDIR [STEP...]
#       On the GPU machine (repository root, gpubin/ carried along): each
#       step under its own timeout, its output in OUTDIR/growm.tgz and a
#       summary in OUTDIR/summary.txt. Steps (default: all):
#         tests     devalloc's GPU tests (conformance on the pool and the
#                   fallback, auto, the probe), DISTBUF_REQUIRE_GPU=1
#         anchor    maxm.cu: nvcc -O2, ./maxm $FREE_GIB $FIXED_M
#         grow      ranktest -workload maxm, m from 1024 times 1.12 a step until
#                   the device is full, a ballast leaving $FREE_GIB free: under
#                   free, retain, auto and cudaMalloc (pool:off,cache:off)
#         fixed     the same working set at m = $FIXED_M, 11 solves, under
#                   retain, free and auto, in three turns
#         mps       the growing run with 2 and 4 ranks on the one GPU under MPS,
#                   sharing the $FREE_GIB, under free, retain and auto
#         prime     the first solves at m = $FIXED_M and the growing run's
#                   reach with a primed pool (auto), primed with 0 and 1/32, 1/16
#                   and 1/8 of the device's memory
#         threshold the same under free with release thresholds of 0, 1/32 and
#                   1/16 of the device's memory
#         timeline  the growing run under free, retain and auto with -timeline
#                   (no probe), for benchplot -timeline
#         sectors   the sector workload's growing run (-workload sectors, m from
#                   2048 times 1.25 a step, $SECTORS_FREE_GIB free) under free,
#                   retain and auto, with timelines
#         fresh     the default (synthetic) solve, 1 rank, every layout repeated and
#                   every one fresh, in three turns (not in the default)
#         sectorcheck the sectors solve at the default m (repeated and fresh), at
#                   m = 4096 under each policy, out of a 1 GiB budget, under
#                   memcheck, and 2 ranks under MPS (not in the default)
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=gpubin
FREE_GIB=${FREE_GIB:-24}
FIXED_M=${FIXED_M:-4096}
SECTORS_FREE_GIB=${SECTORS_FREE_GIB:-8}

build() {
  set -e
  local anchor=${1:-../shared/anchors/maxm.cu}
  mkdir -p "$BIN"
  local ld=(-ldflags "-s -w")
  go build "${ld[@]}" -o "$BIN/ranktest" ./cmd/ranktest
  go build -tags mpi "${ld[@]}" -o "$BIN/ranktest-mpi" ./cmd/ranktest
  go test -c "${ld[@]}" -o "$BIN/devalloc.test" ./devalloc
  cp "$anchor" "$BIN/maxm.cu"
  du -sh "$BIN"
}

step() { # step NAME SECONDS CMD...
  local name=$1 secs=$2
  shift 2
  local start=$SECONDS rc
  echo "== $name (limit ${secs}s): $*" >>"$LOG/summary.txt"
  timeout -k 10 "$secs" bash -c "$*" >"$LOG/$name.log" 2>&1
  rc=$?
  local verdict=ok
  [ $rc -ne 0 ] && verdict="FAILED (rc $rc$([ $rc -eq 124 ] && echo ', timed out'))"
  echo "$name: $verdict in $((SECONDS - start))s" | tee -a "$LOG/summary.txt"
}

# last JSON line of a log
lastjson() { grep '^{' "$1" | tail -n 1; }

run() {
  local out=${1:?usage: growm.sh run OUTDIR [STEP...]}
  shift
  LOG=$(mktemp -d)
  export LOG BIN FREE_GIB FIXED_M SECTORS_FREE_GIB
  export -f lastjson
  local steps=("$@")
  [ ${#steps[@]} -eq 0 ] && steps=(tests anchor grow fixed mps prime threshold timeline sectors)
  export DISTBUF_REQUIRE_GPU=1 LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } >"$LOG/machine.txt" 2>&1
  cat "$LOG/machine.txt" >"$LOG/summary.txt"
  local rt="$BIN/ranktest -backend cuda -workload maxm -json"
  local grow="-m 1024 -grow 1.12 -ballast-free ${FREE_GIB}GiB"
  local mpirun="mpirun --allow-run-as-root --oversubscribe"
  for s in "${steps[@]}"; do
    case $s in
      tests) step tests 200 "cd devalloc && ../$BIN/devalloc.test -test.count=1 -test.v -test.run 'Conformance|Auto|LargestAlloc|Reuse|HostMemory' -test.timeout 190s" ;;
      anchor) step anchor 240 "/usr/local/cuda/bin/nvcc -O2 -o $LOG/maxm $BIN/maxm.cu && $LOG/maxm $FREE_GIB $FIXED_M > $LOG/anchor.jsonl" ;;
      grow) step grow 400 "for p in free retain auto; do $rt $grow -policy \$p > $LOG/grow-\$p.txt || exit 1; done;
              DISTBUF_ALLOC_CONF=pool:off,cache:off $rt $grow > $LOG/grow-malloc.txt" ;;
      fixed) step fixed 240 "for turn in 1 2 3; do for p in retain free auto; do $rt -m $FIXED_M -iters 11 -ballast-free ${FREE_GIB}GiB -probe=false -policy \$p > $LOG/fixed-\$p-\$turn.txt || exit 1; done; done" ;;
      mps)
        step mps 400 "export CUDA_MPS_PIPE_DIRECTORY=\$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=\$(mktemp -d); nvidia-cuda-mps-control -d || exit 1;
          for n in 2 4; do for p in free retain auto; do $mpirun -x CUDA_MPS_PIPE_DIRECTORY -n \$n $BIN/ranktest-mpi -backend cuda -workload maxm -json $grow -probe=false -policy \$p > $LOG/mps\$n-\$p.txt; echo \"n=\$n \$p rc=\$?\"; done; done;
          echo quit | nvidia-cuda-mps-control" ;;
      prime) step prime 300 "total=\$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1);
          for d in 0 32 16 8; do pr=0; [ \$d -gt 0 ] && pr=\$((total / d))MiB;
            DISTBUF_ALLOC_CONF=prime:\$pr $rt -m $FIXED_M -iters 4 -ballast-free ${FREE_GIB}GiB -probe=false > $LOG/prime-fixed-\$d.txt || exit 1;
            DISTBUF_ALLOC_CONF=prime:\$pr $rt $grow -probe=false > $LOG/prime-grow-\$d.txt || exit 1; done" ;;
      threshold) step threshold 300 "total=\$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1);
          for d in 0 32 16; do th=0; [ \$d -gt 0 ] && th=\$((total / d))MiB;
            DISTBUF_ALLOC_CONF=threshold:\$th $rt -policy free -m $FIXED_M -iters 11 -ballast-free ${FREE_GIB}GiB -probe=false > $LOG/threshold-fixed-\$d.txt || exit 1;
            DISTBUF_ALLOC_CONF=threshold:\$th $rt -policy free $grow -probe=false > $LOG/threshold-grow-\$d.txt || exit 1; done" ;;
      timeline) step timeline 300 "for p in free retain auto; do $rt $grow -probe=false -policy \$p -timeline $LOG/maxm-\$p.timeline > $LOG/timeline-\$p.txt || exit 1; done" ;;
      sectors)
        if $BIN/ranktest -h 2>&1 | grep -q sectors; then
          step sectors 400 "for p in free retain auto; do $BIN/ranktest -backend cuda -workload sectors -json -m 2048 -grow 1.25 -ballast-free ${SECTORS_FREE_GIB}GiB -probe=false -policy \$p -timeline $LOG/sectors-\$p.timeline > $LOG/sectors-\$p.txt || exit 1; done"
        fi ;;
      sectorcheck) step sectorcheck 400 "rt=$BIN/ranktest; set -x;
          \$rt -backend cuda -workload sectors -iters 300 -json | tail -n 3 &&
          \$rt -backend cuda -workload sectors -iters 100 -fresh -json | tail -n 3 &&
          \$rt -backend cuda -workload sectors -m 4096 -iters 20 -json | tail -n 3 &&
          \$rt -backend cuda -workload sectors -m 4096 -iters 20 -policy retain -json | tail -n 1 &&
          \$rt -backend cuda -workload sectors -m 4096 -iters 20 -policy free -json | tail -n 1 &&
          { DISTBUF_ALLOC_CONF=limit:1GiB \$rt -backend cuda -workload sectors -m 16384 -iters 2; echo \"oom rc=\$?\"; } &&
          /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 1 --report-api-errors no \$rt -backend cuda -workload sectors -m 2048 -big-block 256KiB -iters 3 -bonds 1 | tail -n 3 &&
          export CUDA_MPS_PIPE_DIRECTORY=\$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=\$(mktemp -d) && nvidia-cuda-mps-control -d &&
          mpirun --allow-run-as-root --oversubscribe -x CUDA_MPS_PIPE_DIRECTORY -n 2 $BIN/ranktest-mpi -backend cuda -workload sectors -m 4096 -iters 20 -json | tail -n 3;
          echo quit | nvidia-cuda-mps-control" ;;
      fresh) step fresh 200 "for r in 1 2 3; do $BIN/ranktest -backend cuda -iters 300 -json > $LOG/solve-repeated-\$r.txt || exit 1; $BIN/ranktest -backend cuda -iters 300 -fresh -json > $LOG/solve-fresh-\$r.txt || exit 1; done" ;;
      *) echo "unknown step $s" | tee -a "$LOG/summary.txt" ;;
    esac
  done
  summarize >>"$LOG/summary.txt" 2>&1
  mkdir -p "$out"
  cp "$LOG/summary.txt" "$out/"
  tar -C "$LOG" -czf "$out/growm.tgz" .
}

# summarize: the largest m of each run and the fixed-m medians.
summarize() {
  command -v python3 >/dev/null || return 0
  python3 - "$LOG" <<'PY'
import glob, json, os, statistics, sys
log = sys.argv[1]
def last(path):
    try:
        lines = [l for l in open(path) if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except OSError:
        return None
print("== largest m (working set, GiB) by run")
for path in sorted(glob.glob(f"{log}/grow-*.txt") + glob.glob(f"{log}/mps*.txt") + glob.glob(f"{log}/prime-grow-*.txt") + glob.glob(f"{log}/threshold-grow-*.txt") + glob.glob(f"{log}/sectors-*.txt")):
    s = last(path)
    if not s:
        print(f"{os.path.basename(path)}: no summary"); continue
    ws = s["steps"][-1]["working_set_bytes"] / 2**30 if s.get("steps") else 0
    print(f"{os.path.basename(path):28} policy {s['policy']:6} ranks {s['ranks']} max_m {s['max_m']:6} ({ws:.2f} GiB) ended by {s['ended_by']}")
if os.path.exists(f"{log}/anchor.jsonl"):
    print("== maxm.cu")
    for l in open(f"{log}/anchor.jsonl"):
        print(l.strip())
print("== fixed m: median solve (us), solves 2-11, by turn")
fixed = {}
for path in sorted(glob.glob(f"{log}/fixed-*.txt")):
    s = last(path)
    if s:
        pol = os.path.basename(path).split("-")[1]
        fixed.setdefault(pol, []).append(statistics.median(s["steps"][0]["solve_us"][1:]))
for pol, v in fixed.items():
    print(f"{pol:6} {[round(x, 1) for x in v]} median {statistics.median(v):.1f}")
if {"auto", "retain", "free"} <= fixed.keys():
    a, r, f = (statistics.median(fixed[k]) for k in ("auto", "retain", "free"))
    print(f"auto / retain {a / r:.3f} (goal <= 1.05), auto / free {a / f:.3f} (goal <= 0.5)")
rep = {}
for kind in ("repeated", "fresh"):
    for path in sorted(glob.glob(f"{log}/solve-{kind}-*.txt")):
        s = last(path)
        if s:
            rep.setdefault(kind, []).append(s["median_solve_us"])
if rep:
    print("== default solve, 1 rank: median (us) by turn", rep)
    if len(rep.get("fresh", [])) == len(rep.get("repeated", [])) > 0:
        ratios = [f / r for f, r in zip(rep["fresh"], rep["repeated"])]
        print(f"fresh / repeated {[round(x, 2) for x in ratios]} median {statistics.median(ratios):.2f} (goal <= 2)")
print("== prime (1/N of the device) and threshold: solves (us) at the fixed m; first steps of the growing run")
for path in sorted(glob.glob(f"{log}/prime-fixed-*.txt") + glob.glob(f"{log}/threshold-fixed-*.txt")):
    s = last(path)
    if s:
        print(f"{os.path.basename(path):28} {[round(x, 1) for x in s['steps'][0]['solve_us']]}")
for path in sorted(glob.glob(f"{log}/prime-grow-*.txt") + glob.glob(f"{log}/threshold-grow-*.txt")):
    s = last(path)
    if s:
        first = [round(x["solve_us"][0], 1) for x in s["steps"][:6]]
        print(f"{os.path.basename(path):28} first solve of steps 1-6 {first}, all steps' first solves {round(sum(x['solve_us'][0] for x in s['steps']) / 1e3, 1)} ms")
PY
}

case ${1:-} in
  build) shift; build "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
