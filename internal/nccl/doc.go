// Package nccl loads NCCL (libnccl.so.2) at run time, for GPU-to-GPU
// transfers between ranks of one node that bypass host staging. It declares
// by hand the few functions it uses (decl.h, checked against nccl.h by
// abicheck/nccl_abi.c). A Comm is bootstrapped through MPI by the caller:
// rank 0's UniqueID is broadcast, then every rank calls NewComm. The Comm
// owns its NCCL communicator until Close; sends and receives are ordered on
// a CUDA stream the caller owns. Every call that needs a device sets it
// first through internal/cudart's device setter (Runtime.SetDeviceFunc).
package nccl
