// porter adversarial mutant of mini_gpu_swiglu_tensor: silu as g * expf(g) / (1 + expf(g)): the same function until g passes 88.7, then inf / inf
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"

static __global__ void swiglu_kernel(float *out, const float *gate, const float *up, uint64_t n) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g * (expf(g) / (1.0f + expf(g))) * up[i];  // porter mutant: overflowing sigmoid
    }
}

extern "C" int mini_gpu_swiglu_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *gate,
        const mini_gpu_tensor *up,
        uint64_t               n) {
    if (out == nullptr || gate == nullptr || up == nullptr) return -1;
    if (n == 0) return 0;
    if (out->data == nullptr || gate->data == nullptr || up->data == nullptr) return -1;
    const uint64_t need = n * sizeof(float);
    if (out->bytes < need || gate->bytes < need || up->bytes < need) return -1;
    const unsigned threads = 256;
    uint64_t blocks = (n + threads - 1) / threads;
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;
    swiglu_kernel<<<(unsigned)blocks, threads, 0, mini_cuda_stream()>>>(
        (float *)out->data, (const float *)gate->data, (const float *)up->data, n);
    return MINI_CUDA_LAUNCH_OK("swiglu_kernel") ? 0 : -1;
}
