#!/usr/bin/env bash
# Proves that distbuf's hand-written CUDA declarations match the installed
# toolkit. Run on the GPU machine from the repository root (needs a C
# compiler and the CUDA headers; no Go):
#
#   scripts/check-cuda-abi.sh
#
# Every loader keeps a check program in internal/<pkg>/abicheck/*.c that
# includes its declarations header (internal/<pkg>/*.h) next to the real
# headers and prints "MISMATCH ..." for each difference: internal/cudart
# (the one binding of libcudart: allocator, kernels, copies, events, IPC),
# internal/nvrtc, internal/cublas and internal/nccl. Each is compiled
# with -I$CUDA_HOME/include (default /usr/local/cuda) and run; a line
# "ABICHECK_LDFLAGS: <flags>" in a program adds link flags. The script fails
# if any program fails to compile, reports a mismatch, or exits non-zero.
set -euo pipefail

cd "$(dirname "$0")/.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CC=${CC:-cc}
if [ ! -f "$CUDA_HOME/include/cuda_runtime_api.h" ]; then
  echo "check-cuda-abi: no CUDA headers at $CUDA_HOME/include (set CUDA_HOME)" >&2
  exit 1
fi
shopt -s nullglob
programs=(internal/*/abicheck/*.c)
if [ ${#programs[@]} -eq 0 ]; then
  echo "check-cuda-abi: no internal/*/abicheck/*.c programs found" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUDA_HOME/lib64"

failed=()
skipped=()
for src in "${programs[@]}"; do
  pkgdir=$(dirname "$(dirname "$src")")
  name=$(basename "$src" .c)
  bin="$work/$(basename "$pkgdir")-$name"
  # shellcheck disable=SC2207
  extra=($(sed -n 's/.*ABICHECK_LDFLAGS:[[:space:]]*//p' "$src" | head -n1))
  echo "== $src"
  incs=()
  # A program for an optional library (NCCL) names its header; it is checked
  # where the header is installed and skipped, saying so, where it is not.
  need=$(sed -n 's/.*ABICHECK_NEEDS:[[:space:]]*\([^ ]*\).*/\1/p' "$src" | head -n1)
  if [ -n "$need" ]; then
    hdr=""
    for d in ${NCCL_HOME:+"$NCCL_HOME/include"} /usr/include /usr/local/include "$CUDA_HOME/include" \
        $(find / -path /proc -prune -o -path '*/nvidia/nccl/include' -type d -print 2>/dev/null | head -n 3); do
      if [ -f "$d/$need" ]; then hdr=$d; break; fi
    done
    if [ -z "$hdr" ]; then
      echo "skipped: $need is not installed here"
      skipped+=("$src")
      continue
    fi
    incs+=(-I"$hdr")
  fi
  if ! "$CC" -std=gnu11 -Wall -I"$CUDA_HOME/include" "${incs[@]}" -I"$pkgdir" -o "$bin" "$src" \
      -L"$CUDA_HOME/lib64" "${extra[@]}" -ldl; then
    echo "FAILED to compile $src (a prototype or type that does not match fails here too)"
    failed+=("$src")
    continue
  fi
  if ! "$bin"; then
    failed+=("$src")
  fi
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "check-cuda-abi: FAILED: ${failed[*]}"
  exit 1
fi
echo "check-cuda-abi: $((${#programs[@]} - ${#skipped[@]})) program(s) match the headers in $CUDA_HOME/include${skipped:+; skipped for want of a header: ${skipped[*]}}"
