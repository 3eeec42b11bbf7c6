// porter adversarial mutant of mini_gpu_tensor_free: ignores the owner flag: a view's data is cudaFree'd as if it owned it
// (derived from the scripted known-good answer; must be REJECTED by the parity gate's runtime scenario)
#include "mini_cuda.cuh"

#include <stdlib.h>

extern "C" void mini_gpu_tensor_free(mini_gpu_tensor *tensor) {
    if (tensor == nullptr) return;
    if (tensor->data != nullptr) {
        mini_cuda_check(cudaFree(tensor->data), "mini_gpu_tensor_free cudaFree");
    }
    free(tensor);
}
