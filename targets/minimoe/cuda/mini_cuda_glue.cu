// minimoe CUDA glue: the four target-owned helpers declared in mini_cuda.cuh.
//
// Not ported, not generated: every ported unit links against these.  They
// hold the only process-wide CUDA state of the backend:
//   - the one stream all units enqueue on (created on first use), and
//   - the device copies of host model maps, uploaded whole, once per
//     (model_map, model_size), so a weight is read on the device at the same
//     byte offset the engine passes for the memory-mapped GGUF.
#include "mini_cuda.cuh"

#include <mutex>
#include <stdio.h>
#include <vector>

namespace {

std::mutex g_lock;
cudaStream_t g_stream = nullptr;
bool g_stream_ready = false;

struct ModelCopy {
    const void *host;   // the host map the engine passed
    uint64_t    size;   // its size in bytes
    void       *dev;    // cudaMalloc'ed copy of all `size` bytes
};
std::vector<ModelCopy> g_models;

}  // namespace

extern "C" int mini_cuda_check(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return 0;
    fprintf(stderr, "mini_cuda: %s: %s (%s)\n", what ? what : "CUDA call",
            cudaGetErrorString(err), cudaGetErrorName(err));
    return -1;
}

extern "C" cudaStream_t mini_cuda_stream(void) {
    std::lock_guard<std::mutex> hold(g_lock);
    if (!g_stream_ready) {
        // A blocking stream (not cudaStreamNonBlocking): work a caller puts on
        // the legacy default stream (e.g. a plain cudaMemcpy in a test
        // harness) still orders against the units' work.
        cudaStream_t s = nullptr;
        if (mini_cuda_check(cudaStreamCreate(&s), "cudaStreamCreate") != 0) {
            return nullptr;  // legacy default stream; the next call retries
        }
        g_stream = s;
        g_stream_ready = true;
    }
    return g_stream;
}

extern "C" const void *mini_cuda_model_ptr(const void *model_map, uint64_t model_size,
                                           uint64_t offset, uint64_t bytes) {
    if (model_map == nullptr || model_size == 0) return nullptr;
    if (offset > model_size || bytes > model_size - offset) return nullptr;  // overflow-safe

    std::lock_guard<std::mutex> hold(g_lock);
    for (const ModelCopy &m : g_models) {
        if (m.host == model_map && m.size == model_size) {
            return static_cast<const char *>(m.dev) + offset;
        }
    }
    void *dev = nullptr;
    if (mini_cuda_check(cudaMalloc(&dev, model_size), "cudaMalloc(model map)") != 0) {
        return nullptr;
    }
    // Synchronous copy: the cached copy is complete before any unit can use it.
    if (mini_cuda_check(cudaMemcpy(dev, model_map, model_size, cudaMemcpyHostToDevice),
                        "cudaMemcpy(model map)") != 0) {
        cudaFree(dev);
        return nullptr;
    }
    g_models.push_back(ModelCopy{model_map, model_size, dev});
    return static_cast<const char *>(dev) + offset;
}

extern "C" void mini_cuda_forget_models(void) {
    std::lock_guard<std::mutex> hold(g_lock);
    if (g_models.empty()) return;
    // Work already queued may still read a copy: drain before freeing.
    if (g_stream_ready) mini_cuda_check(cudaStreamSynchronize(g_stream), "forget_models sync");
    for (const ModelCopy &m : g_models) {
        mini_cuda_check(cudaFree(m.dev), "cudaFree(model map)");
    }
    g_models.clear();
}
