package devalloc

// ForceCUDAPoolOff makes the CUDA backend open in its cudaMalloc fallback
// (as with pool:off, which the conformance harness cannot pass) until the
// returned function is called.
func ForceCUDAPoolOff() (restore func()) {
	old := cudaTestPoolOff
	cudaTestPoolOff = true
	return func() { cudaTestPoolOff = old }
}

// DriverCalls lets the external tests count driver calls per operation.
var DriverCalls = driverCalls
