#!/usr/bin/env bash
# Installs what the build (and, with --mpich, the MPI tests) need and is not
# already there, then checks that the default MPI is still Open MPI. Safe to
# run any number of times.
#
#   scripts/install-deps.sh          Open MPI (libopenmpi-dev, openmpi-bin):
#                                    the default MPI of the build: mpicc,
#                                    mpirun and pkg-config "mpi".
#   scripts/install-deps.sh --mpich  also MPICH (libmpich-dev, mpich) for the
#                                    MPICH pass of scripts/test-mpi.sh, which
#                                    names it explicitly: pkg-config "mpich"
#                                    (-tags "mpi mpich") and mpiexec.mpich.
#                                    `make mpitest` (and so `make test`) asks
#                                    for it; `make build` and `make run` do
#                                    not need it.
#
# Each is looked for by a name that only it provides (pkg-config "ompi" and
# mpirun.openmpi; pkg-config "mpich" and mpiexec.mpich): the generic mpicc
# and mpirun may belong to either once both are installed.
set -euo pipefail

mpich=0
for arg in "$@"; do
  case $arg in
    --mpich) mpich=1 ;;
    *) echo "usage: $0 [--mpich]" >&2; exit 2 ;;
  esac
done

has_pc() { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists "$1"; }

need=()
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
has_pc ompi || need+=(libopenmpi-dev)
command -v mpirun.openmpi >/dev/null 2>&1 || need+=(openmpi-bin)
if [ "$mpich" = 1 ]; then
  has_pc mpich || need+=(libmpich-dev)
  command -v mpiexec.mpich >/dev/null 2>&1 || need+=(mpich)
fi

if [ ${#need[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: missing ${need[*]} and no apt-get; install them by hand" >&2
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "install-deps: missing ${need[*]}; run as root or install sudo" >&2
      exit 1
    fi
  fi
  echo "install-deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Debian and Ubuntu pick the default of mpicc, mpirun and pkg-config "mpi"
# through update-alternatives; Open MPI's priority (50) is above MPICH's
# (40), so installing MPICH leaves them on Open MPI. An administrator's
# manual choice can still point them at MPICH, and then `make build`,
# `go vet -tags mpi` and the Open MPI passes of the MPI tests would quietly
# test MPICH twice (and the TCP pass, which uses Open MPI's flags, would
# fail obscurely): stop here instead, saying how to restore the default.
# (Outputs are captured before matching: `cmd | grep -q` under pipefail
# fails when grep's early exit gets cmd a SIGPIPE.)
wrong=()
out=$(mpirun --version 2>&1 || true)
[[ $out == *"Open MPI"* ]] || wrong+=("mpirun is $(command -v mpirun || echo missing)")
out=$(mpicc --showme:version 2>&1 || true)
[[ $out == *"Open MPI"* ]] || wrong+=("mpicc is $(command -v mpicc || echo missing)")
out=$(pkg-config --cflags --libs mpi 2>&1 || true)
[ "$out" = "$(pkg-config --cflags --libs ompi)" ] || wrong+=("pkg-config mpi gives: $out")
if [ ${#wrong[@]} -gt 0 ]; then
  printf -v list '%s; ' "${wrong[@]}"
  echo "install-deps: the default MPI is not Open MPI: ${list%; }" >&2
  echo "install-deps: on Debian and Ubuntu, restore it with: update-alternatives --auto mpi; update-alternatives --auto mpirun; update-alternatives --auto mpi-$(gcc -dumpmachine)" >&2
  exit 1
fi
