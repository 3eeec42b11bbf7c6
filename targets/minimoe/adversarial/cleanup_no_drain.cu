// porter adversarial mutant of mini_gpu_cleanup: forgets the model copies without draining the stream first
// (derived from the scripted known-good answer; must be REJECTED by the parity gate's runtime scenario)
#include "mini_cuda.cuh"

extern "C" void mini_gpu_cleanup(void) {
    mini_cuda_forget_models();
}
