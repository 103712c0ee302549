package gemm

import (
	"encoding/binary"
	"math"
	"sync"
	"unsafe"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/nvrtc"
	"github.com/distbuf/distbuf/packing"
)

// smallKernelSource holds distbuf's own GEMM kernels, compiled at run time
// by NVRTC for the device's architecture (as packing's gather kernel is).
//
// distbuf_gemm_small_{s,d,c,z} multiply one wave of a plan in one launch,
// reading each product's offsets and shape from the plan's stack on the
// device (the approach of DBCSR's libsmm_acc and MAGMA's vbatched GEMM: the
// parameter stack stays resident, one launch per stack). The wave's entries
// come in two runs. The first tiny entries (every dimension at most
// warpMax) take a warp each, a lane per element of C and the inner loop
// over k: for the blocks of 1 to 8 rows and columns that fill a DMRG
// solve's spectrum, one launch where cuBLAS needs a grouped call of
// hundreds of shape groups. The others take a thread block each, which
// walks C in 64 x 64 tiles, stages 16-wide slices of op(A) and op(B) in
// shared memory and gives each thread a 4 x 4 piece of the tile. The grid's
// first blocks run the tiny entries, eight to a block, the rest one medium
// entry each. flags: bit 0 transposes A, bit 1 B, bit 2 reads C (beta != 0;
// with beta = 0 C is only written, as in BLAS, so a NaN there does not
// survive).
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

#define TILE 64
#define KSLICE 16
#define THREADS 256

