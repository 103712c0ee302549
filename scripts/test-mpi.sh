#!/usr/bin/env bash
# Runs the MPI tests (the *_test.go files built only with the mpi tag) under
# an MPI launcher, in four passes, each run under a timeout so a hung rank
# fails the run instead of hanging it. Installs nothing: `make mpitest` runs
# scripts/install-deps.sh --mpich first. Nothing is skipped for want of a
# tool: a pass whose launcher or MPI library is missing fails.
#
# Passes (MPI_PASSES, default "default funneled tcp mpich"):
#
#   default   Open MPI as the build finds it (pkg-config "mpi", mpirun):
#             every package with MPI tests, at each of its rank counts:
#             "1 2 4" (MPI_RANKS) or <package>/testdata/mpi-ranks. Among
#             them cluster's bounded collectives, whose tests stop a rank
#             (SIGSTOP, resumed by a watcher process) past the others'
#             deadline (about 10 s a run at 2 and 4 ranks, in every pass),
#             and internal/ranksettings' agreement with a late, a failed
#             and a hostile rank, and msg's stalled ranks (a rank stopped
#             inside an exchange past the others' timeout, and one stopped
#             for less, at 2 and 4 ranks: about 15 s a run, in every pass
#             that runs msg at 2 ranks).
#   funneled  the same binaries under DISTBUF_MPI_THREAD=funneled: every MPI
#             call runs on one locked thread and every wait polls
#             (cluster/funnel.go), code the default pass never reaches.
#             cluster at 1, 2 and 4 ranks (every call and wait of the
#             binding, a send to self included), msg at 2 and 3 (exchanges;
#             at 3 the fault matrix, whose timeouts and aborts end waits
#             early), internal/rawmpi and cluster/internal/mpibench at 2.
#   tcp       the same binaries over TCP alone: --mca pml ob1 --mca btl
#             self,tcp, so no shared memory and no single-copy (CMA), the
#             path between nodes. The pml is named because the btl list
#             binds only ob1 (the cm pml would take its own transports);
#             with it, a message between two ranks has no way but TCP.
#             cluster at 2 and 4 (one rank would talk only to itself),
#             msg at 2 and 3 (the fault matrix: TCP's eager limit is 64 KiB
#             where shared memory's is 4 KiB, so the oversize and truncated
#             messages take other protocol paths), internal/rawmpi and mpibench
#             at 2.
#   mpich     binaries built against MPICH (-tags "mpi mpich", pkg-config
#             "mpich") and run by mpiexec.mpich: the binding's every C call
#             compiled against MPICH's mpi.h (integer handles where Open MPI
#             has pointers) and run. cluster at 2 and 4, msg, internal/rawmpi and
#             mpibench at 2: about 20 s of runs here. Not at 1 rank: with
#             Debian's MPICH 4.0.2 (ch4:ucx) a receive from self that one
#             thread waits on in MPI_Wait never completes when another
#             thread sends the message, also in plain C (cluster's
#             TestLateMessage hangs on it). msg at 3 ranks is left to the
#             other passes: under MPICH it takes 80 s here (34 s under Open
#             MPI) for the same fault matrix.
#
# The extra passes reuse the default pass's binaries (built once, with the
# race detector); only MPICH needs its own. Each pass first runs cluster's
# TestThreadLevel at 2 ranks with -test.v and checks the line every rank
# logs: both ranks are in one world of 2 (a binary launched by another
# MPI's launcher starts as one-rank worlds, where the tests would pass
# without testing anything) and the design is the pass's (funneled in the
# funneled pass; otherwise multiple, or what DISTBUF_MPI_THREAD says). The
# tcp pass adds Open MPI's selection output to that run and checks that
# every rank selected ob1 and the tcp BTL and initialised no other BTL
# than self and tcp.
#
# Other knobs: MPIRUN (Open MPI's launcher, default mpirun), MPIRUN_FLAGS
# (extra flags for it), MPICH_MPIEXEC (default mpiexec.mpich),
# MPICH_MPIEXEC_FLAGS, MPI_TEST_TIMEOUT (seconds per run, default 300),
# MPI_RACE=0 to build without the race detector, MPI_TEST_ARGS (extra test
# flags, e.g. "-test.v").
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
MPIRUN=${MPIRUN:-mpirun}
MPICH_MPIEXEC=${MPICH_MPIEXEC:-mpiexec.mpich}
default_ranks=${MPI_RANKS:-"1 2 4"}
run_timeout=${MPI_TEST_TIMEOUT:-300}
passes=${MPI_PASSES:-"default funneled tcp mpich"}
race=-race
[ "${MPI_RACE:-1}" = 0 ] && race=

