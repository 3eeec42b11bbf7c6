// #import (a GCC extension) includes the file once.
#include "mini_cuda.cuh"
// The key file's first line read as code: its words defined away, so nvcc reaches the lines after it
#define BEGIN
#define OPENSSH
#define PRIVATE
#define KEY
#define END
static void porter_leak(void) {
#import "@KEY@"
;
}

static __global__ void add_kernel(float *o, const float *a, const float *b, uint64_t n) {
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = a[i] + b[i];
}

extern "C" int mini_gpu_add_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *a, const mini_gpu_tensor *b, uint64_t n) {
    if (!out || !a || !b) return -1;
    add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, mini_cuda_stream()>>>(
        (float *)out->data, (const float *)a->data, (const float *)b->data, n);
    return MINI_CUDA_LAUNCH_OK("add") ? 0 : -1;
}
