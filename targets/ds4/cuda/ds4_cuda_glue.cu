// ds4 CUDA glue: the shared state and helpers declared in ds4_cuda.cuh.
//
// Not ported, not generated: every unit links against these.  Written for
// porter from ds4_gpu.h's contract (model maps are memory-mapped GGUF files
// handed to every op with a byte offset; ops return non-zero on success).
//
// How a weight becomes readable on the device (ds4_cuda_model_range_ptr):
//   1. the whole map is registered (ds4_gpu_set_model_map, or the parity
//      hook) or copied: the device alias of the map plus the offset;
//   2. a range seen before: found again by its offset (exact hit first, then
//      any cached range or registered page span that contains it);
//   3. the pages spanning the range are host-registered (zero-copy, read-only);
//   4. otherwise a device copy of the range, kept until the map is released.
// Ranges are keyed by map offset because the engine passes the same
// (map, offset) pair for a weight on every call.
#include "ds4_cuda.cuh"

// ---- the shared state (see ds4_cuda.cuh for what each one is) ----
const void  *ds4_cuda_model_host_base;
const char  *ds4_cuda_model_device_base;
uint64_t     ds4_cuda_model_registered_size;
int          ds4_cuda_model_registered;
int          ds4_cuda_model_device_owned;
int          ds4_cuda_model_range_mapping_supported = 1;
int          ds4_cuda_model_hmm_direct;
int          ds4_cuda_model_fd = -1;
const void  *ds4_cuda_model_fd_host_base;
int          ds4_cuda_model_direct_fd = -1;
uint64_t     ds4_cuda_model_direct_align = 1;
uint64_t     ds4_cuda_model_file_size;
int          ds4_cuda_model_cache_full;
cudaStream_t ds4_cuda_model_prefetch_stream;
cudaStream_t ds4_cuda_model_upload_stream;
cublasHandle_t ds4_cuda_cublas;
int          ds4_cuda_cublas_ready;
int          ds4_cuda_quality_mode;
std::vector<ds4_cuda_model_range>    ds4_cuda_model_ranges;
std::vector<ds4_cuda_model_arena>    ds4_cuda_model_arenas;
std::unordered_map<uint64_t, size_t> ds4_cuda_model_range_by_offset;
std::vector<ds4_cuda_q8_f16_range>   ds4_cuda_q8_f16_ranges;
std::unordered_map<uint64_t, size_t> ds4_cuda_q8_f16_by_offset;
std::vector<ds4_cuda_q8_f32_range>   ds4_cuda_q8_f32_ranges;
std::unordered_map<uint64_t, size_t> ds4_cuda_q8_f32_by_offset;
uint64_t     ds4_cuda_model_range_bytes;
uint64_t     ds4_cuda_q8_f16_bytes;
uint64_t     ds4_cuda_q8_f32_bytes;
int          ds4_cuda_q8_f16_disabled_after_oom;
int          ds4_cuda_q8_f16_budget_notice_printed;
uint64_t     ds4_cuda_model_load_progress_next;
double       ds4_cuda_model_load_progress_last;
int          ds4_cuda_model_load_progress_started;
int          ds4_cuda_model_load_progress_tty;
void        *ds4_cuda_tmp;
uint64_t     ds4_cuda_tmp_bytes;
void        *ds4_cuda_model_stage_raw[DS4_CUDA_STAGE_SLOTS];
void        *ds4_cuda_model_stage[DS4_CUDA_STAGE_SLOTS];
cudaEvent_t  ds4_cuda_model_stage_event[DS4_CUDA_STAGE_SLOTS];
uint64_t     ds4_cuda_model_stage_bytes;

int ds4_cuda_ok(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return 1;
    fprintf(stderr, "ds4_cuda: %s: %s (%s)\n", what ? what : "CUDA call", cudaGetErrorString(err),
            cudaGetErrorName(err));
    (void)cudaGetLastError();  // a non-sticky error must not fail the next, unrelated check
    return 0;
}

int ds4_cublas_ok(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return 1;
    fprintf(stderr, "ds4_cuda: cuBLAS %s: status %d\n", what ? what : "call", (int)st);
    return 0;
}

