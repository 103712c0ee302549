#!/usr/bin/env bash
# Installs what the build and tests need and is not already there: Open MPI
# (mpicc, mpirun, pkg-config "mpi"). Safe to run any number of times.
set -euo pipefail

need=()
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: missing ${need[*]} and no apt-get; install Open MPI (or MPICH) by hand" >&2
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
