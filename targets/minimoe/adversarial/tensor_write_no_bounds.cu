// porter adversarial mutant of mini_gpu_tensor_write: no range check against the tensor's size
// (derived from the scripted known-good answer; must be REJECTED by the parity gate's runtime scenario)
#include "mini_cuda.cuh"

extern "C" int mini_gpu_tensor_write(mini_gpu_tensor *tensor, uint64_t offset, const void *data, uint64_t bytes) {
    if (tensor == nullptr) return -1;
    if (bytes == 0) return 0;
    if (data == nullptr || tensor->data == nullptr) return -1;
    return mini_cuda_check(cudaMemcpyAsync((char *)tensor->data + offset, data, (size_t)bytes,
                                           cudaMemcpyHostToDevice, mini_cuda_stream()),
                           "mini_gpu_tensor_write");
}
