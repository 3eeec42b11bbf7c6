// porter adversarial mutant of mini_gpu_synchronize: checks for errors but never waits for the stream
// (derived from the scripted known-good answer; must be REJECTED by the parity gate's runtime scenario)
#include "mini_cuda.cuh"

extern "C" int mini_gpu_synchronize(void) {
    (void)mini_cuda_stream();
    return mini_cuda_check(cudaGetLastError(), "mini_gpu_synchronize");
}
