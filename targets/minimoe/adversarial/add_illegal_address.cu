// porter adversarial mutant of mini_gpu_add_tensor: the kernel writes through a wild pointer (illegal address on the device)
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"

static __global__ void add_kernel(float *out, const float *a, const float *b, uint64_t n) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        out[i] = a[i] + b[i];
        if (i == 0) out[(uint64_t)1 << 40] = 0.0f;
    }
}

extern "C" int mini_gpu_add_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *a,
        const mini_gpu_tensor *b,
        uint64_t               n) {
    if (out == nullptr || a == nullptr || b == nullptr) return -1;
    if (n == 0) return 0;
    if (out->data == nullptr || a->data == nullptr || b->data == nullptr) return -1;
    const uint64_t need = n * sizeof(float);
    if (out->bytes < need || a->bytes < need || b->bytes < need) return -1;
    const unsigned threads = 256;
    uint64_t blocks = (n + threads - 1) / threads;
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;
    add_kernel<<<(unsigned)blocks, threads, 0, mini_cuda_stream()>>>(
        (float *)out->data, (const float *)a->data, (const float *)b->data, n);
    return MINI_CUDA_LAUNCH_OK("add_kernel") ? 0 : -1;
}