// One warp, one product: a lane per element of C.
template <typename T>
__device__ __forceinline__ void tiny_gemm(const distbuf_gemm_entry &e, const char *A, const char *B, char *C,
		T alpha, T beta, bool ta, bool tb, bool readC, int lane)
{
	const T zero = scalar<T>(0, 0);
	const T *__restrict__ a = (const T *)(A + e.a);
	const T *__restrict__ b = (const T *)(B + e.b);
	T *__restrict__ c = (T *)(C + e.c);
	// Strides of op(A)(i, l) and op(B)(l, j) in the stored blocks.
	const long long ai = ta ? 1 : e.lda, al = ta ? e.lda : 1;
	const long long bl = tb ? 1 : e.ldb, bj = tb ? e.ldb : 1;
	const int mn = e.m * e.n;
	for (int idx = lane; idx < mn; idx += 32) {
		const int i = idx / e.n, j = idx - i * e.n;
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

// One thread block, one product, in 64 x 64 tiles of C.
template <typename T>
__device__ __forceinline__ void tile_gemm(const distbuf_gemm_entry &e, const char *A, const char *B, char *C,
		T alpha, T beta, bool ta, bool tb, bool readC, T (*As)[TILE + 1], T (*Bs)[TILE + 1])
{
	const T zero = scalar<T>(0, 0);
	const T *__restrict__ a = (const T *)(A + e.a);
	const T *__restrict__ b = (const T *)(B + e.b);
	T *__restrict__ c = (T *)(C + e.c);
	const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
	for (int i0 = 0; i0 < e.m; i0 += TILE) {
		for (int j0 = 0; j0 < e.n; j0 += TILE) {
			T acc[4][4];
			#pragma unroll
			for (int r = 0; r < 4; r++)
				#pragma unroll
				for (int q = 0; q < 4; q++)
					acc[r][q] = zero;
			for (int l0 = 0; l0 < e.k; l0 += KSLICE) {
				// Stage op(A)(i0.., l0..) as As[l][i] and op(B)(l0.., j0..) as
				// Bs[l][j], reading along each stored block's rows.
				for (int x = tid; x < TILE * KSLICE; x += THREADS) {
					int i, l;
					if (ta) { i = x % TILE; l = x / TILE; } else { l = x % KSLICE; i = x / KSLICE; }
					const int gi = i0 + i, gl = l0 + l;
					As[l][i] = (gi < e.m && gl < e.k) ? a[ta ? (long long)gl * e.lda + gi : (long long)gi * e.lda + gl] : zero;
					int j;
					if (tb) { l = x % KSLICE; j = x / KSLICE; } else { j = x % TILE; l = x / TILE; }
					const int gj = j0 + j, gl2 = l0 + l;
					Bs[l][j] = (gj < e.n && gl2 < e.k) ? b[tb ? (long long)gj * e.ldb + gl2 : (long long)gl2 * e.ldb + gj] : zero;
				}
				__syncthreads();
				#pragma unroll
				for (int l = 0; l < KSLICE; l++) {
					T av[4], bv[4];
					#pragma unroll
					for (int r = 0; r < 4; r++) av[r] = As[l][ty + 16 * r];
					#pragma unroll
					for (int q = 0; q < 4; q++) bv[q] = Bs[l][tx + 16 * q];
					#pragma unroll
					for (int r = 0; r < 4; r++)
						#pragma unroll
						for (int q = 0; q < 4; q++)
							acc[r][q] = fmadd(av[r], bv[q], acc[r][q]);
				}
				__syncthreads();
			}
			#pragma unroll
			for (int r = 0; r < 4; r++) {
				const int i = i0 + ty + 16 * r;
				#pragma unroll
				for (int q = 0; q < 4; q++) {
					const int j = j0 + tx + 16 * q;
					if (i < e.m && j < e.n) {
						const long long idx = (long long)i * e.n + j;
						T v = fmadd(alpha, acc[r][q], zero);
						if (readC)
							v = fmadd(beta, c[idx], v);
						c[idx] = v;
					}
				}
			}
		}
	}
}

template <typename T>
__device__ __forceinline__ void small_gemm(const distbuf_gemm_entry *__restrict__ stack, int tiny, int count,
		const char *A, const char *B, char *C, double are, double aim, double bre, double bim, int flags)
{
	__shared__ T As[KSLICE][TILE + 1], Bs[KSLICE][TILE + 1];
	const T alpha = scalar<T>(are, aim), beta = scalar<T>(bre, bim);
	const bool ta = flags & 1, tb = flags & 2, readC = flags & 4;
	const int warps = THREADS / 32;
	const int tinyBlocks = (tiny + warps - 1) / warps;
	const int blocks = tinyBlocks + (count - tiny);
	// The branch depends on the block only, so a whole block takes it.
	for (int vb = blockIdx.x; vb < blocks; vb += gridDim.x) {
		if (vb < tinyBlocks) {
			const int p = vb * warps + (threadIdx.x >> 5);
			if (p < tiny)
				tiny_gemm<T>(stack[p], A, B, C, alpha, beta, ta, tb, readC, threadIdx.x & 31);
		} else {
			tile_gemm<T>(stack[tiny + vb - tinyBlocks], A, B, C, alpha, beta, ta, tb, readC, As, Bs);
		}
	}
}

#define DISTBUF_SMALL(name, T) \
extern "C" __global__ void __launch_bounds__(THREADS) name(const distbuf_gemm_entry *__restrict__ stack, int tiny, int count, \
		const char *A, const char *B, char *C, double are, double aim, double bre, double bim, int flags) \
{ small_gemm<T>(stack, tiny, count, A, B, C, are, aim, bre, bim, flags); }

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
	// smallThreads is the thread block of the small kernel (THREADS in the
	// source): eight warps, a tiny product each, or one tiled product.
	smallThreads = 256
	smallWarps   = smallThreads / 32
	// warpMax is the largest dimension of a product that takes a warp of
	// the small kernel; larger ones take a thread block.
	warpMax       = 16
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
	if hostLittleEndian && uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%8 == 0 {
		// A problem lies in memory as its stack entry but for the triple
		// index in the last word: one copy, then that word cleared.
		copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(probs))), len(probs)*stackEntryBytes))
		es := unsafe.Slice((*stackEntry)(unsafe.Pointer(unsafe.SliceData(dst))), len(probs))
		for i := range es {
			es[i].zero = 0
		}
		return
	}
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

// stackEntry is one stack entry as it lies in memory on a little-endian
// host.
type stackEntry struct {
	a, b, c                 uint64
	m, n, k, lda, ldb, zero int32
}

