#!/usr/bin/env bash
# The main job's figures against their goals, from one command on a GPU
# machine (no Go needed): every run the table needs, in one session, then
# the table.
#
#   scripts/solve-goals.sh BINDIR OUTDIR [ROUNDS]
#
# BINDIR holds ranktest, ranktest-mpi and gemm.test (scripts/gpu-verify.sh
# build puts them in gpubin/). The timed runs are made in ROUNDS rounds (3 unless
# given), one after the other: on the lent machines one run's median solve
# moves by up to a third from the run before, with the same binary, so a
# figure is the median of its rounds, with their range beside it, and the
# verdict is the median's. A ratio is taken within each round, between runs
# made one after the other. The perblock run, 1000 times slower than the
# others, is made in the first round only. Runs with 8 ranks on one GPU are
# made as they are and under MPS when nvidia-cuda-mps-control is there
# (its rounds after the others, the daemon stopped at the end).
#
# OUTDIR receives each run's output (NAME.rROUND.txt, the -json summary
# last), spectrum.txt (gemm's BenchmarkSpectrum) and goals.txt, the
# table. Needs mpirun and python3.
# The exit status is 0 when every run worked, whether or not the goals are
# met: goals.txt says which are.
set -uo pipefail
bin=${1:?usage: solve-goals.sh BINDIR OUTDIR [ROUNDS]}
out=${2:?usage: solve-goals.sh BINDIR OUTDIR [ROUNDS]}
rounds=${3:-3}
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
for r in $(seq 1 "$rounds"); do
  runit "cuda-1.r$r" "$bin/ranktest" -backend cuda -iters 1500 -json
  runit "cuda-1-fresh.r$r" "$bin/ranktest" -backend cuda -iters 300 -fresh -json
  runit "host-1.r$r" "$bin/ranktest" -backend host -iters 1500 -json
  runit "cuda-2.r$r" "${mpirun[@]}" -n 2 "$bin/ranktest-mpi" -backend cuda -iters 300 -json
  if [ "$r" = 1 ]; then
    runit "cuda-2-perblock.r$r" "${mpirun[@]}" -n 2 "$bin/ranktest-mpi" -backend cuda -mode perblock -iters 5 -json
  fi
  runit "cuda-2-20000.r$r" "${mpirun[@]}" -n 2 "$bin/ranktest-mpi" -backend cuda -blocks 20000 -iters 200 -json
  runit "cuda-8.r$r" "${mpirun[@]}" -n 8 "$bin/ranktest-mpi" -backend cuda -iters 200 -json
done
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-$(mktemp -d)} CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-$(mktemp -d)}
  if nvidia-cuda-mps-control -d; then
    sleep 1
    for r in $(seq 1 "$rounds"); do
      runit "cuda-2-mps.r$r" "${mpirun[@]}" -x CUDA_MPS_PIPE_DIRECTORY -n 2 "$bin/ranktest-mpi" -backend cuda -iters 300 -json
      runit "cuda-8-mps.r$r" "${mpirun[@]}" -x CUDA_MPS_PIPE_DIRECTORY -n 8 "$bin/ranktest-mpi" -backend cuda -iters 200 -json
    done
    echo quit | nvidia-cuda-mps-control
  fi
fi
runit spectrum "$bin/gemm.test" -test.run '^$' -test.bench 'Spectrum' -test.benchtime 50x -test.v

python3 - "$out" "$rounds" <<'EOF' | tee "$out/goals.txt"
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])

def summary(name):
    try:
        with open(os.path.join(out, name + ".txt")) as f:
            lines = [l for l in f if l.startswith("{")]
        return json.loads(lines[-1])
    except (OSError, IndexError, ValueError):
        return None

def run(name, r):
    return summary(f"{name}.r{r}")

def med(s, kind="repeated"):
    if s is None:
        return None
    part = s.get(kind) if kind else s
    return part.get("median_solve_us") if part else None

def ratio(a, b):
    return a / b if a and b else None

def rounds_of(f):
    """f(r) for every round that has it."""
    return [v for v in (f(r) for r in range(1, rounds + 1)) if v is not None]

rows = []
def row(what, vals, goal, met, unit):
    if not vals:
        rows.append((what, "-", "", goal, "-"))
        return
    m = statistics.median(vals)
    spread = f"{min(vals):.1f}-{max(vals):.1f}" if len(vals) > 1 else ""
    rows.append((what, f"{m:.1f} {unit}", spread, goal, "met" if met(m) else "MISSED"))

row("1 rank, 2000 blocks, repeated layout: median solve", rounds_of(lambda r: med(run("cuda-1", r))),
    "<= 150 us", lambda x: x <= 150, "us")
row("1 rank, 2000 blocks, fresh layout every solve", rounds_of(lambda r: med(run("cuda-1-fresh", r), "fresh_solves")),
    "<= 400 us", lambda x: x <= 400, "us")
row("2 ranks, 20000 blocks per rank: median solve", rounds_of(lambda r: med(run("cuda-2-20000", r))),
    "<= 2000 us", lambda x: x <= 2000, "us")
row("host backend / CUDA, 1 rank, 2000 blocks", rounds_of(lambda r: ratio(med(run("host-1", r)), med(run("cuda-1", r)))),
    ">= 5x", lambda x: x >= 5, "x")
row("perblock / packed, 2 ranks, 2000 blocks", rounds_of(lambda r: ratio(med(run("cuda-2-perblock", r), None), med(run("cuda-2", r)))),
    ">= 1000x", lambda x: x >= 1000, "x")
row("8 ranks / 2 ranks on one GPU", rounds_of(lambda r: ratio(med(run("cuda-8", r)), med(run("cuda-2", r)))),
    "<= 2x", lambda x: x <= 2, "x")
row("8 ranks / 2 ranks on one GPU, under MPS", rounds_of(lambda r: ratio(med(run("cuda-8-mps", r)), med(run("cuda-2-mps", r)))),
    "<= 2x", lambda x: x <= 2, "x")
tiny = None
try:
    # BenchmarkSpectrum/case=tiny-N  50  V ns/op  ...  R vs-grouped ...
    with open(os.path.join(out, "spectrum.txt")) as f:
        for l in f:
            w = l.split()
            if w and w[0].startswith("BenchmarkSpectrum/case=tiny") and "vs-grouped" in w:
                tiny = float(w[w.index("vs-grouped") - 1])
except (OSError, ValueError):
    pass
row("small-block kernel vs cuBLAS grouped, the solve's tiny blocks", [] if tiny is None else [tiny],
    ">= 3x", lambda x: x >= 3, "x")

w = max(len(r[0]) for r in rows)
print(f"{rounds} round(s); value: the rounds' median; range: their least and greatest")
print(f"{'figure'.ljust(w)}  {'value':>12}  {'range':>15}  {'goal':>10}  verdict")
for what, value, spread, goal, verdict in rows:
    print(f"{what.ljust(w)}  {value:>12}  {spread:>15}  {goal:>10}  {verdict}")
for name in ["cuda-1", "cuda-1-fresh", "cuda-2", "cuda-2-mps", "cuda-2-20000", "cuda-8", "cuda-8-mps"]:
    for r in range(1, rounds + 1):
        s = run(name, r)
        if s:
            part = s.get("repeated") or s.get("fresh_solves") or s
            print(f"{name} round {r}: median {part.get('median_solve_us')} us, phases (us) {json.dumps(part.get('phase_us'))}, device {part.get('device_us')} us")
EOF
exit $failed
