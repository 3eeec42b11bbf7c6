/* engine.c: tinytarget's engine.  Prefill scales the residual and adds it back; decode adds. */
#include "tiny_gpu.h"

int tiny_engine_prefill(tiny_gpu_tensor *x, tiny_gpu_tensor *tmp, uint64_t n) {
    if (tiny_gpu_scale_tensor(tmp, x, 0.5f, n) != 0) return 1;
    return tiny_gpu_add_tensor(x, x, tmp, n);
}

int tiny_engine_decode(tiny_gpu_tensor *x, tiny_gpu_tensor *delta, uint64_t n) {
    return tiny_gpu_add_tensor(x, x, delta, n);
}
