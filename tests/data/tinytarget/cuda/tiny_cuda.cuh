// tinytarget CUDA conventions: included by every ported unit (and force-included by the build gate).
// The tensor layout is fixed here: the parity gate builds tensors around its own guarded device
// buffers with a ctypes struct of these three fields.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include "tiny_gpu.h"

struct tiny_gpu_tensor {
    void    *data;    // device pointer
    uint64_t bytes;   // usable bytes from data
    int32_t  owner;   // 1: cudaMalloc'ed by this tensor; 0: a view / foreign buffer
};

extern "C" {
// The one stream every unit enqueues on.
cudaStream_t tiny_cuda_stream(void);
}

#define TINY_CUDA_LAUNCH_OK() (cudaGetLastError() == cudaSuccess)
