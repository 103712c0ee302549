#!/usr/bin/env bash
# GPU checks for packing, gemm and their loaders (internal/cukernel,
# internal/nvrtc, internal/cublas).
#
#   scripts/gpu-test-packing.sh build     on a Go machine: test binaries and ranktest into gpubin/
#   scripts/gpu-test-packing.sh run       on the GPU machine (no Go): ABI checks, tests, benchmarks
#   scripts/gpu-test-packing.sh sanitize  on the GPU machine: the CUDA tests under compute-sanitizer
#   scripts/gpu-test-packing.sh           prints these steps
#
# The binaries are git-ignored (*.test): carry gpubin/ to the GPU machine.
# The tests fail (not skip) there because DISTBUF_REQUIRE_GPU=1. The packing
# and gemm suites need devalloc's CUDA backend; the loader tests and
# TestCopyKernelRaw do not.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${GPUBIN:-gpubin}
CUDA=${CUDA_HOME:-/usr/local/cuda}
PKGS=(internal/cukernel internal/nvrtc internal/cublas packing gemm)

name() { echo "$1" | tr / -; }

build() {
	mkdir -p "$OUT"
	for p in "${PKGS[@]}"; do
		go test -c -o "$OUT/$(name "$p").test" "./$p"
	done
	go build -o "$OUT/ranktest" ./cmd/ranktest
	ls -l "$OUT"
}

abicheck() {
	local dir
	dir=$(mktemp -d)
	for f in internal/cukernel/abicheck/*.c internal/nvrtc/abicheck/*.c internal/cublas/abicheck/*.c; do
		echo "== abicheck $f"
		cc -Wall -I"$CUDA/include" -o "$dir/abi" "$f"
		"$dir/abi"
	done
	rm -rf "$dir"
}

run() {
	local failed=()
	abicheck || failed+=(abicheck)
	export DISTBUF_REQUIRE_GPU=1
	for p in "${PKGS[@]}"; do
		echo "== $p"
		"$OUT/$(name "$p").test" -test.v -test.count=1 -test.timeout=300s 2>&1 | grep -Ev '^=== (RUN|PAUSE|CONT)' || failed+=("$p")
	done
	echo "== ranktest -bench gemm"
	"$OUT/ranktest" -backend cuda -bench gemm -iters 20 || failed+=("bench gemm")
	echo "== ranktest -bench pack"
	"$OUT/ranktest" -backend cuda -bench pack -iters 20 || failed+=("bench pack")
	if [ ${#failed[@]} -gt 0 ]; then
		echo "FAILED: ${failed[*]}"
		return 1
	fi
	echo "all GPU checks passed"
}

sanitize() {
	export DISTBUF_REQUIRE_GPU=1
	local san="$CUDA/bin/compute-sanitizer"
	command -v compute-sanitizer >/dev/null 2>&1 && san=compute-sanitizer
	"$san" --tool memcheck --error-exitcode 1 "$OUT/packing.test" -test.count=1 -test.run 'CUDA|Kernel|Padding|Wrap|Transfer'
	"$san" --tool memcheck --error-exitcode 1 "$OUT/gemm.test" -test.count=1 -test.run 'Contractions/cuda/float64|Shared'
	"$san" --tool memcheck --error-exitcode 1 "$OUT/internal-cublas.test" -test.count=1
}

case "${1:-}" in
build) build ;;
run) run ;;
sanitize) sanitize ;;
abicheck) abicheck ;;
*)
	cat <<EOM
On a Go machine:   scripts/gpu-test-packing.sh build        # -> $OUT/{$(for p in "${PKGS[@]}"; do printf '%s.test,' "$(name "$p")"; done)ranktest}
On the GPU:        scripts/gpu-test-packing.sh run          # ABI checks, DISTBUF_REQUIRE_GPU=1 tests, ranktest -bench gemm/pack
                   scripts/gpu-test-packing.sh sanitize     # compute-sanitizer memcheck of the CUDA tests
                   scripts/gpu-test-packing.sh abicheck     # only the hand-written CUDA declarations
EOM
	;;
esac
