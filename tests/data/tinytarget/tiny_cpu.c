/* tiny_cpu.c: tinytarget's CPU backend (the reference path of the engine). */
#include <stddef.h>

#include "tiny_gpu.h"

struct tiny_gpu_tensor {
    float   *data;
    uint64_t bytes;
    int32_t  owner;
};

static int holds(const tiny_gpu_tensor *t, uint64_t n) {
    return t != NULL && t->bytes >= n * sizeof(float);
}

int tiny_gpu_scale_tensor(tiny_gpu_tensor *out, const tiny_gpu_tensor *x, float s, uint64_t n) {
    if (!holds(out, n) || !holds(x, n)) return 1;
    for (uint64_t i = 0; i < n; i++) out->data[i] = x->data[i] * s;
    return 0;
}

int tiny_gpu_add_tensor(tiny_gpu_tensor *out, const tiny_gpu_tensor *a, const tiny_gpu_tensor *b, uint64_t n) {
    if (!holds(out, n) || !holds(a, n) || !holds(b, n)) return 1;
    for (uint64_t i = 0; i < n; i++) out->data[i] = a->data[i] + b->data[i];
    return 0;
}