# The extra passes' runs, "package:rank counts" (see above for why).
funneled_runs=("cluster:1 2 4" "msg:2 3" "internal/rawmpi:2" "cluster/internal/mpibench:2")
tcp_runs=("cluster:2 4" "msg:2 3" "internal/rawmpi:2" "cluster/internal/mpibench:2")
mpich_runs=("cluster:2 4" "msg:2" "internal/rawmpi:2" "cluster/internal/mpibench:2")

# Environment the tests read, passed to every rank (Open MPI passes only
# what -x names; Hydra passes the whole environment by default).
test_env=(DISTBUF_TEST_HUGE DISTBUF_MPI_THREAD DISTBUF_MPI_CUDA_AWARE DISTBUF_REQUIRE_GPU)

# Packages with MPI tests: a _test.go file whose build line requires the
# mpi tag (a "!mpi" file does not count).
mapfile -t dirs < <(git ls-files -co --exclude-standard '*_test.go' 2>/dev/null |
  xargs -r grep -lE '^//go:build (.*[^![:alnum:]_])?mpi([^[:alnum:]_]|$)' |
  xargs -r -n1 dirname | sort -u)
if [ ${#dirs[@]} -eq 0 ]; then
  echo "test-mpi: no packages with mpi-tagged tests" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=()
timings=()

# Captured, not piped into grep -q: under pipefail grep's early exit can
# fail the pipeline through the writer's SIGPIPE.
version=$("$MPIRUN" --version 2>&1 || true)
openmpi=0
[[ $version == *"Open MPI"* ]] && openmpi=1

# build TAGS DIR prints the path of DIR's test binary built with TAGS,
# building it on first use; later passes with the same TAGS reuse it.
build() {
  local tags=$1 dir=$2 bin
  bin="$tmp/${tags// /_}/${dir//\//_}.test"
  if [ -f "$bin.failed" ]; then
    return 1
  fi
  if [ ! -x "$bin" ]; then
    mkdir -p "$(dirname "$bin")"
    echo "test-mpi: building $dir ($GO test -c $race -tags \"$tags\")" >&2
    # shellcheck disable=SC2086
    if ! "$GO" test -c $race -tags "$tags" -o "$bin" "./$dir" >&2; then
      touch "$bin.failed"
      return 1
    fi
  fi
  echo "$bin"
}

# set_launcher PASS fills launch (the launcher and its flags) and run_env
# (the environment of every run) for PASS.
set_launcher() {
  local pass=$1 v
  run_env=()
  if [ "$pass" = funneled ]; then
    run_env=(DISTBUF_MPI_THREAD=funneled)
  fi
  if [ "$pass" = mpich ]; then
    launch=("$MPICH_MPIEXEC")
    # shellcheck disable=SC2206
    launch+=(${MPICH_MPIEXEC_FLAGS:-})
    return 0
  fi
  launch=("$MPIRUN")
  if [ "$openmpi" = 1 ]; then
    if [ "$(id -u)" = 0 ]; then
      launch+=(--allow-run-as-root)
    fi
    launch+=(--oversubscribe)
    for v in "${test_env[@]}"; do
      if [ -n "${!v+x}" ] || { [ "$pass" = funneled ] && [ "$v" = DISTBUF_MPI_THREAD ]; }; then
        launch+=(-x "$v")
      fi
    done
  fi
  if [ "$pass" = tcp ]; then
    launch+=(--mca pml ob1 --mca btl "self,tcp")
  fi
  # shellcheck disable=SC2206
  launch+=(${MPIRUN_FLAGS:-})
}

# check_pass PASS BIN: the pass's world and design (and for tcp its
# transports) as TestThreadLevel and Open MPI report them at 2 ranks.
check_pass() {
  local pass=$1 bin=$2 want=multiple out r n others verbose=() how=""
  case "${DISTBUF_MPI_THREAD:-}" in
    funneled | funnelled) want=funneled ;;
  esac
  if [ "$pass" = funneled ]; then
    want=funneled
  fi
  if [ "$pass" = tcp ]; then
    verbose=(--mca pml_base_verbose 10 --mca btl_base_verbose 30)
  fi
  if ! out=$(cd cluster && env "${run_env[@]}" timeout --kill-after=10 120 "${launch[@]}" "${verbose[@]}" -n 2 "$bin" \
      -test.run '^TestThreadLevel$' -test.v -test.count=1 2>&1); then
    echo "$out"
    echo "test-mpi: $pass: the check run of TestThreadLevel failed" >&2
    return 1
  fi
  for r in 0 1; do
    if ! grep -q "rank $r of 2: design $want," <<<"$out"; then
      echo "$out"
      echo "test-mpi: $pass: rank $r did not report design $want in a world of 2 ranks" >&2
      return 1
    fi
  done
  if [ "$pass" = tcp ]; then
    n=$(grep -c 'select: component ob1 selected' <<<"$out" || true)
    r=$(grep -c 'select: init of component tcp returned success' <<<"$out" || true)
    others=$(grep 'select: initializing btl component' <<<"$out" | grep -vE 'component (self|tcp)$' || true)
    if [ "$n" != 2 ] || [ "$r" != 2 ] || [ -n "$others" ]; then
      echo "$out"
      echo "test-mpi: tcp: want ob1 and the tcp BTL on both ranks and no other BTL than self and tcp; got ob1 on $n, tcp on $r, other: ${others:-none}" >&2
      return 1
    fi
    how=", over ob1 and the tcp BTL alone"
  fi
  echo "test-mpi: $pass: both ranks report design $want in one world of 2$how"
}

# run_pass PASS TAGS RUN...: each RUN is "package:rank counts".
run_pass() {
  local pass=$1 tags=$2 spec dir ranks bin n start rc why
  shift 2
  set_launcher "$pass"
  if [ "$pass" = mpich ] && ! pkg-config --exists mpich; then
    failed+=("mpich (no pkg-config module mpich: run scripts/install-deps.sh --mpich)")
    return 0
  fi
  if ! command -v "${launch[0]}" >/dev/null 2>&1; then
    failed+=("$pass (${launch[0]} not found: run scripts/install-deps.sh --mpich)")
    return 0
  fi
  if [ "$pass" = tcp ] && [ "$openmpi" != 1 ]; then
    failed+=("tcp ($MPIRUN is not Open MPI; the pass uses Open MPI's --mca flags)")
    return 0
  fi
  if ! bin=$(build "$tags" cluster); then
    failed+=("$pass: cluster (build)")
    return 0
  fi
  if ! check_pass "$pass" "$bin"; then
    failed+=("$pass (check of world and design)")
    return 0
  fi
  for spec in "$@"; do
    dir=${spec%%:*}
    ranks=${spec#*:}
    if [[ " ${dirs[*]} " != *" $dir "* ]]; then
      failed+=("$pass: $dir has no MPI tests (update the pass's runs in $0)")
      continue
    fi
    if ! bin=$(build "$tags" "$dir"); then
      failed+=("$pass: $dir (build)")
      continue
    fi
    for n in $ranks; do
      start=$(date +%s)
      echo "test-mpi: $pass: $dir: ${launch[*]} -n $n (timeout ${run_timeout}s)"
      # Run in the package directory, as go test does, so testdata resolves.
      # shellcheck disable=SC2086
      if (cd "$dir" && env "${run_env[@]}" timeout --kill-after=10 "$run_timeout" "${launch[@]}" -n "$n" "$bin" \
          -test.count=1 -test.timeout=240s ${MPI_TEST_ARGS:-}); then
        echo "test-mpi: $pass: $dir -n $n ok ($(($(date +%s) - start))s)"
      else
        rc=$?
        why="failed"
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="timed out"; fi
        echo "test-mpi: $pass: $dir -n $n $why (exit $rc)" >&2
        failed+=("$pass: $dir -n $n ($why)")
      fi
    done
  done
}

for pass in $passes; do
  start_pass=$(date +%s)
  echo "test-mpi: pass $pass"
  case $pass in
    default)
      runs=()
      for dir in "${dirs[@]}"; do
        ranks=$default_ranks
        if [ -f "$dir/testdata/mpi-ranks" ]; then
          ranks=$(tr -s ' \n\t' ' ' <"$dir/testdata/mpi-ranks")
        fi
        runs+=("$dir:$ranks")
      done
      run_pass default mpi "${runs[@]}"
      ;;
    funneled) run_pass funneled mpi "${funneled_runs[@]}" ;;
    tcp) run_pass tcp mpi "${tcp_runs[@]}" ;;
    mpich) run_pass mpich "mpi mpich" "${mpich_runs[@]}" ;;
    *) failed+=("$pass (unknown pass; want default, funneled, tcp or mpich)") ;;
  esac
  timings+=("$pass $(($(date +%s) - start_pass))s")
done

printf -v summary '%s, ' "${timings[@]}"
echo "test-mpi: time per pass: ${summary%, }"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'test-mpi: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "test-mpi: all MPI test runs passed ($passes)"
