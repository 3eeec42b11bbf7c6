/* refmini: the API of the test backend (C, like ds4_gpu.h). */
#pragma once
#include <stdint.h>

typedef struct refmini_gpu_tensor refmini_gpu_tensor;

int refmini_gpu_init(void);
/* out[i] = x[i] * s */
int refmini_gpu_scale_tensor(refmini_gpu_tensor *out, const refmini_gpu_tensor *x, uint32_t n, float s);
/* out[i] = x[i] * s * s, through scale_tensor and the pair helper */
int refmini_gpu_scale_twice_tensor(refmini_gpu_tensor *out, const refmini_gpu_tensor *x, uint32_t n, float s);
/* out[0] = sum of x[0..n) */
int refmini_gpu_sum_tensor(refmini_gpu_tensor *out, const refmini_gpu_tensor *x, uint32_t n);
/* out[i] = table[idx[i] & 15] */
int refmini_gpu_lookup_tensor(refmini_gpu_tensor *out, const refmini_gpu_tensor *idx, uint32_t n);
