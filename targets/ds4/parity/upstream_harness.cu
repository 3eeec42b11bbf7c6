// Parity-harness hooks for calibrating against the UPSTREAM ds4 CUDA backend.
//
// Written for porter (no upstream code here): porter/calibration/libraries.py links this
// file with the user's checkout of ds4_cuda.cu into a calibration-only library
// under runs/known-good/ds4/.  It uses ds4_gpu.h's public API only.
//
// The child calls once, at start:
//   init           porter_ds4_init(): ds4_gpu_init() (the cuBLAS handle); porter's own
//                  backend defines the same hook in cuda/ds4_cuda_glue.cu.
// The child calls, before every call of a unit (targets/ds4/parity/harness.toml):
//   forget_models  porter_ds4_forget_models(): the upstream backend caches device
//                  views of the model map keyed by (host pointer, offset) --
//                  registered host ranges, Q8->F16 expanded weights, scratch --
//                  and the child hands every call a FRESH host copy of the map,
//                  which may land at the previous copy's address.  Serving the
//                  new call from the old cache would read stale weights, so the
//                  backend drops everything and starts again.
//   model_ptr      porter_ds4_model_ptr(map, size, offset, bytes): what ds4's
//                  engine does once per model, ds4_gpu_set_model_map(map, size)
//                  (the whole map registered for device access).  Without it
//                  the backend registers each weight range on its own, and two
//                  tensors sharing a host page make the second registration and
//                  its copy fallback fail.  Returns NULL: the backend reads the
//                  registered host pages themselves (zero-copy), so there is no
//                  separate device copy to compare; the child's check of the
//                  host map covers those bytes.  This is the "host" regime.
//   model_on_device porter_ds4_model_on_device(...): the "device" regime, where ds4's
//                  users run it: ds4_gpu_set_model_map with DS4_CUDA_COPY_MODEL set, the
//                  backend's own whole-model copy into one device allocation.  Returns
//                  NULL (the copy's address is the backend's private state).
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime.h>

extern "C" int ds4_gpu_init(void);
extern "C" void ds4_gpu_cleanup(void);
extern "C" int ds4_gpu_set_model_map(const void *model_map, uint64_t model_size);

extern "C" int porter_ds4_init(void) {
    return ds4_gpu_init();
}

extern "C" void porter_ds4_forget_models(void) {
    ds4_gpu_cleanup();        // synchronizes, unregisters and frees every cached model range
    (void)ds4_gpu_init();     // cuBLAS handle again, as after the child's first init
}

extern "C" const void *porter_ds4_model_ptr(const void *model_map, uint64_t model_size, uint64_t offset,
                                            uint64_t bytes) {
    (void)offset;
    (void)bytes;
    (void)ds4_gpu_set_model_map(model_map, model_size);
    return NULL;
}

extern "C" const void *porter_ds4_model_on_device(const void *model_map, uint64_t model_size, uint64_t offset,
                                                  uint64_t bytes) {
    (void)offset;
    (void)bytes;
    // the backend reads the knob on each set_model_map: set for this call only, so nothing else
    // the child runs sees it
    const char *before = getenv("DS4_CUDA_COPY_MODEL");
    (void)setenv("DS4_CUDA_COPY_MODEL", "1", 1);
    (void)ds4_gpu_set_model_map(model_map, model_size);
    if (before == NULL) (void)unsetenv("DS4_CUDA_COPY_MODEL");
    // the backend falls back to registering the map when the copy fails: then the timing below is the
    // host regime's, and the child's stderr (in the diagnostics) must say so
    void *registered = NULL;
    if (cudaHostGetDevicePointer(&registered, const_cast<void *>(model_map), 0) == cudaSuccess) {
        fprintf(stderr, "porter: the device copy of the model map failed; the backend reads it from host memory\n");
    }
    (void)cudaGetLastError();
    return NULL;
}
