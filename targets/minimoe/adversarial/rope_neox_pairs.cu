// porter adversarial mutant of mini_gpu_rope_tail_tensor: rotates pairs (j, j + n_rot/2) (NeoX layout) instead of adjacent pairs
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"

static __global__ void rope_tail_kernel(float *x, uint32_t n_tokens, uint32_t n_head, uint32_t head_dim,
                                        uint32_t n_rot, uint32_t pos0, float freq_base) {
    const uint32_t half_rot = n_rot / 2;
    const uint64_t total = (uint64_t)n_tokens * n_head * half_rot;
    for (uint64_t idx = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t j = (uint32_t)(idx % half_rot);
        const uint64_t th = idx / half_rot;          // token * n_head + head
        const uint32_t t = (uint32_t)(th / n_head);
        // The angle grows with the position: in float, theta ~ 1e3 already
        // carries ~1e-4 rad of rounding, so angle and rotation are in double.
        const double theta = ((double)pos0 + (double)t) * pow((double)freq_base, -2.0 * (double)j / (double)n_rot);
        double s, c;
        sincos(theta, &s, &c);
        float *p = x + th * head_dim + (head_dim - n_rot) + j;
        const double x0 = p[0], x1 = p[half_rot];
        p[0] = (float)(x0 * c - x1 * s);
        p[half_rot] = (float)(x0 * s + x1 * c);
    }
}

extern "C" int mini_gpu_rope_tail_tensor(
        mini_gpu_tensor *x,
        uint32_t         n_tokens,
        uint32_t         n_head,
        uint32_t         head_dim,
        uint32_t         n_rot,
        uint32_t         pos0,
        float            freq_base) {
    if (x == nullptr) return -1;
    if ((n_rot & 1) || n_rot > head_dim) return -1;
    if (n_tokens == 0 || n_head == 0 || n_rot == 0) return 0;
    if (x->data == nullptr) return -1;
    if (x->bytes < (uint64_t)n_tokens * n_head * head_dim * sizeof(float)) return -1;
    const uint64_t pairs = (uint64_t)n_tokens * n_head * (n_rot / 2);
    const unsigned threads = 256;
    uint64_t blocks = (pairs + threads - 1) / threads;
    if (blocks > 65535u * 16u) blocks = 65535u * 16u;  // grid-stride loop covers the rest
    rope_tail_kernel<<<(unsigned)blocks, threads, 0, mini_cuda_stream()>>>(
        (float *)x->data, n_tokens, n_head, head_dim, n_rot, pos0, freq_base);
    return MINI_CUDA_LAUNCH_OK("rope_tail_kernel") ? 0 : -1;
}
