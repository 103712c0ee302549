#!/usr/bin/env bash
# Runs every package's MPI tests (the *_test.go files built only with the
# mpi tag) under mpirun, once per rank count, each run under a timeout so a
# hung rank fails the run instead of hanging it. Installs nothing: `make
# mpitest` runs scripts/install-deps.sh first.
#
# Rank counts: "1 2 4" by default (override with MPI_RANKS="..."), or the
# contents of <package>/testdata/mpi-ranks, e.g. "2 3 4".
# Other knobs: MPIRUN (default mpirun), MPIRUN_FLAGS (extra flags),
# MPI_TEST_TIMEOUT (seconds per run, default 300), MPI_RACE=0 to build
# without the race detector, MPI_TEST_ARGS (extra test flags, e.g.
# "-test.v").
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
MPIRUN=${MPIRUN:-mpirun}
default_ranks=${MPI_RANKS:-"1 2 4"}
run_timeout=${MPI_TEST_TIMEOUT:-300}
race=-race
[ "${MPI_RACE:-1}" = 0 ] && race=

if ! command -v "$MPIRUN" >/dev/null 2>&1; then
  echo "test-mpi: $MPIRUN not found (run scripts/install-deps.sh)" >&2
  exit 1
fi
flags=()
if "$MPIRUN" --version 2>&1 | grep -q "Open MPI"; then
  [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
  flags+=(--oversubscribe)
  # Environment the tests read, passed to every rank.
  for v in DISTBUF_TEST_HUGE DISTBUF_MPI_THREAD DISTBUF_MPI_CUDA_AWARE DISTBUF_REQUIRE_GPU; do
    [ -n "${!v+x}" ] && flags+=(-x "$v")
  done
fi
# shellcheck disable=SC2206
flags+=(${MPIRUN_FLAGS:-})

# Packages with MPI tests: a _test.go file whose build line requires the
# mpi tag (a "!mpi" file does not count).
mapfile -t dirs < <(git ls-files -co --exclude-standard '*_test.go' 2>/dev/null |
  xargs -r grep -lE '^//go:build (.*[^![:alnum:]_])?mpi([^[:alnum:]_]|$)' |
  xargs -r -n1 dirname | sort -u)
if [ ${#dirs[@]} -eq 0 ]; then
  echo "test-mpi: no packages with mpi-tagged tests"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=()
for dir in "${dirs[@]}"; do
  name=$(echo "$dir" | tr '/' '_')
  bin="$tmp/$name.test"
  echo "test-mpi: building $dir ($GO test -c $race -tags mpi)"
  if ! "$GO" test -c $race -tags mpi -o "$bin" "./$dir"; then
    failed+=("$dir (build)")
    continue
  fi
  ranks=$default_ranks
  if [ -f "$dir/testdata/mpi-ranks" ]; then
    ranks=$(tr -s ' \n\t' ' ' <"$dir/testdata/mpi-ranks")
  fi
  for n in $ranks; do
    start=$(date +%s)
    echo "test-mpi: $dir: $MPIRUN -n $n (timeout ${run_timeout}s)"
    # Run in the package directory, as go test does, so testdata resolves.
    # shellcheck disable=SC2086
    if (cd "$dir" && timeout --kill-after=10 "$run_timeout" "$MPIRUN" "${flags[@]}" -n "$n" "$bin" \
        -test.count=1 -test.timeout=240s ${MPI_TEST_ARGS:-}); then
      echo "test-mpi: $dir -n $n ok ($(($(date +%s) - start))s)"
    else
      rc=$?
      why="failed"
      [ $rc -eq 124 ] || [ $rc -eq 137 ] && why="timed out"
      echo "test-mpi: $dir -n $n $why (exit $rc)" >&2
      failed+=("$dir -n $n ($why)")
    fi
  done
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "test-mpi: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "test-mpi: all MPI test runs passed"
