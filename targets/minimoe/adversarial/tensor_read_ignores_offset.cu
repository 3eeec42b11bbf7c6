// porter adversarial mutant of mini_gpu_tensor_read: the offset is bounds-checked but never added to the source address
// (derived from the scripted known-good answer; must be REJECTED by the parity gate's runtime scenario)
#include "mini_cuda.cuh"

extern "C" int mini_gpu_tensor_read(const mini_gpu_tensor *tensor, uint64_t offset, void *data, uint64_t bytes) {
    if (tensor == nullptr) return -1;
    if (offset > tensor->bytes || bytes > tensor->bytes - offset) return -1;
    if (bytes == 0) return 0;
    if (data == nullptr || tensor->data == nullptr) return -1;
    cudaStream_t s = mini_cuda_stream();
    if (mini_cuda_check(cudaMemcpyAsync(data, tensor->data, (size_t)bytes,
                                        cudaMemcpyDeviceToHost, s), "mini_gpu_tensor_read") != 0) return -1;
    return mini_cuda_check(cudaStreamSynchronize(s), "mini_gpu_tensor_read sync");
}
