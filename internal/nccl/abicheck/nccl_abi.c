/* Compile with: cc -I<dir of nccl.h> -I/usr/local/cuda/include nccl_abi.c
 * It fails to compile if a declaration in ../decl.h disagrees with nccl.h.
 * ABICHECK_NEEDS: nccl.h (scripts/check-cuda-abi.sh skips it, saying so,
 * where NCCL's header is not installed) */
#include "../decl.h"
#include <nccl.h>
#include "../../dl/abicheck.h"

#define SAME_VAL(a, b) _Static_assert((a) == (b), #a " differs from decl.h")

SAME_VAL(sizeof(ncclUniqueId), sizeof(dbn_unique_id));
SAME_VAL(NCCL_UNIQUE_ID_BYTES, DBN_UNIQUE_ID_BYTES);
SAME_VAL(ncclSuccess, DBN_SUCCESS);
SAME_VAL(ncclUint8, DBN_UINT8);
SAME_VAL(sizeof(ncclComm_t), sizeof(dbn_comm));
SAME_VAL(sizeof(ncclResult_t), sizeof(dbn_result));
SAME_VAL(sizeof(ncclDataType_t), sizeof(int));

/* Prototypes: the function types differ only in the named handle types,
 * so compare them with NCCL's own types substituted. */
typedef ncclResult_t (*ref_Send_fn)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*ref_Recv_fn)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*ref_CommInitRank_fn)(ncclComm_t *, int, ncclUniqueId, int);
SAME_FN(ncclSend, ref_Send_fn);
SAME_FN(ncclRecv, ref_Recv_fn);
SAME_FN(ncclCommInitRank, ref_CommInitRank_fn);
SAME_FN(ncclGetUniqueId, ncclResult_t (*)(ncclUniqueId *));
SAME_FN(ncclCommDestroy, ncclResult_t (*)(ncclComm_t));
SAME_FN(ncclGroupStart, ncclResult_t (*)(void));
SAME_FN(ncclGroupEnd, ncclResult_t (*)(void));
SAME_FN(ncclGetVersion, ncclResult_t (*)(int *));
SAME_FN(ncclGetErrorString, const char *(*)(ncclResult_t));

int main(void) {
	printf("nccl: declarations match <nccl.h> (NCCL %d.%d.%d)\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
	return 0;
}
