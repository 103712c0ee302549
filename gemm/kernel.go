package gemm

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/distbuf/distbuf/internal/cukernel"
	"github.com/distbuf/distbuf/internal/nvrtc"
	"github.com/distbuf/distbuf/packing"
)

// smallKernelSource holds distbuf's own GEMM kernels, compiled at run time
// by NVRTC for the device's architecture (as packing's gather kernel is).
//
// distbuf_gemm_small_{s,d,c,z} multiply a wave of blocks, reading each
// product's offsets and shape from the plan's stack on the device: one warp
// per product, a lane per element of C, the inner loop over k. For the
// blocks of 1 to 8 rows and columns that fill a DMRG solve's spectrum this
// is one launch where cuBLAS needs a grouped call of hundreds of shape
// groups (the approach of DBCSR's libsmm_acc and MAGMA's vbatched GEMM: the
// parameter stack stays resident, one launch per stack). flags: bit 0
// transposes A, bit 1 B, bit 2 reads C (beta != 0; with beta = 0 C is only
// written, as in BLAS, so a NaN there does not survive).
//
// distbuf_gemm_pointers derives cuBLAS's pointer arrays from the same stack
// for the operands' current addresses, so a plan run on new buffers moves
// no parameters from the host.
const smallKernelSource = `
struct distbuf_gemm_entry {
	unsigned long long a, b, c;
	int m, n, k, lda, ldb, pad;
};

// Complex values with the alignment of their parts: a layout may place a
// complex128 block at any multiple of 8 bytes.
struct zcplx { double x, y; };
struct ccplx { float x, y; };

__device__ __forceinline__ float fmadd(float x, float y, float acc) { return fmaf(x, y, acc); }
__device__ __forceinline__ double fmadd(double x, double y, double acc) { return fma(x, y, acc); }
__device__ __forceinline__ ccplx fmadd(ccplx x, ccplx y, ccplx acc) {
	acc.x = fmaf(x.x, y.x, fmaf(-x.y, y.y, acc.x));
	acc.y = fmaf(x.x, y.y, fmaf(x.y, y.x, acc.y));
	return acc;
}
__device__ __forceinline__ zcplx fmadd(zcplx x, zcplx y, zcplx acc) {
	acc.x = fma(x.x, y.x, fma(-x.y, y.y, acc.x));
	acc.y = fma(x.x, y.y, fma(x.y, y.x, acc.y));
	return acc;
}

template <typename T> __device__ __forceinline__ T scalar(double re, double im);
template <> __device__ __forceinline__ float scalar<float>(double re, double im) { return (float)re; }
template <> __device__ __forceinline__ double scalar<double>(double re, double im) { return re; }
template <> __device__ __forceinline__ ccplx scalar<ccplx>(double re, double im) { ccplx v; v.x = (float)re; v.y = (float)im; return v; }
template <> __device__ __forceinline__ zcplx scalar<zcplx>(double re, double im) { zcplx v; v.x = re; v.y = im; return v; }

template <typename T>
__device__ __forceinline__ void small_gemm(const distbuf_gemm_entry *__restrict__ stack, int count,
		const char *__restrict__ A, const char *__restrict__ B, char *__restrict__ C,
		double are, double aim, double bre, double bim, int flags)
{
	const T zero = scalar<T>(0, 0), alpha = scalar<T>(are, aim), beta = scalar<T>(bre, bim);
	const bool ta = flags & 1, tb = flags & 2, readC = flags & 4;
	const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
	for (int p = blockIdx.x * warps + (threadIdx.x >> 5); p < count; p += gridDim.x * warps) {
		const distbuf_gemm_entry e = stack[p];
		const T *__restrict__ a = (const T *)(A + e.a);
		const T *__restrict__ b = (const T *)(B + e.b);
		T *__restrict__ c = (T *)(C + e.c);
		// Strides of op(A)(i, l) and op(B)(l, j) in the stored blocks.
		const long long ai = ta ? 1 : e.lda, al = ta ? e.lda : 1;
		const long long bl = tb ? 1 : e.ldb, bj = tb ? e.ldb : 1;
		const long long mn = (long long)e.m * e.n;
		for (long long idx = lane; idx < mn; idx += 32) {
			const long long i = idx / e.n, j = idx - i * e.n;
			const T *x = a + i * ai;
			const T *y = b + j * bj;
			T acc = zero;
			for (int l = 0; l < e.k; l++)
				acc = fmadd(x[l * al], y[l * bl], acc);
			T r = fmadd(alpha, acc, zero);
			if (readC)
				r = fmadd(beta, c[idx], r);
			c[idx] = r;
		}
	}
}

#define DISTBUF_SMALL(name, T) \
extern "C" __global__ void name(const distbuf_gemm_entry *__restrict__ stack, int count, \
		const char *A, const char *B, char *C, double are, double aim, double bre, double bim, int flags) \
{ small_gemm<T>(stack, count, A, B, C, are, aim, bre, bim, flags); }

DISTBUF_SMALL(distbuf_gemm_small_s, float)
DISTBUF_SMALL(distbuf_gemm_small_d, double)
DISTBUF_SMALL(distbuf_gemm_small_c, ccplx)
DISTBUF_SMALL(distbuf_gemm_small_z, zcplx)

extern "C" __global__ void distbuf_gemm_pointers(const distbuf_gemm_entry *__restrict__ stack, int count,
		unsigned long long A, unsigned long long B, unsigned long long C, unsigned long long *__restrict__ out)
{
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
		const distbuf_gemm_entry e = stack[i];
		out[i] = A + e.a;
		out[count + i] = B + e.b;
		out[2 * (long long)count + i] = C + e.c;
	}
}
`

