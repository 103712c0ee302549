/* What the loaders' ABI checks share (internal/<pkg>/abicheck/*.c, run by
 * scripts/check-cuda-abi.sh on a machine with the real headers): a
 * prototype of decl.h that is not the header's is a compile error.
 * Include it after decl.h and the library's own header. */
#pragma GCC diagnostic error "-Wincompatible-pointer-types"
#include <stdio.h>

/* SAME_FN fails the build when fn's type is not decl.h's type. */
#define SAME_FN(fn, type) _Static_assert(__builtin_types_compatible_p(__typeof__(&fn), type), #fn " prototype differs from decl.h")
