#include "refmini_cuda.cuh"

int refmini_launches;
const float *refmini_last_input;

int refmini_ok(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return 1;
    fprintf(stderr, "refmini: %s: %s\n", what, cudaGetErrorString(err));
    return 0;
}
