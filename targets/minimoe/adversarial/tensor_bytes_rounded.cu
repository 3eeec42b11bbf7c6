// porter adversarial mutant of mini_gpu_tensor_bytes: returns the size rounded up to a multiple of 4
// (derived from the scripted known-good answer; must be REJECTED by the parity gate's runtime scenario)
#include "mini_cuda.cuh"

extern "C" uint64_t mini_gpu_tensor_bytes(const mini_gpu_tensor *tensor) {
    return tensor ? (tensor->bytes + 3) & ~(uint64_t)3 : 0;
}
