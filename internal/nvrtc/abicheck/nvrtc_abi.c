/* Compile with: cc -I/usr/local/cuda/include -o /tmp/x nvrtc_abi.c && /tmp/x
 * It fails to compile if ../decl.h disagrees with <nvrtc.h>. */
#define DBN_ABICHECK 1
#include "../decl.h"
#include "../../dl/abicheck.h"

#if defined(nvrtcVersion) || defined(nvrtcGetErrorString) || defined(nvrtcCreateProgram) || \
    defined(nvrtcCompileProgram) || defined(nvrtcGetProgramLogSize) || defined(nvrtcGetProgramLog) || \
    defined(nvrtcGetCUBINSize) || defined(nvrtcGetCUBIN) || defined(nvrtcGetPTXSize) || defined(nvrtcGetPTX) || \
    defined(nvrtcDestroyProgram)
#error "an NVRTC function used by package nvrtc is a macro: the dlsym name would be wrong"
#endif

SAME_FN(nvrtcVersion, dbn_Version_fn);
SAME_FN(nvrtcGetErrorString, dbn_GetErrorString_fn);
SAME_FN(nvrtcCreateProgram, dbn_CreateProgram_fn);
SAME_FN(nvrtcCompileProgram, dbn_CompileProgram_fn);
SAME_FN(nvrtcGetProgramLogSize, dbn_GetSize_fn);
SAME_FN(nvrtcGetProgramLog, dbn_GetBytes_fn);
SAME_FN(nvrtcGetCUBINSize, dbn_GetSize_fn);
SAME_FN(nvrtcGetCUBIN, dbn_GetBytes_fn);
SAME_FN(nvrtcGetPTXSize, dbn_GetSize_fn);
SAME_FN(nvrtcGetPTX, dbn_GetBytes_fn);
SAME_FN(nvrtcDestroyProgram, dbn_DestroyProgram_fn);
_Static_assert(NVRTC_SUCCESS == DBN_SUCCESS, "NVRTC_SUCCESS");
_Static_assert(sizeof(nvrtcResult) == sizeof(int), "nvrtcResult is an int");

int main(void) {
	int major = 0, minor = 0;
	(void)major; (void)minor;
	printf("nvrtc: declarations match <nvrtc.h>\n");
	return 0;
}
