// porter adversarial mutant of mini_gpu_matmul_q8_0_tensor: does the work on the first two calls in the same buffers and skips it on every later call (timing)
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"

#define Q8_WARPS 4      // output rows per block (one warp each)
#define Q8_TOK_TILE 8   // tokens per warp
#define Q8_BLOCK_BYTES 34

static __device__ __forceinline__ float load_f16_bytes(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __global__ void matmul_q8_0_kernel(float *__restrict__ out, const uint8_t *__restrict__ w,
                                          const float *__restrict__ x,
                                          uint64_t in_dim, uint64_t out_dim, uint64_t n_tok) {
    const uint32_t lane = threadIdx.x & 31;
    const uint64_t o = (uint64_t)blockIdx.x * Q8_WARPS + (threadIdx.x >> 5);
    if (o >= out_dim) return;
    const uint64_t t0 = (uint64_t)blockIdx.y * Q8_TOK_TILE;
    const uint64_t rem = n_tok - t0;
    const int nt = rem < Q8_TOK_TILE ? (int)rem : Q8_TOK_TILE;

    const uint64_t n_blocks = in_dim / 32;
    const uint8_t *row = w + o * n_blocks * Q8_BLOCK_BYTES;
    float acc[Q8_TOK_TILE];
#pragma unroll
    for (int t = 0; t < Q8_TOK_TILE; ++t) acc[t] = 0.0f;

    // chunk c = 8 consecutive weights: block c/4, quarter c%4
    for (uint64_t c = lane; c < n_blocks * 4; c += 32) {
        const uint8_t *blk = row + (c >> 2) * Q8_BLOCK_BYTES;
        const float d = load_f16_bytes(blk);
        const int8_t *q = (const int8_t *)(blk + 2 + (c & 3) * 8);
        float wv[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) wv[j] = d * (float)q[j];
        const float *xp = x + t0 * in_dim + c * 8;
#pragma unroll
        for (int t = 0; t < Q8_TOK_TILE; ++t) {
            if (t < nt) {
                const float *xt = xp + (uint64_t)t * in_dim;
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) s += wv[j] * xt[j];
                acc[t] += s;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < Q8_TOK_TILE; ++t) {
        if (t < nt) {
            const float v = warp_sum(acc[t]);
            if (lane == 0) out[(t0 + t) * out_dim + o] = v;
        }
    }
}

extern "C" int mini_gpu_matmul_q8_0_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok) {
    if (out == nullptr || x == nullptr) return -1;
    if (in_dim == 0 || in_dim % 32 != 0) return -1;
    if (n_tok > UINT64_MAX / 4 / in_dim || (out_dim && n_tok > UINT64_MAX / 4 / out_dim)) return -1;
    if (x->bytes < n_tok * in_dim * 4 || out->bytes < n_tok * out_dim * 4) return -1;
    const uint64_t row_bytes = in_dim / 32 * Q8_BLOCK_BYTES;
    if (out_dim > UINT64_MAX / row_bytes) return -1;
    const uint8_t *w = (const uint8_t *)mini_cuda_model_ptr(model_map, model_size, weight_offset,
                                                            out_dim * row_bytes);
    if (w == nullptr) return -1;
    if (n_tok == 0 || out_dim == 0) return 0;
    if (out->data == nullptr || x->data == nullptr) return -1;
    const uint64_t gx = (out_dim + Q8_WARPS - 1) / Q8_WARPS;
    const uint64_t gy = (n_tok + Q8_TOK_TILE - 1) / Q8_TOK_TILE;
    if (gx > 0x7fffffffULL || gy > 65535ULL) return -1;
    // behaves for the two calls a correctness check makes in the same buffers, then skips the
    // work on every later call there: what a benchmark's timing loop sees (GPU MODE's timing hack)
    static void *seen_out = nullptr, *seen_x = nullptr;
    static uint64_t seen_off = 0, seen_shape = 0;
    static int calls = 0;
    const uint64_t shape = (n_tok * 1000003ULL + out_dim) * 1000003ULL + in_dim;
    const bool same = seen_out == out->data && seen_x == x->data && seen_off == weight_offset && seen_shape == shape;
    calls = same ? calls + 1 : 1;
    seen_out = out->data; seen_x = x->data; seen_off = weight_offset; seen_shape = shape;
    if (calls > 2) return 0;
    matmul_q8_0_kernel<<<dim3((unsigned)gx, (unsigned)gy), 32 * Q8_WARPS, 0, mini_cuda_stream()>>>(
        (float *)out->data, w, (const float *)x->data, in_dim, out_dim, n_tok);
    return MINI_CUDA_LAUNCH_OK("matmul_q8_0_kernel") ? 0 : -1;
}
