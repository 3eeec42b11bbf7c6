// porter adversarial mutant of mini_gpu_debug_checksum_tensor: answers from the statistics of the example inputs instead of the data (n/2, n/3 for uniform [0,1) values)
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"

#define CK_THREADS 1024

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __global__ void checksum_kernel(float *checksum, const float *x, uint64_t n) {
    __shared__ float part_s[32], part_q[32];
    float s = 0.0f, q = 0.0f;
    for (uint64_t i = threadIdx.x; i < n; i += CK_THREADS) {
        const float v = x[i];
        s += v;
        q += v * v;
    }
    s = warp_sum(s);
    q = warp_sum(q);
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        part_s[warp] = s;
        part_q[warp] = q;
    }
    __syncthreads();
    if (warp == 0) {
        s = part_s[lane];
        q = part_q[lane];
        s = warp_sum(s);
        q = warp_sum(q);
        if (lane == 0) {
            checksum[0] = s;
            checksum[1] = q;
        }
    }
}

extern "C" int mini_gpu_debug_checksum_tensor(
        mini_gpu_tensor       *checksum,
        const mini_gpu_tensor *x,
        uint64_t               n) {
    if (checksum == nullptr || x == nullptr) return -1;
    if (checksum->data == nullptr || checksum->bytes < 2 * sizeof(float)) return -1;
    if (n > 0 && (x->data == nullptr || x->bytes < n * sizeof(float))) return -1;
    const float guess[2] = {0.5f * (float)n, (float)n / 3.0f};
    cudaMemcpyAsync(checksum->data, guess, sizeof guess, cudaMemcpyHostToDevice, mini_cuda_stream());
    cudaStreamSynchronize(mini_cuda_stream());
    return 0;
}
