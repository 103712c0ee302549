package wire

import "math/bits"

// crcShift is the linear operator that advances a CRC-32C by n zero bytes:
// with it, the CRC of a concatenation A||B is shift(crc(A)) ^ crc(B), where
// the shift is by len(B) (the combination zlib calls crc32_combine). It
// lets a manifest whose entries are already known be checksummed by
// hashing its 64-byte header only. Column i is the image of bit i.
type crcShift [32]uint32

// castagnoliReflected is the CRC-32C polynomial in the bit order
// hash/crc32 uses.
const castagnoliReflected = 0x82F63B78

func (m *crcShift) apply(v uint32) uint32 {
	var out uint32
	for v != 0 {
		i := bits.TrailingZeros32(v)
		out ^= m[i]
		v &= v - 1
	}
	return out
}

// times returns the operator a∘b (b first, then a).
func (a *crcShift) times(b *crcShift) crcShift {
	var out crcShift
	for i := range out {
		out[i] = a.apply(b[i])
	}
	return out
}

// newCRCShift builds the operator for n zero bytes by squaring the
// operator of one zero bit.
func newCRCShift(n uint64) crcShift {
	var op crcShift // one zero bit: the register shifts right, folding in the polynomial
	op[0] = castagnoliReflected
	for i := 1; i < 32; i++ {
		op[i] = 1 << (i - 1)
	}
	op = op.times(&op) // 2 bits
	op = op.times(&op) // 4 bits
	op = op.times(&op) // 1 byte
	var acc crcShift
	for i := range acc {
		acc[i] = 1 << i
	}
	for ; n != 0; n >>= 1 {
		if n&1 != 0 {
			acc = op.times(&acc)
		}
		op = op.times(&op)
	}
	return acc
}

// crcCombine is the CRC-32C of A||B from crc(A), crc(B) and the shift by
// len(B).
func crcCombine(crcA, crcB uint32, shiftB *crcShift) uint32 { return shiftB.apply(crcA) ^ crcB }
