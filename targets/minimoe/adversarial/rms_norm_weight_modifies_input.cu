// porter adversarial mutant of mini_gpu_rms_norm_weight_rows_tensor: normalises x in place and then copies it: the const input is modified
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"

#define RMSW_WARPS_PER_BLOCK 4

static __device__ __forceinline__ float load_f32_bytes(const uint8_t *p) {
    return __uint_as_float((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __global__ void rms_norm_weight_kernel(float *out, const float *x, const uint8_t *__restrict__ w,
                                              bool w_aligned, uint32_t n, uint32_t n_rows, float eps) {
    const uint32_t lane = threadIdx.x & 31;
    const uint64_t row = (uint64_t)blockIdx.x * RMSW_WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= n_rows) return;
    const float *xr = x + row * n;
    float *yr = out + row * n;
    float ss = 0.0f;
    for (uint32_t i = lane; i < n; i += 32) {
        const float v = xr[i];
        ss += v * v;
    }
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (uint32_t i = lane; i < n; i += 32) {
        const float wi = w_aligned ? ((const float *)w)[i] : load_f32_bytes(w + 4 * (uint64_t)i);
        const float v = xr[i] * inv;
        ((float *)xr)[i] = v;  // reuse x as scratch
        yr[i] = v * wi;
    }
}

extern "C" int mini_gpu_rms_norm_weight_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *x,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint32_t               n,
        uint32_t               n_rows,
        float                  eps) {
    if (out == nullptr || x == nullptr || n == 0) return -1;
    const uint64_t need = (uint64_t)n * n_rows * sizeof(float);
    if (out->bytes < need || x->bytes < need) return -1;
    const uint8_t *w = (const uint8_t *)mini_cuda_model_ptr(model_map, model_size, weight_offset,
                                                            (uint64_t)n * sizeof(float));
    if (w == nullptr) return -1;
    if (n_rows == 0) return 0;
    if (out->data == nullptr || x->data == nullptr) return -1;
    const unsigned blocks = (n_rows + RMSW_WARPS_PER_BLOCK - 1) / RMSW_WARPS_PER_BLOCK;
    rms_norm_weight_kernel<<<blocks, 32 * RMSW_WARPS_PER_BLOCK, 0, mini_cuda_stream()>>>(
        (float *)out->data, (const float *)x->data, w, ((uintptr_t)w & 3) == 0, n, n_rows, eps);
    return MINI_CUDA_LAUNCH_OK("rms_norm_weight_kernel") ? 0 : -1;
}
