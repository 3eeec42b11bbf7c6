// porter adversarial mutant of mini_gpu_tensor_view: range-checked, but the data pointer is not advanced by the offset
// (derived from the scripted known-good answer; must be REJECTED by the parity gate's runtime scenario)
#include "mini_cuda.cuh"

#include <stdlib.h>

extern "C" mini_gpu_tensor *mini_gpu_tensor_view(const mini_gpu_tensor *base, uint64_t offset, uint64_t bytes) {
    if (base == nullptr) return nullptr;
    if (offset > base->bytes || bytes > base->bytes - offset) return nullptr;
    mini_gpu_tensor *t = (mini_gpu_tensor *)calloc(1, sizeof(mini_gpu_tensor));
    if (t == nullptr) return nullptr;
    t->data = base->data;
    t->bytes = bytes;
    t->owner = 0;
    return t;
}