var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// The entry type must be exactly the stack's entry, and a problem laid out
// as one, its triple index in the entry's last word.
var _ [stackEntryBytes - unsafe.Sizeof(stackEntry{})]struct{}
var _ [unsafe.Sizeof(stackEntry{}) - stackEntryBytes]struct{}
var _ [unsafe.Sizeof(problem{}) - stackEntryBytes]struct{}
var _ [stackEntryBytes - unsafe.Sizeof(problem{})]struct{}
var _ = [1]struct{}{}[unsafe.Offsetof(problem{}.a)-unsafe.Offsetof(stackEntry{}.a)]
var _ = [1]struct{}{}[unsafe.Offsetof(problem{}.b)-unsafe.Offsetof(stackEntry{}.b)]
var _ = [1]struct{}{}[unsafe.Offsetof(problem{}.c)-unsafe.Offsetof(stackEntry{}.c)]
var _ = [1]struct{}{}[unsafe.Offsetof(problem{}.m)-unsafe.Offsetof(stackEntry{}.m)]
var _ = [1]struct{}{}[unsafe.Offsetof(problem{}.n)-unsafe.Offsetof(stackEntry{}.n)]
var _ = [1]struct{}{}[unsafe.Offsetof(problem{}.k)-unsafe.Offsetof(stackEntry{}.k)]
var _ = [1]struct{}{}[unsafe.Offsetof(problem{}.lda)-unsafe.Offsetof(stackEntry{}.lda)]
var _ = [1]struct{}{}[unsafe.Offsetof(problem{}.ldb)-unsafe.Offsetof(stackEntry{}.ldb)]
var _ = [1]struct{}{}[unsafe.Offsetof(problem{}.tripleIdx)-unsafe.Offsetof(stackEntry{}.zero)]

// kernelLauncher runs the plan's own kernels on a stream: on CUDA through
// the runtime; in tests through a host emulation of the same contract.
type kernelLauncher interface {
	// small multiplies the count products whose entries start at stack,
	// the first tiny of them a warp each: C = alpha*op(A)*op(B) (+ beta*C
	// when flagReadC) at bases + offsets.
	small(dt packing.DType, stack uintptr, tiny, count int, bases [3]uintptr, alpha, beta complex128, flags int) error
	// pointers writes out[i] = bases[0]+a_i, out[n+i] = bases[1]+b_i,
	// out[2n+i] = bases[2]+c_i for the count entries at stack.
	pointers(stack uintptr, count int, bases [3]uintptr, out uintptr) error
}

// cudaKernels launches the compiled kernels on one device and stream.
type cudaKernels struct {
	dev    *cudart.Device
	stream cudart.Stream
	k      []cudart.Kernel
}

func grid(items, perBlock int) int { return max(1, min((items+perBlock-1)/perBlock, maxGridX)) }

func (c *cudaKernels) small(dt packing.DType, stack uintptr, tiny, count int, bases [3]uintptr, alpha, beta complex128, flags int) error {
	which := map[packing.DType]int{packing.Float32: 0, packing.Float64: 1, packing.Complex64: 2, packing.Complex128: 3}[dt]
	blocks := (tiny+smallWarps-1)/smallWarps + count - tiny
	return c.dev.Launch(c.k[which], max(1, min(blocks, maxGridX)), 1, smallThreads, 0, c.stream,
		uint64(stack), uint64(tiny), uint64(count), uint64(bases[0]), uint64(bases[1]), uint64(bases[2]),
		math.Float64bits(real(alpha)), math.Float64bits(imag(alpha)), math.Float64bits(real(beta)), math.Float64bits(imag(beta)), uint64(flags))
}

func (c *cudaKernels) pointers(stack uintptr, count int, bases [3]uintptr, out uintptr) error {
	return c.dev.Launch(c.k[4], grid(count, pointerThread), 1, pointerThread, 0, c.stream,
		uint64(stack), uint64(count), uint64(bases[0]), uint64(bases[1]), uint64(bases[2]), uint64(out))
}

type deviceKernels struct {
	once sync.Once
	k    []cudart.Kernel
	err  error
}

// kernelsKey names a device of one loaded runtime: kernels loaded through
// one libcudart are not handles another knows.
type kernelsKey struct {
	rt  *cudart.Runtime
	dev int
}

var compiled sync.Map // kernelsKey -> *deviceKernels

// loadKernels compiles and loads the kernels for a device once; a failure is
// remembered, and the engine runs small launches through cuBLAS instead.
func loadKernels(dev int) (*cudart.Device, []cudart.Kernel, error) {
	rt, err := cudart.Load()
	if err != nil {
		return nil, nil, err
	}
	d := rt.Device(dev)
	v, _ := compiled.LoadOrStore(kernelsKey{rt, dev}, &deviceKernels{})
	dk := v.(*deviceKernels)
	dk.once.Do(func() {
		image, err := nvrtc.CompileFor(d, smallKernelSource, "distbuf_gemm.cu")
		if err != nil {
			dk.err = err
			return
		}
		dk.k, dk.err = d.LoadKernels(image, smallKernelNames...)
	})
	return d, dk.k, dk.err
}
