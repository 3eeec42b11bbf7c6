// porter adversarial mutant of mini_gpu_rms_norm_plain_rows_tensor: 1 / sqrtf(mean square) without eps: right wherever the mean square dwarfs eps, wrong on rows near zero and NaN on a zero row
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"

#define RMS_WARPS_PER_BLOCK 4

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __global__ void rms_norm_plain_kernel(float *out, const float *x,
                                             uint32_t n, uint32_t n_rows, float eps) {
    const uint32_t lane = threadIdx.x & 31;
    const uint64_t row = (uint64_t)blockIdx.x * RMS_WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= n_rows) return;
    const float *xr = x + row * n;
    float *yr = out + row * n;
    float ss = 0.0f;
    for (uint32_t i = lane; i < n; i += 32) {
        const float v = xr[i];
        ss += v * v;
    }
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)n); (void)eps;  // porter mutant: eps dropped
    for (uint32_t i = lane; i < n; i += 32) yr[i] = xr[i] * inv;
}

extern "C" int mini_gpu_rms_norm_plain_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *x,
        uint32_t               n,
        uint32_t               n_rows,
        float                  eps) {
    if (out == nullptr || x == nullptr || n == 0) return -1;
    const uint64_t need = (uint64_t)n * n_rows * sizeof(float);
    if (out->bytes < need || x->bytes < need) return -1;
    if (n_rows == 0) return 0;
    if (out->data == nullptr || x->data == nullptr) return -1;
    const unsigned blocks = (n_rows + RMS_WARPS_PER_BLOCK - 1) / RMS_WARPS_PER_BLOCK;
    rms_norm_plain_kernel<<<blocks, 32 * RMS_WARPS_PER_BLOCK, 0, mini_cuda_stream()>>>(
        (float *)out->data, (const float *)x->data, n, n_rows, eps);
    return MINI_CUDA_LAUNCH_OK("rms_norm_plain_kernel") ? 0 : -1;
}
