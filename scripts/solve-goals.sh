#!/usr/bin/env bash
# The main job's figures against their goals, from one command on a GPU
# machine (no Go needed): every run the table needs, in one session, then
# the table. The ratios compare runs made here, one after the other.
#
#   scripts/solve-goals.sh BINDIR OUTDIR
#
# BINDIR holds ranktest and ranktest-mpi (scripts/gpu-verify.sh build puts
# them in gpubin/). OUTDIR receives each run's output (*.txt, the -json
# summary last), spectrum.jsonl and goals.txt, the table. Runs with 8 ranks
# on one GPU are made twice: as they are, and under MPS when
# nvidia-cuda-mps-control is there (started here, stopped at the end).
# Needs mpirun and python3. The exit status is 0 when every run worked,
# whether or not the goals are met: goals.txt says which are.
set -uo pipefail
bin=${1:?usage: solve-goals.sh BINDIR OUTDIR}
out=${2:?usage: solve-goals.sh BINDIR OUTDIR}
mkdir -p "$out"
# shellcheck source=scripts/mpirun-args.sh
. "$(dirname "$0")/mpirun-args.sh"
failed=0
runit() { # runit NAME CMD...: one run, its output in OUTDIR/NAME.txt
  local name=$1
  shift
  echo "solve-goals: $name: $*" >&2
  if ! timeout 300 "$@" >"$out/$name.txt" 2>&1; then
    echo "solve-goals: $name failed (see $out/$name.txt)" >&2
    failed=1
  fi
}
runit cuda-1 "$bin/ranktest" -backend cuda -iters 1500 -json
runit cuda-1-fresh "$bin/ranktest" -backend cuda -iters 300 -fresh -json
runit host-1 "$bin/ranktest" -backend host -iters 1500 -json
runit cuda-2 "${mpirun[@]}" -n 2 "$bin/ranktest-mpi" -backend cuda -iters 300 -json
runit cuda-2-perblock "${mpirun[@]}" -n 2 "$bin/ranktest-mpi" -backend cuda -mode perblock -iters 5 -json
runit cuda-2-20000 "${mpirun[@]}" -n 2 "$bin/ranktest-mpi" -backend cuda -blocks 20000 -iters 200 -json
runit cuda-8 "${mpirun[@]}" -n 8 "$bin/ranktest-mpi" -backend cuda -iters 200 -json
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-$(mktemp -d)} CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-$(mktemp -d)}
  if nvidia-cuda-mps-control -d; then
    sleep 1
    runit cuda-2-mps "${mpirun[@]}" -x CUDA_MPS_PIPE_DIRECTORY -n 2 "$bin/ranktest-mpi" -backend cuda -iters 300 -json
    runit cuda-8-mps "${mpirun[@]}" -x CUDA_MPS_PIPE_DIRECTORY -n 8 "$bin/ranktest-mpi" -backend cuda -iters 200 -json
    echo quit | nvidia-cuda-mps-control
  fi
fi
runit spectrum "$bin/ranktest" -backend cuda -bench gemm -mode spectrum -iters 50
cp "$out/spectrum.txt" "$out/spectrum.jsonl"

python3 - "$out" <<'EOF' | tee "$out/goals.txt"
import json, os, sys
out = sys.argv[1]

def summary(name):
    try:
        with open(os.path.join(out, name + ".txt")) as f:
            lines = [l for l in f if l.startswith("{")]
        return json.loads(lines[-1])
    except (OSError, IndexError, ValueError):
        return None

def med(s, kind="repeated"):
    if s is None:
        return None
    part = s.get(kind) if kind else s
    return part.get("median_solve_us") if part else None

rows = []
def row(what, value, goal, met, unit):
    rows.append((what, "-" if value is None else f"{value:.1f} {unit}", goal, "-" if value is None else ("met" if met(value) else "MISSED")))

r1, r1f, host = summary("cuda-1"), summary("cuda-1-fresh"), summary("host-1")
r2, pb, big, r8 = summary("cuda-2"), summary("cuda-2-perblock"), summary("cuda-2-20000"), summary("cuda-8")
r2m, r8m = summary("cuda-2-mps"), summary("cuda-8-mps")
v = med(r1); row("1 rank, 2000 blocks, repeated layout: median solve", v, "<= 150 us", lambda x: x <= 150, "us")
v = med(r1f, "fresh_solves"); row("1 rank, 2000 blocks, fresh layout every solve", v, "<= 400 us", lambda x: x <= 400, "us")
v = med(big); row("2 ranks, 20000 blocks per rank: median solve", v, "<= 2000 us", lambda x: x <= 2000, "us")
h, c = med(host), med(r1)
row("host backend / CUDA, 1 rank, 2000 blocks", h / c if h and c else None, ">= 5x", lambda x: x >= 5, "x")
p, q = med(pb, None), med(r2)
row("perblock / packed, 2 ranks, 2000 blocks", p / q if p and q else None, ">= 1000x", lambda x: x >= 1000, "x")
a, b = med(r8), med(r2)
row("8 ranks / 2 ranks on one GPU", a / b if a and b else None, "<= 2x", lambda x: x <= 2, "x")
a, b = med(r8m), med(r2m)
row("8 ranks / 2 ranks on one GPU, under MPS", a / b if a and b else None, "<= 2x", lambda x: x <= 2, "x")
tiny = None
try:
    with open(os.path.join(out, "spectrum.jsonl")) as f:
        for l in f:
            d = json.loads(l)
            if d.get("extra", {}).get("case") == "tiny":
                tiny = d["extra"]["ratio_grouped_vs_kernel"]
except (OSError, ValueError, KeyError):
    pass
row("small-block kernel vs cuBLAS grouped, the solve's tiny blocks", tiny, ">= 3x", lambda x: x >= 3, "x")

w = max(len(r[0]) for r in rows)
print(f"{'figure'.ljust(w)}  {'value':>12}  {'goal':>10}  verdict")
for what, value, goal, verdict in rows:
    print(f"{what.ljust(w)}  {value:>12}  {goal:>10}  {verdict}")
for name, s in [("cuda-1", r1), ("cuda-1-fresh", r1f), ("cuda-2", r2), ("cuda-2-20000", big), ("cuda-8", r8), ("cuda-8-mps", r8m)]:
    if s:
        part = s.get("repeated") or s.get("fresh_solves") or s
        print(f"{name}: phases (us) {json.dumps(part.get('phase_us'))}, device {part.get('device_us')} us")
EOF
exit $failed
