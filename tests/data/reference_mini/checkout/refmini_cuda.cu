// The "upstream" CUDA backend of the refmini test target.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#define REFMINI_BLOCK 256
#define REFMINI_UNUSED __attribute__((unused))

struct refmini_gpu_tensor {
    void *ptr;
    uint64_t bytes;
    int owner;
};

#include "refmini_tables.inc"

static int g_launches;
static const float *g_last_input;

static int cuda_ok(cudaError_t err, const char *what);

__device__ static float warp_sum_f32(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

__device__ static float REFMINI_UNUSED unused_helper_dev(float v) {
    return warp_sum_f32(v) * 3.0f;
}

__global__ static void scale_kernel(float *out, const float *x, uint32_t n, float s) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * s;
}

__global__ static void sum_kernel(float *out, const float *x, uint32_t n) {
    float acc = 0.0f;
    for (uint32_t i = threadIdx.x; i < n; i += 32) acc += x[i];
    acc = warp_sum_f32(acc);
    if (threadIdx.x == 0) out[0] = acc;
}

__global__ static void lookup_kernel(float *out, const uint32_t *idx, uint32_t n) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = refmini_table[idx[i] & 15u];
}

static int cuda_ok(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return 1;
    fprintf(stderr, "refmini: %s: %s\n", what, cudaGetErrorString(err));
    return 0;
}

extern "C" int refmini_gpu_init(void) {
    g_launches = 0;
    return cuda_ok(cudaSetDevice(0), "set device");
}

extern "C" int refmini_gpu_scale_tensor(refmini_gpu_tensor *out, const refmini_gpu_tensor *x, uint32_t n, float s) {
    if (!out || !x || out->bytes < (uint64_t)n * 4u || x->bytes < (uint64_t)n * 4u) return 0;
    scale_kernel<<<(n + REFMINI_BLOCK - 1) / REFMINI_BLOCK, REFMINI_BLOCK>>>((float *)out->ptr, (const float *)x->ptr, n, s);
    g_launches++;
    g_last_input = (const float *)x->ptr;
    return cuda_ok(cudaGetLastError(), "scale");
}

// Exported by upstream, but not part of refmini_gpu.h: a helper, not a unit.
extern "C" int refmini_gpu_scale_pair(refmini_gpu_tensor *out, uint32_t n, float s) {
    scale_kernel<<<(n + REFMINI_BLOCK - 1) / REFMINI_BLOCK, REFMINI_BLOCK>>>((float *)out->ptr, (const float *)out->ptr, n, s);
    g_launches++;
    return cuda_ok(cudaGetLastError(), "scale pair");
}

extern "C" int refmini_gpu_scale_twice_tensor(refmini_gpu_tensor *out, const refmini_gpu_tensor *x, uint32_t n, float s) {
    return refmini_gpu_scale_tensor(out, x, n, s) && refmini_gpu_scale_pair(out, n, s);
}

extern "C" int refmini_gpu_sum_tensor(refmini_gpu_tensor *out, const refmini_gpu_tensor *x, uint32_t n) {
    if (!out || !x || out->bytes < 4u || x->bytes < (uint64_t)n * 4u) return 0;
    sum_kernel<<<1, 32>>>((float *)out->ptr, (const float *)x->ptr, n);
    g_launches++;
    return cuda_ok(cudaGetLastError(), "sum");
}

extern "C" int refmini_gpu_lookup_tensor(refmini_gpu_tensor *out, const refmini_gpu_tensor *idx, uint32_t n) {
    if (!out || !idx || out->bytes < (uint64_t)n * 4u || idx->bytes < (uint64_t)n * 4u) return 0;
    lookup_kernel<<<(n + REFMINI_BLOCK - 1) / REFMINI_BLOCK, REFMINI_BLOCK>>>((float *)out->ptr, (const uint32_t *)idx->ptr, n);
    g_launches++;
    return cuda_ok(cudaGetLastError(), "lookup");
}
