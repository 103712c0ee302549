/* Hand-written declarations of the NVRTC API subset used by package nvrtc.
 * abicheck/nvrtc_abi.c compiles them against <nvrtc.h> with DBN_ABICHECK. */
#ifndef DISTBUF_NVRTC_DECL_H
#define DISTBUF_NVRTC_DECL_H

#include <stddef.h>

#ifdef DBN_ABICHECK
#include <nvrtc.h>
typedef nvrtcResult dbn_result;
typedef nvrtcProgram dbn_program;
#else
typedef int dbn_result;
typedef struct dbn_program_st *dbn_program;
#endif

#define DBN_SUCCESS 0

typedef dbn_result (*dbn_Version_fn)(int *major, int *minor);
typedef const char *(*dbn_GetErrorString_fn)(dbn_result result);
typedef dbn_result (*dbn_CreateProgram_fn)(dbn_program *prog, const char *src, const char *name,
	int numHeaders, const char *const *headers, const char *const *includeNames);
typedef dbn_result (*dbn_CompileProgram_fn)(dbn_program prog, int numOptions, const char *const *options);
typedef dbn_result (*dbn_GetSize_fn)(dbn_program prog, size_t *size);
typedef dbn_result (*dbn_GetBytes_fn)(dbn_program prog, char *out);
typedef dbn_result (*dbn_DestroyProgram_fn)(dbn_program *prog);

#endif
