// porter adversarial mutant of mini_gpu_tensor_alloc: cudaMalloc's result is never checked
// (derived from the scripted known-good answer; must be REJECTED by the parity gate's runtime scenario)
#include "mini_cuda.cuh"

#include <stdlib.h>

extern "C" mini_gpu_tensor *mini_gpu_tensor_alloc(uint64_t bytes) {
    mini_gpu_tensor *t = (mini_gpu_tensor *)calloc(1, sizeof(mini_gpu_tensor));
    if (t == nullptr) return nullptr;
    void *data = nullptr;
    if (bytes > 0) {
        (void)cudaMalloc(&data, (size_t)bytes);
        (void)cudaGetLastError();
        if (data != nullptr) cudaMemsetAsync(data, 0, (size_t)bytes, mini_cuda_stream());
    }
    t->data = data;
    t->bytes = bytes;
    t->owner = 1;
    return t;
}
