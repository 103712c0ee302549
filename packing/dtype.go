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

// dtypes is indexed by DType; a zero size marks an unknown type.
var dtypes = [...]struct {
	size int64
	name string
}{
	Float32:    {4, "float32"},
	Float64:    {8, "float64"},
	Complex64:  {8, "complex64"},
	Complex128: {16, "complex128"},
}

// Size is the number of bytes of one element, 0 for an unknown type (a DType outside the four constants).
func (d DType) Size() int64 {
	if int(d) >= len(dtypes) {
		return 0
	}
	return dtypes[d].size
}

// valid reports whether d is one of the four element types.
func (d DType) valid() bool { return d.Size() != 0 }

// IsComplex reports whether d is Complex64 or Complex128.
func (d DType) IsComplex() bool { return d == Complex64 || d == Complex128 }

func (d DType) String() string {
	if d.valid() {
		return dtypes[d].name
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}
