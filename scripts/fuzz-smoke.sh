#!/usr/bin/env bash
# Runs every fuzz target in the module for a short time (FUZZTIME, default
# 5s) on top of its seed corpus and testdata/fuzz corpus. New failing inputs
# are written to testdata/fuzz/<Target>/ by go test, to be committed.
#
# Each input that finds new coverage is minimised for at most
# FUZZMINIMIZETIME (default 10x: ten executions) rather than go test's 60 s,
# so that a target whose inputs keep finding coverage (FuzzLedger) executes
# inputs instead of minimising: in 5 s here FuzzLedger executed about 1300
# inputs with go test's default and about 15000 with 10x.
#
# Go before 1.27 can end a run of -fuzztime with a bare "context deadline
# exceeded" when a worker is still busy as the time runs out
# (golang/go#75804): no input failed and none is written. Such a run is
# repeated once; a finding (a written input, a panic, a failed check) fails
# at once, and so does a second bare deadline.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-5s}
minimizetime=${FUZZMINIMIZETIME:-10x}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# bare_deadline LOG: the run failed only by the coordinator's deadline.
bare_deadline() {
  grep -q '^    context deadline exceeded$' "$1" &&
    ! grep -q 'Failing input written\|^panic:\|_test\.go:[0-9]*:' "$1"
}

status=0
while IFS= read -r line; do
  file=${line%%:*}
  target=$(sed -E 's/^.*func (Fuzz[A-Za-z0-9_]*)\(.*/\1/' <<<"$line")
  pkg=$(dirname "$file")
  for attempt in 1 2; do
    echo "fuzz: $pkg $target ($fuzztime)"
    if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimizetime" "$pkg" >"$log" 2>&1; then
      break
    fi
    if [ "$attempt" = 1 ] && bare_deadline "$log"; then
      echo "fuzz: $target ended on the fuzz coordinator's deadline with no failing input (golang/go#75804); once more"
      continue
    fi
    cat "$log"
    status=1
    break
  done
done < <(grep -rEn --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(' . | grep -v '/testdata/' | sort)
exit $status
