// Integration fault (missing synchronisation): the copy runs on a stream of
// its own, created non-blocking, so it is not ordered after the kernels
// already queued on mini_cuda_stream() that produce its source.  In the engine
// the KV-cache and snapshot copies then race with rope and the layer's ops.
// The e2e prefill could not see it reliably (an idle H100 passed 8 of 8
// prefills once, 1 of 2 another time); the tensor_copy scenario holds the unit
// stream busy while it copies, so the race is certain there.
#include "mini_cuda.cuh"

extern "C" int mini_gpu_tensor_copy(mini_gpu_tensor *dst, uint64_t dst_offset,
                                    const mini_gpu_tensor *src, uint64_t src_offset,
                                    uint64_t bytes) {
    static cudaStream_t own = nullptr;
    if (dst == nullptr || src == nullptr) return -1;
    if (dst_offset > dst->bytes || bytes > dst->bytes - dst_offset) return -1;
    if (src_offset > src->bytes || bytes > src->bytes - src_offset) return -1;
    if (bytes == 0) return 0;
    if (own == nullptr && mini_cuda_check(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), "own stream") != 0) {
        return -1;
    }
    return mini_cuda_check(cudaMemcpyAsync((char *)dst->data + dst_offset, (const char *)src->data + src_offset,
                                           (size_t)bytes, cudaMemcpyDeviceToDevice, own),
                           "mini_gpu_tensor_copy");
}
