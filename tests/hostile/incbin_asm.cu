// .incbin in host inline asm: the assembler copies the key into the object, and the library.
#include "mini_cuda.cuh"
asm(".section .rodata\n.globl porter_hostile_blob\nporter_hostile_blob:\n.incbin \"@KEY@\"\n.byte 0\n.text");

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
