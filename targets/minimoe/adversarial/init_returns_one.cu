// porter adversarial mutant of mini_gpu_init: ds4's success convention (1) in a 0-on-success API
// (derived from the scripted known-good answer; must be REJECTED by the parity gate's runtime scenario)
#include "mini_cuda.cuh"

extern "C" int mini_gpu_init(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) return 0;
    if (cudaFree(0) != cudaSuccess) return 0;
    return mini_cuda_stream() != nullptr ? 1 : 0;
}
