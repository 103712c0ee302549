// Package nvrtc compiles CUDA C++ source to a CUBIN or PTX image at run time
// through NVRTC, loaded with dlopen from DISTBUF_NVRTC, else libnvrtc.so.13,
// libnvrtc.so.12. The library is opened on first use and stays loaded. A
// program is created, compiled and destroyed inside one Compile call; the
// caller owns the returned image.
package nvrtc
