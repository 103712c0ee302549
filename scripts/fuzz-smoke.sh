#!/usr/bin/env bash
# Runs every fuzz target in the module for a short time (FUZZTIME, default
# 5s) on top of its seed corpus and testdata/fuzz corpus. New failing inputs
# are written to testdata/fuzz/<Target>/ by go test, to be committed.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-5s}
status=0
while IFS= read -r line; do
  file=${line%%:*}
  target=$(sed -E 's/^.*func (Fuzz[A-Za-z0-9_]*)\(.*/\1/' <<<"$line")
  pkg=$(dirname "$file")
  echo "fuzz: $pkg $target ($fuzztime)"
  if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >/tmp/fuzz-$$.log 2>&1; then
    cat /tmp/fuzz-$$.log
    status=1
  fi
done < <(grep -rEn --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(' . | grep -v '/testdata/' | sort)
rm -f /tmp/fuzz-$$.log
exit $status