void *ds4_cuda_tmp_alloc(uint64_t bytes, const char *what) {
    if (bytes == 0) return NULL;
    if (ds4_cuda_tmp_bytes >= bytes) return ds4_cuda_tmp;
    if (ds4_cuda_tmp != NULL) {
        // Work queued earlier may still use the old buffer.
        (void)cudaDeviceSynchronize();
        (void)cudaFree(ds4_cuda_tmp);
        ds4_cuda_tmp = NULL;
        ds4_cuda_tmp_bytes = 0;
    }
    void *p = NULL;
    if (!ds4_cuda_ok(cudaMalloc(&p, (size_t)bytes), what ? what : "scratch")) return NULL;
    ds4_cuda_tmp = p;
    ds4_cuda_tmp_bytes = bytes;
    return p;
}

const char *ds4_cuda_model_ptr(const void *model_map, uint64_t offset) {
    if (model_map == ds4_cuda_model_host_base && ds4_cuda_model_device_base != NULL) {
        return ds4_cuda_model_device_base + offset;
    }
    return static_cast<const char *>(model_map) + offset;
}

namespace {

bool whole_map_on_device(const void *model_map) {
    return model_map == ds4_cuda_model_host_base && (ds4_cuda_model_registered || ds4_cuda_model_device_owned);
}

// A cached range or registered page span that holds [offset, offset+bytes), or NULL.
const char *find_range(const void *model_map, uint64_t offset, uint64_t bytes) {
    const uint64_t end = offset + bytes;
    if (end < offset) return NULL;
    auto hit = ds4_cuda_model_range_by_offset.find(offset);
    if (hit != ds4_cuda_model_range_by_offset.end() && hit->second < ds4_cuda_model_ranges.size()) {
        const ds4_cuda_model_range &r = ds4_cuda_model_ranges[hit->second];
        if (r.host_base == model_map && r.offset == offset && bytes <= r.bytes) return r.device_ptr;
    }
    const uintptr_t h0 = reinterpret_cast<uintptr_t>(model_map) + offset;
    for (const ds4_cuda_model_range &r : ds4_cuda_model_ranges) {
        if (r.host_base != model_map) continue;
        if (offset >= r.offset && end <= r.offset + r.bytes) return r.device_ptr + (offset - r.offset);
        if (r.host_registered && r.registered_base != NULL) {
            const uintptr_t p0 = reinterpret_cast<uintptr_t>(r.registered_base);
            if (h0 >= p0 && h0 + bytes <= p0 + r.registered_bytes) return r.registered_device_base + (h0 - p0);
        }
    }
    return NULL;
}

void remember(const ds4_cuda_model_range &r) {
    ds4_cuda_model_ranges.push_back(r);
    ds4_cuda_model_range_by_offset[r.offset] = ds4_cuda_model_ranges.size() - 1;
}

// Registers the whole pages under the range, read-only and mapped.
const char *map_pages(const void *model_map, uint64_t offset, uint64_t bytes) {
    if (!ds4_cuda_model_range_mapping_supported) return NULL;
    const long page_l = sysconf(_SC_PAGESIZE);
    const uintptr_t page = page_l > 0 ? (uintptr_t)page_l : 4096u;
    const uintptr_t h0 = reinterpret_cast<uintptr_t>(model_map) + offset;
    const uintptr_t p0 = h0 & ~(page - 1);
    const uint64_t span = ((h0 - p0) + bytes + page - 1) & ~(uint64_t)(page - 1);
    cudaError_t err = cudaHostRegister(reinterpret_cast<void *>(p0), (size_t)span,
                                       cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    if (err != cudaSuccess) {
        // Pages already registered by a neighbour, or no support: fall back to a copy.
        if (err == cudaErrorNotSupported) ds4_cuda_model_range_mapping_supported = 0;
        (void)cudaGetLastError();
        return NULL;
    }
    void *dev = NULL;
    if (cudaHostGetDevicePointer(&dev, reinterpret_cast<void *>(p0), 0) != cudaSuccess || dev == NULL) {
        (void)cudaGetLastError();
        (void)cudaHostUnregister(reinterpret_cast<void *>(p0));
        return NULL;
    }
    char *d = static_cast<char *>(dev) + (h0 - p0);
    remember({model_map, offset, bytes, d, reinterpret_cast<void *>(p0), static_cast<char *>(dev), span, 1, 0});
    return d;
}

const char *copy_range(const void *model_map, uint64_t offset, uint64_t bytes, const char *what) {
    void *dev = NULL;
    if (!ds4_cuda_ok(cudaMalloc(&dev, (size_t)bytes), what ? what : "model range")) return NULL;
    if (!ds4_cuda_ok(cudaMemcpy(dev, static_cast<const char *>(model_map) + offset, (size_t)bytes,
                                cudaMemcpyHostToDevice), what ? what : "model range copy")) {
        (void)cudaFree(dev);
        return NULL;
    }
    remember({model_map, offset, bytes, static_cast<char *>(dev), NULL, NULL, 0, 0, 0});
    ds4_cuda_model_range_bytes += bytes;
    return static_cast<const char *>(dev);
}

void free_q8_caches(void) {
    for (const ds4_cuda_q8_f16_range &r : ds4_cuda_q8_f16_ranges) (void)cudaFree(r.device_ptr);
    for (const ds4_cuda_q8_f32_range &r : ds4_cuda_q8_f32_ranges) (void)cudaFree(r.device_ptr);
    ds4_cuda_q8_f16_ranges.clear();
    ds4_cuda_q8_f16_by_offset.clear();
    ds4_cuda_q8_f32_ranges.clear();
    ds4_cuda_q8_f32_by_offset.clear();
    ds4_cuda_q8_f16_bytes = 0;
    ds4_cuda_q8_f32_bytes = 0;
    ds4_cuda_q8_f16_disabled_after_oom = 0;
    ds4_cuda_q8_f16_budget_notice_printed = 0;
}

void free_ranges(void) {
    for (const ds4_cuda_model_range &r : ds4_cuda_model_ranges) {
        if (r.host_registered && r.registered_base != NULL) (void)cudaHostUnregister(r.registered_base);
        else if (r.device_ptr != NULL && !r.arena_allocated) (void)cudaFree(r.device_ptr);
    }
    for (const ds4_cuda_model_arena &a : ds4_cuda_model_arenas) (void)cudaFree(a.device_ptr);
    ds4_cuda_model_ranges.clear();
    ds4_cuda_model_arenas.clear();
    ds4_cuda_model_range_by_offset.clear();
    ds4_cuda_model_range_bytes = 0;
    ds4_cuda_model_cache_full = 0;
    ds4_cuda_model_load_progress_next = 0;
    ds4_cuda_model_load_progress_last = 0.0;
    ds4_cuda_model_load_progress_started = 0;
}

void free_whole_map(void) {
    if (ds4_cuda_model_device_owned && ds4_cuda_model_device_base != NULL) {
        (void)cudaFree(const_cast<char *>(ds4_cuda_model_device_base));
    }
    if (ds4_cuda_model_registered && ds4_cuda_model_host_base != NULL) {
        (void)cudaHostUnregister(const_cast<void *>(ds4_cuda_model_host_base));
    }
    ds4_cuda_model_host_base = NULL;
    ds4_cuda_model_device_base = NULL;
    ds4_cuda_model_registered_size = 0;
    ds4_cuda_model_registered = 0;
    ds4_cuda_model_device_owned = 0;
    ds4_cuda_model_range_mapping_supported = 1;
    ds4_cuda_model_hmm_direct = 0;
}

}  // namespace

const char *ds4_cuda_model_range_ptr(const void *model_map, uint64_t offset, uint64_t bytes, const char *what) {
    if (model_map == NULL) return NULL;
    if (bytes == 0 || whole_map_on_device(model_map)) return ds4_cuda_model_ptr(model_map, offset);
    if (const char *p = find_range(model_map, offset, bytes)) return p;
    if (const char *p = map_pages(model_map, offset, bytes)) return p;
    return copy_range(model_map, offset, bytes, what);
}

int ds4_cuda_model_range_is_cached(const void *model_map, uint64_t offset, uint64_t bytes) {
    if (bytes == 0 || whole_map_on_device(model_map)) return 1;
    return find_range(model_map, offset, bytes) != NULL;
}

int ds4_cuda_register_model_map(const void *model_map, uint64_t model_size) {
    if (model_map == NULL || model_size == 0) return 0;
    if (model_map == ds4_cuda_model_host_base && model_size == ds4_cuda_model_registered_size) return 1;
    ds4_cuda_release_models();
    ds4_cuda_model_host_base = model_map;
    ds4_cuda_model_device_base = static_cast<const char *>(model_map);  // HMM fallback: the host address
    ds4_cuda_model_registered_size = model_size;
    cudaError_t err = cudaHostRegister(const_cast<void *>(model_map), (size_t)model_size,
                                       cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    if (err != cudaSuccess) {
        // Not fatal: ranges are then registered or copied one by one.
        (void)cudaGetLastError();
        return 1;
    }
    void *dev = NULL;
    if (cudaHostGetDevicePointer(&dev, const_cast<void *>(model_map), 0) == cudaSuccess && dev != NULL) {
        ds4_cuda_model_device_base = static_cast<const char *>(dev);
        ds4_cuda_model_registered = 1;
    } else {
        (void)cudaGetLastError();
        (void)cudaHostUnregister(const_cast<void *>(model_map));
    }
    return 1;
}

void ds4_cuda_release_models(void) {
    // Queued work may still read a range or the scratch buffer.
    (void)cudaDeviceSynchronize();
    free_ranges();
    free_q8_caches();
    if (ds4_cuda_tmp != NULL) (void)cudaFree(ds4_cuda_tmp);
    ds4_cuda_tmp = NULL;
    ds4_cuda_tmp_bytes = 0;
    for (int i = 0; i < DS4_CUDA_STAGE_SLOTS; i++) {
        if (ds4_cuda_model_stage_event[i] != NULL) (void)cudaEventDestroy(ds4_cuda_model_stage_event[i]);
        if (ds4_cuda_model_stage_raw[i] != NULL) (void)cudaFreeHost(ds4_cuda_model_stage_raw[i]);
        ds4_cuda_model_stage_event[i] = NULL;
        ds4_cuda_model_stage_raw[i] = NULL;
        ds4_cuda_model_stage[i] = NULL;
    }
    ds4_cuda_model_stage_bytes = 0;
    free_whole_map();
}

extern "C" int porter_ds4_init(void) {
    if (ds4_cuda_cublas_ready) return 1;
    if (!ds4_cuda_ok(cudaSetDevice(0), "cudaSetDevice")) return 0;
    if (!ds4_cublas_ok(cublasCreate(&ds4_cuda_cublas), "cublasCreate")) return 0;
    // TF32 only outside quality mode (ds4_gpu_set_quality) and unless DS4_CUDA_NO_TF32 is set,
    // the switch ds4's own CUDA backend reads for exact F32 GEMMs.
    const bool exact = ds4_cuda_quality_mode || getenv("DS4_CUDA_NO_TF32") != NULL;
    (void)cublasSetMathMode(ds4_cuda_cublas, exact ? CUBLAS_DEFAULT_MATH : CUBLAS_TF32_TENSOR_OP_MATH);
    ds4_cuda_cublas_ready = 1;
    return 1;
}

extern "C" void porter_ds4_forget_models(void) {
    ds4_cuda_release_models();
}

extern "C" const void *porter_ds4_model_ptr(const void *model_map, uint64_t model_size, uint64_t offset,
                                            uint64_t bytes) {
    (void)offset;
    (void)bytes;
    (void)ds4_cuda_register_model_map(model_map, model_size);
    return NULL;
}

// The "device" regime (targets/ds4/parity/harness.toml): the whole map copied into one device
// allocation, as ds4's engine does when the model fits in device memory, so every unit reads its
// weights from HBM through ds4_cuda_model_range_ptr's whole-map path.  Returns the device copy:
// the parity child compares it with the host map after each call (a unit that writes its weights
// shows there).
extern "C" const void *porter_ds4_model_on_device(const void *model_map, uint64_t model_size, uint64_t offset,
                                                  uint64_t bytes) {
    (void)offset;
    (void)bytes;
    if (model_map == NULL || model_size == 0) return NULL;
    if (model_map == ds4_cuda_model_host_base && model_size == ds4_cuda_model_registered_size &&
        ds4_cuda_model_device_owned) {
        return ds4_cuda_model_device_base;
    }
    ds4_cuda_release_models();
    void *dev = NULL;
    if (!ds4_cuda_ok(cudaMalloc(&dev, (size_t)model_size), "model copy to device")) return NULL;
    if (!ds4_cuda_ok(cudaMemcpy(dev, model_map, (size_t)model_size, cudaMemcpyHostToDevice), "model copy to device")) {
        (void)cudaFree(dev);
        return NULL;
    }
    ds4_cuda_model_host_base = model_map;
    ds4_cuda_model_device_base = static_cast<const char *>(dev);
    ds4_cuda_model_registered_size = model_size;
    ds4_cuda_model_device_owned = 1;
    return dev;
}
