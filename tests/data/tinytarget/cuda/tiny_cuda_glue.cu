// tinytarget CUDA glue: the stream declared in tiny_cuda.cuh (target-owned, never ported).
#include "tiny_cuda.cuh"

#include <mutex>

extern "C" cudaStream_t tiny_cuda_stream(void) {
    static std::once_flag once;
    static cudaStream_t stream = nullptr;
    std::call_once(once, [] { cudaStreamCreate(&stream); });
    return stream;
}
