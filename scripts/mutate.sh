#!/usr/bin/env bash
# Proves that every ordering rule of devalloc's ledger has a test that fails
# when the rule is broken. For each mutation below, a copy of the tracked
# tree (in a temporary directory) gets one rule taken out of the code, and
# the test named beside it must then fail; the script fails if any mutation
# survives (its test still passes) or no longer applies (the code moved:
# update the mutation). Run from anywhere; needs Go and perl.
#
#   scripts/mutate.sh            # every mutation
#   scripts/mutate.sh NAME...    # the named ones
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

# name | file | perl literal to find | replacement | test regex (devalloc)
mutations=(
  "stream-wait|devalloc/stream.go|s.impl.wait(e.impl)|error(nil)|^TestHostConformance\$/^WaitOrdersStreams\$"
  "read-waits-for-writer|devalloc/buffer.go|if err := b.waitIn(s, b.writer); err != nil {|if err := error(nil); err != nil {|^TestHostConformance\$/^ReadWaitsForWriter\$"
  "write-waits-for-readers|devalloc/buffer.go|	if mode == Write {
		for _, r := range b.readers() {|	if mode == Write {
		for _, r := range b.readers()[:0] {|^TestHostConformance\$/^WriteWaitsForReaders\$"
  "hold-waits-for-stream|devalloc/buffer.go|for _, d := range deps {|for _, d := range deps[:0] {|^TestHostConformance\$/^HoldWrite\$"
  "free-after-completions|devalloc/buffer.go|err = b.orderAfter(on, Write)|err = error(nil)|^TestHostConformance\$/^FreeAfterCompletions\$/other-stream"
  "seal-before-host-wait|devalloc/buffer.go|if err := s.seal(); err != nil {
			return err
		}
		if err := s.impl.waitHost(h.done)|if err := s.impl.waitHost(h.done)|^TestHostConformance\$/^MarkSealedBeforeHostWait\$"
  "skip-only-covered-waits|devalloc/stream.go|if s.waited[other] >= seq {|if true {|^TestSkippedWaitStillOrders\$"
  "seal-before-enqueue|devalloc/stream.go|	if err := s.seal(); err != nil {
		return err
	}
	if err := s.impl.enqueue(fn)|	if err := s.impl.enqueue(fn)|^TestHostConformance\$/^MarkSealedBeforeEnqueue\$"
)

want=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git ls-files -z | tar --null -T - -cf "$tmp/tree.tar"
failed=()
ran=0
for m in "${mutations[@]}"; do
  # Fields split by hand: a code fragment may span lines.
  name=${m%%|*}; rest=${m#*|}
  file=${rest%%|*}; rest=${rest#*|}
  test=${rest##*|}; rest=${rest%|*}
  repl=${rest##*|}; find=${rest%|*}
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" $name "* ]]; then
    continue
  fi
  ran=$((ran + 1))
  dir="$tmp/$name"
  mkdir -p "$dir"
  tar -xf "$tmp/tree.tar" -C "$dir"
  n=$(FIND="$find" REPL="$repl" perl -0 -i -pe '$c += s/\Q$ENV{FIND}\E/$ENV{REPL}/g; END { print STDERR $c+0 }' "$dir/$file" 2>&1 >/dev/null)
  if [ "$n" != 1 ]; then
    echo "mutate: $name: the code to break appears $n times in $file (want 1): update the mutation" >&2
    failed+=("$name (stale)")
    continue
  fi
  if (cd "$dir" && timeout 300 "$GO" test -count=1 -run "$test" ./devalloc >"$dir.log" 2>&1); then
    echo "mutate: $name: SURVIVED: $test passes with the rule taken out of $file" >&2
    failed+=("$name")
  elif grep -q -e '\[build failed\]' -e '\[setup failed\]' "$dir.log"; then
    # A mutant that does not build proves nothing about the test.
    echo "mutate: $name: the mutated tree does not build:" >&2
    head -n 20 "$dir.log" >&2
    failed+=("$name (no build)")
  else
    echo "mutate: $name: killed by $test ($(grep -m1 -oE '(FAIL|panic|timed out)[^\n]{0,80}' "$dir.log" || echo failed))"
  fi
done
if [ "$ran" -eq 0 ]; then
  echo "mutate: no mutation matches ${want[*]}" >&2
  exit 2
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "mutate: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "mutate: all $ran mutations killed"