// Kernel names, in the order LoadKernels returns them: the four dtypes of
// the small-block kernel by packing.DType order, then the pointer kernel.
var smallKernelNames = []string{"distbuf_gemm_small_s", "distbuf_gemm_small_d", "distbuf_gemm_small_c", "distbuf_gemm_small_z", "distbuf_gemm_pointers"}

const (
	stackEntryBytes = 48
	// smallThreads is the thread block of the small kernel: four warps,
	// one product each.
	smallThreads  = 128
	smallWarps    = smallThreads / 32
	pointerThread = 256
	maxGridX      = 1 << 20

	flagTransA = 1
	flagTransB = 2
	flagReadC  = 4
)

// encodeStack writes the stack entry of every problem, in launch order:
// offsets a, b, c (uint64, bytes from the layout's start), then m, n, k, lda,
// ldb and a zero (int32), little-endian.
func encodeStack(dst []byte, probs []problem) {
	for i := range probs {
		q := &probs[i]
		e := dst[i*stackEntryBytes : (i+1)*stackEntryBytes]
		binary.LittleEndian.PutUint64(e[0:], uint64(q.a))
		binary.LittleEndian.PutUint64(e[8:], uint64(q.b))
		binary.LittleEndian.PutUint64(e[16:], uint64(q.c))
		for j, v := range [6]int32{q.m, q.n, q.k, q.lda, q.ldb, 0} {
			binary.LittleEndian.PutUint32(e[24+4*j:], uint32(v))
		}
	}
}

// kernelLauncher runs the plan's own kernels on a stream: on CUDA through
// the runtime; in tests through a host emulation of the same contract.
type kernelLauncher interface {
	// small multiplies the count products whose entries start at stack:
	// C = alpha*op(A)*op(B) (+ beta*C when flagReadC) at bases + offsets.
	small(dt packing.DType, stack uintptr, count int, bases [3]uintptr, alpha, beta complex128, flags int) error
	// pointers writes out[i] = bases[0]+a_i, out[n+i] = bases[1]+b_i,
	// out[2n+i] = bases[2]+c_i for the count entries at stack.
	pointers(stack uintptr, count int, bases [3]uintptr, out uintptr) error
}

// cudaKernels launches the compiled kernels on one device and stream.
type cudaKernels struct {
	rt     *cukernel.Runtime
	dev    int
	stream uintptr
	k      []cukernel.Kernel
}

func grid(items, perBlock int) int { return max(1, min((items+perBlock-1)/perBlock, maxGridX)) }

func (c *cudaKernels) small(dt packing.DType, stack uintptr, count int, bases [3]uintptr, alpha, beta complex128, flags int) error {
	which := map[packing.DType]int{packing.Float32: 0, packing.Float64: 1, packing.Complex64: 2, packing.Complex128: 3}[dt]
	return c.rt.Launch(c.dev, c.k[which], grid(count, smallWarps), 1, smallThreads, 0, c.stream,
		uint64(stack), uint64(count), uint64(bases[0]), uint64(bases[1]), uint64(bases[2]),
		math.Float64bits(real(alpha)), math.Float64bits(imag(alpha)), math.Float64bits(real(beta)), math.Float64bits(imag(beta)), uint64(flags))
}

func (c *cudaKernels) pointers(stack uintptr, count int, bases [3]uintptr, out uintptr) error {
	return c.rt.Launch(c.dev, c.k[4], grid(count, pointerThread), 1, pointerThread, 0, c.stream,
		uint64(stack), uint64(count), uint64(bases[0]), uint64(bases[1]), uint64(bases[2]), uint64(out))
}

type deviceKernels struct {
	once sync.Once
	k    []cukernel.Kernel
	err  error
}

var compiled sync.Map // device ordinal -> *deviceKernels

// loadKernels compiles and loads the kernels for a device once; a failure is
// remembered, and the engine runs small launches through cuBLAS instead.
func loadKernels(dev int) (*cukernel.Runtime, []cukernel.Kernel, error) {
	rt, err := cukernel.Load()
	if err != nil {
		return nil, nil, err
	}
	v, _ := compiled.LoadOrStore(dev, &deviceKernels{})
	dk := v.(*deviceKernels)
	dk.once.Do(func() {
		if dk.err = rt.CanLaunch(); dk.err != nil {
			return
		}
		major, minor, err := rt.ComputeCapability(dev)
		if err != nil {
			dk.err = err
			return
		}
		nv, err := nvrtc.Load()
		if err != nil {
			dk.err = err
			return
		}
		arch := fmt.Sprintf("--gpu-architecture=sm_%d%d", major, minor)
		image, err := nv.Compile(smallKernelSource, "distbuf_gemm.cu", []string{arch}, true)
		if err != nil {
			dk.err = err
			return
		}
		dk.k, dk.err = rt.LoadKernels(dev, image, smallKernelNames...)
	})
	return rt, dk.k, dk.err
}
