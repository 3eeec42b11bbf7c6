// porter adversarial mutant of mini_gpu_tensor_copy: off by one in the length: copies bytes - 1
// (derived from the scripted known-good answer; must be REJECTED by the parity gate's runtime scenario)
#include "mini_cuda.cuh"

extern "C" int mini_gpu_tensor_copy(mini_gpu_tensor *dst, uint64_t dst_offset,
                                    const mini_gpu_tensor *src, uint64_t src_offset,
                                    uint64_t bytes) {
    if (dst == nullptr || src == nullptr) return -1;
    if (dst_offset > dst->bytes || bytes > dst->bytes - dst_offset) return -1;
    if (src_offset > src->bytes || bytes > src->bytes - src_offset) return -1;
    if (bytes == 0) return 0;
    if (dst->data == nullptr || src->data == nullptr) return -1;
    const uint64_t last = bytes - 1;  // "index of the last byte" used as the length
    if (last == 0) return 0;
    return mini_cuda_check(cudaMemcpyAsync((char *)dst->data + dst_offset,
                                           (const char *)src->data + src_offset, (size_t)last,
                                           cudaMemcpyDeviceToDevice, mini_cuda_stream()),
                           "mini_gpu_tensor_copy");
}
