#!/usr/bin/env bash
# Two builds of the main job against each other on one GPU machine, in
# turns: each round runs every case with the first build, then with the
# second, and the next round the other way round, so that both see the
# same machine (in a fixed order, the build run second read 12-27%
# slower on one machine, where alternating showed no difference between
# the builds). The table gives each case's
# median solve (slowest rank) per build, as the median of its rounds, with
# the range, and the phases' medians.
#
#   scripts/solve-turns.sh OLDBIN NEWBIN OUTDIR [ROUNDS]
#
# OLDBIN and NEWBIN hold ranktest and ranktest-mpi, as scripts/gpu-verify.sh
# build makes them (and build-base COMMIT, for an older commit, in
# gpubin/base/). ROUNDS is 3 unless given. The cases: one rank on a
# repeated and on a fresh layout, two ranks, and two and eight ranks under
# MPS when nvidia-cuda-mps-control is there; CASES (names separated by spaces)
# runs only those. OUTDIR receives every run's
# output and turns.txt, the table. Needs mpirun and python3.
set -uo pipefail
old=${1:?usage: solve-turns.sh OLDBIN NEWBIN OUTDIR [ROUNDS]}
new=${2:?usage: solve-turns.sh OLDBIN NEWBIN OUTDIR [ROUNDS]}
out=${3:?usage: solve-turns.sh OLDBIN NEWBIN OUTDIR [ROUNDS]}
rounds=${4:-3}
mkdir -p "$out"
# shellcheck source=scripts/mpirun-args.sh
. "$(dirname "$0")/mpirun-args.sh"
mps=0
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-$(mktemp -d)} CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-$(mktemp -d)}
fi
failed=0
order() { # order ROUND: the builds' order in that round
  if [ $(($1 % 2)) -eq 1 ]; then echo old new; else echo new old; fi
}
case_cmd() { # case_cmd CASE BINDIR: the command line of one case
  local b=$2
  case $1 in
    cuda-1) echo "$b/ranktest -backend cuda -iters 1500 -json" ;;
    cuda-1-fresh) echo "$b/ranktest -backend cuda -iters 1000 -fresh -json" ;;
    cuda-2) echo "${mpirun[*]} -n 2 $b/ranktest-mpi -backend cuda -iters 300 -json" ;;
    cuda-2-mps) echo "${mpirun[*]} -x CUDA_MPS_PIPE_DIRECTORY -n 2 $b/ranktest-mpi -backend cuda -iters 300 -json" ;;
    cuda-8-mps) echo "${mpirun[*]} -x CUDA_MPS_PIPE_DIRECTORY -n 8 $b/ranktest-mpi -backend cuda -iters 200 -json" ;;
  esac
}
rounds_of() { # rounds_of CASE...: every round of the cases, the builds in turns
  local r c which dir f
  for r in $(seq 1 "$rounds"); do
    for c in "$@"; do
      for which in $(order "$r"); do
        dir=$old
        [ "$which" = new ] && dir=$new
        f="$out/$c.$which.$r.txt"
        echo "solve-turns: round $r: $c: $which" >&2
        # shellcheck disable=SC2046
        timeout 300 $(case_cmd "$c" "$dir") >"$f" 2>&1 || { echo "solve-turns: $f failed" >&2; failed=1; }
      done
    done
  done
}
wanted() { # wanted CASE...: those CASES names (all when CASES is unset)
  local c
  for c in "$@"; do
    if [ -z "${CASES:-}" ] || [[ " $CASES " == *" $c "* ]]; then echo "$c"; fi
  done
}
# shellcheck disable=SC2046
rounds_of $(wanted cuda-1 cuda-1-fresh cuda-2)
under_mps=$(wanted cuda-2-mps cuda-8-mps)
if [ -n "$under_mps" ] && command -v nvidia-cuda-mps-control >/dev/null 2>&1 && nvidia-cuda-mps-control -d; then
  mps=1
  sleep 1
  # shellcheck disable=SC2086
  rounds_of $under_mps
  echo quit | nvidia-cuda-mps-control
fi

python3 - "$out" "$rounds" "$mps" $(wanted cuda-1 cuda-1-fresh cuda-2 cuda-2-mps cuda-8-mps) <<'EOF' | tee "$out/turns.txt"
import json, os, statistics, sys
out, rounds, mps = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
cases = [c for c in sys.argv[4:] if mps or not c.endswith("-mps")]
phases = ["alloc", "upload", "gemm_plan", "gemm", "exchange", "free"]

def summary(path):
    try:
        with open(path) as f:
            lines = [l for l in f if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except OSError:
        return None

print("| case | build | median solve (us), median of rounds | range | " + " | ".join(phases) + " |")
print("| --- | --- | --- | --- | " + " | ".join("---" for _ in phases) + " |")
for c in cases:
    for which in ("old", "new"):
        runs = [summary(os.path.join(out, f"{c}.{which}.{r}.txt")) for r in range(1, rounds + 1)]
        runs = [s for s in runs if s]
        if not runs:
            print(f"| {c} | {which} | no result | | " + " | ".join("" for _ in phases) + " |")
            continue
        part = lambda s: s.get("fresh_solves") if c.endswith("fresh") else (s.get("repeated") or s)
        solves = [part(s).get("median_solve_us", s["median_solve_us"]) for s in runs]
        ph = [statistics.median(part(s)["phase_us"][p] for s in runs) for p in phases]
        print(f"| {c} | {which} | {statistics.median(solves):.1f} | {min(solves):.1f}-{max(solves):.1f} | "
              + " | ".join(f"{v:.1f}" for v in ph) + " |")
EOF
exit "$failed"
