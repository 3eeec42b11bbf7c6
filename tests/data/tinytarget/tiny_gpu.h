#ifndef TINY_GPU_H
#define TINY_GPU_H

/* tinytarget backend API: two float32 ops on backend-owned tensors.
 * Return 0 on success, non-zero on failure (a tensor too small for n values). */

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tiny_gpu_tensor tiny_gpu_tensor;

/* out[i] = x[i] * s, for i < n. */
int tiny_gpu_scale_tensor(
        tiny_gpu_tensor       *out,
        const tiny_gpu_tensor *x,
        float                  s,
        uint64_t               n);

/* out[i] = a[i] + b[i], for i < n; out may be a. */
int tiny_gpu_add_tensor(
        tiny_gpu_tensor       *out,
        const tiny_gpu_tensor *a,
        const tiny_gpu_tensor *b,
        uint64_t               n);

#ifdef __cplusplus
}
#endif

#endif
