// porter adversarial mutant of mini_gpu_router_topk_tensor: router softmax as expf(logit) without the row maximum: the right experts, but weights inf / inf once logits pass 88.7
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"
#include <math.h>

#define TOPK_WARPS 4
#define TOPK_MAX_EXPERTS 256
#define TOPK_PER_LANE (TOPK_MAX_EXPERTS / 32)

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

static __global__ void router_topk_kernel(int32_t *__restrict__ ids, float *__restrict__ weights,
                                          const float *__restrict__ logits,
                                          uint32_t n_expert, uint32_t n_tokens, uint32_t top_k) {
    const uint32_t lane = threadIdx.x & 31;
    const uint64_t t = (uint64_t)blockIdx.x * TOPK_WARPS + (threadIdx.x >> 5);
    if (t >= n_tokens) return;
    const float *lr = logits + t * n_expert;

    float lg[TOPK_PER_LANE], p[TOPK_PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < TOPK_PER_LANE; ++i) {
        const uint32_t e = lane + 32 * i;
        lg[i] = e < n_expert ? lr[e] : -INFINITY;
        mx = fmaxf(mx, lg[i]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < TOPK_PER_LANE; ++i) {
        const uint32_t e = lane + 32 * i;
        p[i] = e < n_expert ? expf(lg[i]) : 0.0f;  // porter mutant: no maximum subtracted
        sum += p[i];
    }
    sum = warp_sum(sum);
    const float inv_sum = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < TOPK_PER_LANE; ++i) p[i] *= inv_sum;

    uint32_t taken = 0;        // bit i: expert lane + 32*i already chosen
    float my_p = 0.0f;         // lane k: probability of the k-th choice
    int32_t my_e = 0;
    float chosen_sum = 0.0f;
    for (uint32_t k = 0; k < top_k; ++k) {
        float best_l = -INFINITY, best_p = 0.0f;
        int32_t best_e = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < TOPK_PER_LANE; ++i) {
            const uint32_t e = lane + 32 * i;
            if (e < n_expert && !((taken >> i) & 1u) &&
                (best_e == 0x7fffffff || lg[i] > best_l)) {  // strict: lower index wins ties
                best_l = lg[i];
                best_p = p[i];
                best_e = (int32_t)e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ol = __shfl_xor_sync(0xffffffffu, best_l, o);
            const float op = __shfl_xor_sync(0xffffffffu, best_p, o);
            const int32_t oe = __shfl_xor_sync(0xffffffffu, best_e, o);
            if (oe != 0x7fffffff && (best_e == 0x7fffffff || ol > best_l || (ol == best_l && oe < best_e))) {
                best_l = ol;
                best_p = op;
                best_e = oe;
            }
        }
        if ((uint32_t)best_e % 32 == lane) taken |= 1u << ((uint32_t)best_e / 32);
        if (k == lane) {
            my_p = best_p;
            my_e = best_e;
        }
        chosen_sum += best_p;
    }
    if (lane < top_k) {
        ids[t * top_k + lane] = my_e;
        weights[t * top_k + lane] = my_p / chosen_sum;
    }
}

extern "C" int mini_gpu_router_topk_tensor(
        mini_gpu_tensor       *expert_ids,
        mini_gpu_tensor       *expert_weights,
        const mini_gpu_tensor *logits,
        uint32_t               n_expert,
        uint32_t               n_tokens,
        uint32_t               top_k) {
    if (expert_ids == nullptr || expert_weights == nullptr || logits == nullptr) return -1;
    if (top_k == 0 || top_k > n_expert) return -1;
    if (logits->bytes < (uint64_t)n_tokens * n_expert * sizeof(float)) return -1;
    if (expert_ids->bytes < (uint64_t)n_tokens * top_k * sizeof(int32_t)) return -1;
    if (expert_weights->bytes < (uint64_t)n_tokens * top_k * sizeof(float)) return -1;
    if (n_tokens == 0) return 0;
    if (n_expert > TOPK_MAX_EXPERTS || top_k > 32) return -1;  // one warp per token: 8 experts a lane
    if (expert_ids->data == nullptr || expert_weights->data == nullptr || logits->data == nullptr) return -1;
    const unsigned blocks = (n_tokens + TOPK_WARPS - 1) / TOPK_WARPS;
    router_topk_kernel<<<blocks, 32 * TOPK_WARPS, 0, mini_cuda_stream()>>>(
        (int32_t *)expert_ids->data, (float *)expert_weights->data, (const float *)logits->data,
        n_expert, n_tokens, top_k);
    return MINI_CUDA_LAUNCH_OK("router_topk_kernel") ? 0 : -1;
}
