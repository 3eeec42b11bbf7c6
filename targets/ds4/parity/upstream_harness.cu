// Parity-harness hooks for calibrating against the UPSTREAM ds4 CUDA backend.
//
// Written for porter (no upstream code here): porter/known_good.py links this
// file with the user's checkout of ds4_cuda.cu into a calibration-only library
// under runs/known-good/ds4/.  It uses ds4_gpu.h's public API only.
//
// Why it exists: the upstream backend caches device views of the model map
// keyed by (host pointer, offset) -- registered host ranges, Q8->F16 expanded
// weights, a scratch buffer -- and the parity child hands every call a FRESH
// host copy of the map, which may land at the address of the previous one.
// Serving the new call from the old cache would read stale weights, so before
// every call the harness drops everything the backend holds
// (targets/ds4/parity/harness.toml: forget_models) and starts it again.
#include <stdint.h>

extern "C" int ds4_gpu_init(void);
extern "C" void ds4_gpu_cleanup(void);

extern "C" void porter_ds4_forget_models(void) {
    ds4_gpu_cleanup();        // synchronizes, unregisters and frees every cached model range
    (void)ds4_gpu_init();     // cuBLAS handle again, as after the child's first init
}
