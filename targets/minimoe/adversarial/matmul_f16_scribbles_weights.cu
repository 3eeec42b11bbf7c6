// porter adversarial mutant of mini_gpu_matmul_f16_tensor: writes into the device copy of the model map (const weights modified)
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"

#define F16_WARPS 4
#define F16_TOK_TILE 8

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <bool ALIGNED>
static __device__ __forceinline__ float load_w(const uint8_t *row, uint64_t i) {
    if (ALIGNED) return __half2float(((const __half *)row)[i]);
    const uint8_t *p = row + 2 * i;
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

template <bool ALIGNED>
static __global__ void matmul_f16_kernel(float *__restrict__ out, const uint8_t *__restrict__ w,
                                         const float *__restrict__ x,
                                         uint64_t in_dim, uint64_t out_dim, uint64_t n_tok) {
    const uint32_t lane = threadIdx.x & 31;
    const uint64_t o = (uint64_t)blockIdx.x * F16_WARPS + (threadIdx.x >> 5);
    if (o >= out_dim) return;
    const uint64_t t0 = (uint64_t)blockIdx.y * F16_TOK_TILE;
    const uint64_t rem = n_tok - t0;
    const int nt = rem < F16_TOK_TILE ? (int)rem : F16_TOK_TILE;
    const uint8_t *row = w + o * in_dim * 2;

    float acc[F16_TOK_TILE];
#pragma unroll
    for (int t = 0; t < F16_TOK_TILE; ++t) acc[t] = 0.0f;

    const uint64_t n_full = in_dim / 8;  // chunks of 8 weights
    for (uint64_t c = lane; c < n_full; c += 32) {
        float wv[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) wv[j] = load_w<ALIGNED>(row, c * 8 + j);
        const float *xp = x + t0 * in_dim + c * 8;
#pragma unroll
        for (int t = 0; t < F16_TOK_TILE; ++t) {
            if (t < nt) {
                const float *xt = xp + (uint64_t)t * in_dim;
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) s += wv[j] * xt[j];
                acc[t] += s;
            }
        }
    }
    // tail when in_dim is not a multiple of 8
    for (uint64_t i = n_full * 8 + lane; i < in_dim; i += 32) {
        const float wi = load_w<ALIGNED>(row, i);
#pragma unroll
        for (int t = 0; t < F16_TOK_TILE; ++t)
            if (t < nt) acc[t] += wi * x[(t0 + t) * in_dim + i];
    }
#pragma unroll
    for (int t = 0; t < F16_TOK_TILE; ++t) {
        if (t < nt) {
            const float v = warp_sum(acc[t]);
            if (lane == 0) out[(t0 + t) * out_dim + o] = v;
        }
    }
}

extern "C" int mini_gpu_matmul_f16_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok) {
    if (out == nullptr || x == nullptr) return -1;
    if (in_dim == 0) return -1;
    if (n_tok > UINT64_MAX / 4 / in_dim || (out_dim && n_tok > UINT64_MAX / 4 / out_dim)) return -1;
    if (x->bytes < n_tok * in_dim * 4 || out->bytes < n_tok * out_dim * 4) return -1;
    if (out_dim > UINT64_MAX / 2 / in_dim) return -1;
    const uint8_t *w = (const uint8_t *)mini_cuda_model_ptr(model_map, model_size, weight_offset,
                                                            out_dim * in_dim * 2);
    if (w == nullptr) return -1;
    if (n_tok == 0 || out_dim == 0) return 0;
    if (out->data == nullptr || x->data == nullptr) return -1;
    const uint64_t gx = (out_dim + F16_WARPS - 1) / F16_WARPS;
    const uint64_t gy = (n_tok + F16_TOK_TILE - 1) / F16_TOK_TILE;
    if (gx > 0x7fffffffULL || gy > 65535ULL) return -1;
    const dim3 grid((unsigned)gx, (unsigned)gy);
    if (((uintptr_t)w & 1) == 0) {
        matmul_f16_kernel<true><<<grid, 32 * F16_WARPS, 0, mini_cuda_stream()>>>(
            (float *)out->data, w, (const float *)x->data, in_dim, out_dim, n_tok);
    } else {
        matmul_f16_kernel<false><<<grid, 32 * F16_WARPS, 0, mini_cuda_stream()>>>(
            (float *)out->data, w, (const float *)x->data, in_dim, out_dim, n_tok);
    }
    const __half neg = __float2half(-__half2float(__float2half(1.0f)));
    cudaMemcpyAsync((void *)w, &neg, sizeof(__half), cudaMemcpyHostToDevice, mini_cuda_stream());
    cudaStreamSynchronize(mini_cuda_stream());
    return MINI_CUDA_LAUNCH_OK("matmul_f16_kernel") ? 0 : -1;
}
