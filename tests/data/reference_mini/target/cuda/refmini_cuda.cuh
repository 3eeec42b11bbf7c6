// refmini conventions (test target): the tensor struct and the shared state.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
extern "C" {
#include "refmini_gpu.h"
}

struct refmini_gpu_tensor {
    void *ptr;
    uint64_t bytes;
    int owner;
};

extern int refmini_launches;            // kernels launched by all units together
extern const float *refmini_last_input;
int refmini_ok(cudaError_t err, const char *what);
