// porter adversarial mutant of mini_gpu_tensor_free: frees the host handle only: owned device memory leaks
// (derived from the scripted known-good answer; must be REJECTED by the parity gate's runtime scenario)
#include "mini_cuda.cuh"

#include <stdlib.h>

extern "C" void mini_gpu_tensor_free(mini_gpu_tensor *tensor) {
    if (tensor == nullptr) return;
    free(tensor);
}
