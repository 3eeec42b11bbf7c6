// minimoe CUDA conventions: included by every ported unit (the build gate also
// force-includes it, so a unit whose signature differs from mini_gpu.h fails
// to compile as a conflicting extern "C" declaration).
//
// These are target-owned, not ported: the layout of mini_gpu_tensor is fixed
// here because the parity gate builds tensors around its own device buffers
// (ctypes struct with the same three fields) to fence them with guard bytes.
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "mini_gpu.h"

struct mini_gpu_tensor {
    void    *data;    // device pointer (already offset for views)
    uint64_t bytes;   // usable bytes from data
    int32_t  owner;   // 1: data was cudaMalloc'ed by this tensor; 0: a view / foreign buffer
};

extern "C" {
// The one stream every unit enqueues on, so that the API's ordering promise
// (read/write/synchronize order after all earlier ops) holds.
cudaStream_t mini_cuda_stream(void);

// Device address of bytes [offset, offset+bytes) of the host model map.  The
// whole map is uploaded once per (model_map, model_size) and cached; returns
// NULL when the range is outside the map or the upload fails.
const void *mini_cuda_model_ptr(const void *model_map, uint64_t model_size,
                                uint64_t offset, uint64_t bytes);

// Drops cached device copies of model maps (the parity gate calls this between
// runs so that a fresh host buffer at a reused address is uploaded again).
void mini_cuda_forget_models(void);

// Records a CUDA error from a unit; returns 0 when err == cudaSuccess, else -1.
int mini_cuda_check(cudaError_t err, const char *what);
}

// Launch-error check for the end of a unit: non-zero when the launch failed.
#define MINI_CUDA_LAUNCH_OK(what) (mini_cuda_check(cudaGetLastError(), (what)) == 0)
