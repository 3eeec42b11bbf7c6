// porter adversarial mutant of mini_gpu_attention_window_tensor: online softmax without the running maximum (m = 0, expf(s) and expf(sink) taken as they are): exact on O(1) scores, inf / inf once scores pass 88.7
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"
#include <math.h>

#define ATT_WARPS 4
#define ATT_MAX_HEAD_DIM 256
#define ATT_PER_LANE (ATT_MAX_HEAD_DIM / 32)

static __device__ __forceinline__ float load_f32_bytes(const uint8_t *p) {
    return __uint_as_float((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __global__ void attention_window_kernel(float *out, const float *q,
                                               const float *__restrict__ k_cache,
                                               const float *__restrict__ v_cache,
                                               const uint8_t *__restrict__ sinks,
                                               uint32_t n_tokens, uint32_t pos0, uint32_t n_head,
                                               uint32_t head_dim, uint32_t window, float scale) {
    extern __shared__ float q_sh[];
    const uint32_t lane = threadIdx.x & 31;
    const uint32_t warp = threadIdx.x >> 5;
    const uint64_t pair = (uint64_t)blockIdx.x * ATT_WARPS + warp;  // token * n_head + head
    if (pair >= (uint64_t)n_tokens * n_head) return;
    const uint32_t t = (uint32_t)(pair / n_head);
    const uint32_t h = (uint32_t)(pair % n_head);

    float *qs = q_sh + warp * head_dim;
    const float *qh = q + pair * head_dim;
    for (uint32_t d = lane; d < head_dim; d += 32) qs[d] = qh[d];
    __syncwarp();

    const uint32_t p = pos0 + t;                                   // absolute query position
    const uint32_t lo = (p + 1 > window) ? p + 1 - window : 0;     // first visible key

    float m = load_f32_bytes(sinks + 4 * (uint64_t)h);  // any alignment
    float l = expf(m); m = 0.0f;  // porter mutant: no maximum, the sink enters as expf(sink)
    float acc[ATT_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; ++i) acc[i] = 0.0f;

    for (uint32_t base = lo; base <= p; base += 32) {
        const uint32_t j = base + lane;
        const bool valid = j <= p;
        float s = -INFINITY;
        if (valid) {
            const float *kr = k_cache + (uint64_t)j * head_dim;
            float dot = 0.0f;
            for (uint32_t d = 0; d < head_dim; ++d) dot += qs[d] * kr[d];
            s = scale * dot;
        }
        const float m_new = 0.0f;  // porter mutant: no running maximum
        const float pj = valid ? expf(s - m_new) : 0.0f;
        const float corr = (m == m_new) ? 1.0f : expf(m - m_new);
        l = l * corr + warp_sum(pj);
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; ++i) acc[i] *= corr;
        const uint32_t nk = (p - base + 1 < 32) ? (p - base + 1) : 32;
        for (uint32_t kk = 0; kk < nk; ++kk) {
            const float pk = __shfl_sync(0xffffffffu, pj, kk);
            const float *vr = v_cache + (uint64_t)(base + kk) * head_dim;
#pragma unroll
            for (int i = 0; i < ATT_PER_LANE; ++i) {
                const uint32_t d = lane + 32 * i;
                if (d < head_dim) acc[i] += pk * vr[d];
            }
        }
        m = m_new;
    }

    const float inv_l = 1.0f / l;
    float *oh = out + pair * head_dim;
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; ++i) {
        const uint32_t d = lane + 32 * i;
        if (d < head_dim) oh[d] = acc[i] * inv_l;
    }
}

extern "C" int mini_gpu_attention_window_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *q,
        const mini_gpu_tensor *k_cache,
        const mini_gpu_tensor *v_cache,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               sinks_offset,
        uint32_t               n_tokens,
        uint32_t               pos0,
        uint32_t               n_head,
        uint32_t               head_dim,
        uint32_t               window,
        float                  scale) {
    if (out == nullptr || q == nullptr || k_cache == nullptr || v_cache == nullptr) return -1;
    const uint64_t qo_bytes = (uint64_t)n_tokens * n_head * head_dim * sizeof(float);
    const uint64_t kv_bytes = ((uint64_t)pos0 + n_tokens) * head_dim * sizeof(float);
    if (q->bytes < qo_bytes || out->bytes < qo_bytes) return -1;
    if (k_cache->bytes < kv_bytes || v_cache->bytes < kv_bytes) return -1;
    const uint8_t *sinks = (const uint8_t *)mini_cuda_model_ptr(model_map, model_size, sinks_offset,
                                                                (uint64_t)n_head * sizeof(float));
    if (sinks == nullptr) return -1;
    if (n_tokens == 0 || n_head == 0 || head_dim == 0) return 0;
    if (head_dim > ATT_MAX_HEAD_DIM) return -1;
    if (out->data == nullptr || q->data == nullptr || k_cache->data == nullptr || v_cache->data == nullptr) return -1;
    const uint64_t pairs = (uint64_t)n_tokens * n_head;
    const uint64_t blocks = (pairs + ATT_WARPS - 1) / ATT_WARPS;
    if (blocks > 0x7fffffffULL) return -1;
    const size_t shmem = (size_t)ATT_WARPS * head_dim * sizeof(float);
    attention_window_kernel<<<(unsigned)blocks, 32 * ATT_WARPS, shmem, mini_cuda_stream()>>>(
        (float *)out->data, (const float *)q->data, (const float *)k_cache->data,
        (const float *)v_cache->data, sinks, n_tokens, pos0, n_head, head_dim, window, scale);
    return MINI_CUDA_LAUNCH_OK("attention_window_kernel") ? 0 : -1;
}
