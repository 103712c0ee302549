/* Hand-written declarations of the parts of NCCL distbuf uses (nccl.h,
 * NCCL 2.x). internal/nccl/abicheck/nccl_abi.c checks them against the
 * real header. */
#ifndef DISTBUF_NCCL_DECL_H
#define DISTBUF_NCCL_DECL_H
#include <stddef.h>

#define DBN_UNIQUE_ID_BYTES 128
typedef struct { char internal[DBN_UNIQUE_ID_BYTES]; } dbn_unique_id;
typedef void *dbn_comm;
typedef void *dbn_stream;
typedef int dbn_result; /* ncclResult_t: ncclSuccess = 0 */

#define DBN_SUCCESS 0
#define DBN_UINT8 1 /* ncclUint8 */

typedef dbn_result (*dbn_GetVersion_fn)(int *version);
typedef dbn_result (*dbn_GetUniqueId_fn)(dbn_unique_id *id);
typedef dbn_result (*dbn_CommInitRank_fn)(dbn_comm *comm, int nranks, dbn_unique_id id, int rank);
typedef dbn_result (*dbn_CommDestroy_fn)(dbn_comm comm);
typedef dbn_result (*dbn_GroupStart_fn)(void);
typedef dbn_result (*dbn_GroupEnd_fn)(void);
typedef dbn_result (*dbn_Send_fn)(const void *buf, size_t count, int datatype, int peer, dbn_comm comm, dbn_stream stream);
typedef dbn_result (*dbn_Recv_fn)(void *buf, size_t count, int datatype, int peer, dbn_comm comm, dbn_stream stream);
typedef const char *(*dbn_GetErrorString_fn)(dbn_result result);
#endif
