package packing

import "fmt"

// DType is the element type of a block.
type DType uint8

const (
	Float32    DType = iota + 1 // 4 bytes
	Float64                     // 8 bytes
	Complex64                   // 8 bytes: two float32, real first
	Complex128                  // 16 bytes: two float64, real first
)

// elemSizes is indexed by DType; 0 marks an unknown type.
var elemSizes = [...]int64{0, 4, 8, 8, 16}

// Size is the number of bytes of one element, 0 for an unknown type (a DType outside the four constants).
func (d DType) Size() int64 {
	if int(d) >= len(elemSizes) {
		return 0
	}
	return elemSizes[d]
}

// valid reports whether d is one of the four element types.
func (d DType) valid() bool { return d.Size() != 0 }

// IsComplex reports whether d is Complex64 or Complex128.
func (d DType) IsComplex() bool { return d == Complex64 || d == Complex128 }

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case Complex64:
		return "complex64"
	case Complex128:
		return "complex128"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}
