/* A stand-in for the NVRTC subset that internal/nvrtc binds: it "compiles"
 * any source containing __global__ into a fake image that the fake
 * libcudart (fakecudart.c) loads: "\x7fELFFAKE <arch>\n" followed by the
 * source, whose kernel names the runtime then finds. A source without
 * __global__ fails with a log naming the program. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char *src, *name, *log, *out; size_t outlen; int compiled, cubin; } prog_t;

int nvrtcVersion(int *major, int *minor) { *major = 13; *minor = 0; return 0; }
const char *nvrtcGetErrorString(int r) { return r == 6 ? "NVRTC_ERROR_COMPILATION (fake)" : "NVRTC error (fake)"; }

int nvrtcCreateProgram(prog_t **p, const char *src, const char *name, int nh, const char *const *h, const char *const *in) {
	(void)h; (void)in;
	if (!p || !src || nh != 0) return 3;
	*p = calloc(1, sizeof(prog_t));
	(*p)->src = strdup(src);
	(*p)->name = strdup(name ? name : "default_program");
	return 0;
}

int nvrtcCompileProgram(prog_t *p, int n, const char *const *opts) {
	const char *arch = NULL;
	for (int i = 0; i < n; i++)
		if (strncmp(opts[i], "--gpu-architecture=", 19) == 0) arch = opts[i] + 19;
	if (!arch) return 3;
	if (!strstr(p->src, "__global__")) {
		size_t len = strlen(p->name) + 64;
		p->log = malloc(len);
		snprintf(p->log, len, "%s(1): error: this declaration has no storage class or type specifier", p->name);
		return 6;
	}
	p->compiled = 1;
	p->cubin = strncmp(arch, "sm_", 3) == 0;
	size_t len = strlen(p->src) + strlen(arch) + 128;
	p->out = malloc(len);
	if (!p->out) return 1; /* NVRTC_ERROR_OUT_OF_MEMORY */
	if (p->cubin) snprintf(p->out, len, "\x7f" "ELFFAKE %s\n%s", arch, p->src);
	else {
		/* PTX names its first kernel as ptxas would see it. */
		const char *fn = strstr(p->src, "void ");
		char name[64] = "kernel";
		if (fn) sscanf(fn + 5, "%63[A-Za-z0-9_]", name);
		snprintf(p->out, len, "// fake PTX for %s\n.entry %s\n", arch, name);
	}
	p->outlen = strlen(p->out) + 1;
	return 0;
}

int nvrtcGetProgramLogSize(prog_t *p, size_t *n) { *n = p->log ? strlen(p->log) + 1 : 1; return 0; }
int nvrtcGetProgramLog(prog_t *p, char *out) { strcpy(out, p->log ? p->log : ""); return 0; }
int nvrtcGetCUBINSize(prog_t *p, size_t *n) { *n = p->compiled && p->cubin ? p->outlen : 0; return 0; }
int nvrtcGetCUBIN(prog_t *p, char *out) { if (!p->cubin) return 3; memcpy(out, p->out, p->outlen); return 0; }
int nvrtcGetPTXSize(prog_t *p, size_t *n) { *n = p->compiled && !p->cubin ? p->outlen : 0; return 0; }
int nvrtcGetPTX(prog_t *p, char *out) { if (p->cubin) return 3; memcpy(out, p->out, p->outlen); return 0; }
int nvrtcDestroyProgram(prog_t **p) {
	if (!p || !*p) return 3;
	free((*p)->src); free((*p)->name); free((*p)->log); free((*p)->out); free(*p);
	*p = NULL;
	return 0;
}
