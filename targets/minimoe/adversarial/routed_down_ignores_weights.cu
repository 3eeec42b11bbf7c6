// porter adversarial mutant of mini_gpu_routed_down_q2_k_tensor: sums the chosen experts without the router weights
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"

#define DOWN_WARPS 4
#define Q2K_BLOCK_BYTES 84

static __device__ int down_bad_expert;

static __device__ __forceinline__ float load_f16_bytes(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __global__ void down_check_ids_kernel(const int32_t *__restrict__ ids, uint64_t n_slots, uint32_t n_expert) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_slots;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const int32_t e = ids[i];
        if (e < 0 || (uint32_t)e >= n_expert) atomicExch(&down_bad_expert, 1);
    }
}

static __global__ void routed_down_q2_k_kernel(float *__restrict__ out, const uint8_t *__restrict__ wd,
                                               const float *__restrict__ mid,
                                               const int32_t *__restrict__ ids,
                                               const float *__restrict__ weights,
                                               uint32_t n_ff, uint32_t n_embd, uint32_t top_k) {
    if (*(volatile int *)&down_bad_expert) return;  // bad expert id somewhere: write nothing
    const uint32_t lane = threadIdx.x & 31;
    const uint64_t t = blockIdx.x;
    const uint32_t o = blockIdx.y * DOWN_WARPS + (threadIdx.x >> 5);
    if (o >= n_embd) return;
    const uint64_t n_blocks = n_ff / 256;

    // this lane's 8 weights inside every Q2_K block
    const uint32_t half = lane >> 4;             // which 128-weight half
    const uint32_t shift = 2 * ((lane >> 2) & 3); // which 2-bit plane
    const uint32_t l0 = (lane & 3) * 8;           // first position in the 32-byte run
    const uint32_t sc_idx = lane >> 1;            // 16-weight group

    float total = 0.0f;
    for (uint32_t k = 0; k < top_k; ++k) {
        const uint64_t slot = t * top_k + k;
        const int32_t e = ids[slot];
        const uint8_t *row = wd + ((uint64_t)e * n_embd + o) * n_blocks * Q2K_BLOCK_BYTES;
        const float *mk = mid + slot * n_ff;
        float acc = 0.0f;
        for (uint64_t b = 0; b < n_blocks; ++b) {
            const uint8_t *blk = row + b * Q2K_BLOCK_BYTES;
            const float d = load_f16_bytes(blk + 80);
            const float dmin = load_f16_bytes(blk + 82);
            const uint8_t sc = blk[sc_idx];
            const float dl = d * (float)(sc & 0x0F);
            const float ml = dmin * (float)(sc >> 4);
            const uint8_t *qs = blk + 16 + half * 32 + l0;
            const float *xb = mk + b * 256 + lane * 8;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc += (dl * (float)((qs[i] >> shift) & 3) - ml) * xb[i];
        }
        total += 0.0f * weights[slot] + warp_sum(acc);
    }
    if (lane == 0) out[t * n_embd + o] = total;
}

extern "C" int mini_gpu_routed_down_q2_k_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               down_offset,
        uint32_t               n_ff,
        uint32_t               n_embd,
        uint32_t               n_expert,
        const mini_gpu_tensor *mid,
        const mini_gpu_tensor *expert_ids,
        const mini_gpu_tensor *expert_weights,
        uint32_t               n_tokens,
        uint32_t               top_k) {
    if (out == nullptr || mid == nullptr || expert_ids == nullptr || expert_weights == nullptr) return -1;
    if (n_ff == 0 || n_ff % 256 != 0) return -1;
    const uint64_t pairs = (uint64_t)n_tokens * top_k;
    if (out->bytes < (uint64_t)n_tokens * n_embd * sizeof(float)) return -1;
    if (mid->bytes < pairs * n_ff * sizeof(float)) return -1;
    if (expert_ids->bytes < pairs * sizeof(int32_t) || expert_weights->bytes < pairs * sizeof(float)) return -1;
    const uint64_t w_bytes = (uint64_t)n_expert * n_embd * (n_ff / 256) * Q2K_BLOCK_BYTES;
    const uint8_t *wd = (const uint8_t *)mini_cuda_model_ptr(model_map, model_size, down_offset, w_bytes);
    if (wd == nullptr) return -1;
    if (n_tokens == 0 || n_embd == 0) return 0;
    if (out->data == nullptr || (pairs && (mid->data == nullptr || expert_ids->data == nullptr ||
                                           expert_weights->data == nullptr))) return -1;
    const uint64_t gy = ((uint64_t)n_embd + DOWN_WARPS - 1) / DOWN_WARPS;
    if (gy > 65535ULL) return -1;

    cudaStream_t s = mini_cuda_stream();
    int *flag = nullptr;
    if (mini_cuda_check(cudaGetSymbolAddress((void **)&flag, down_bad_expert), "down flag") != 0) return -1;
    if (mini_cuda_check(cudaMemsetAsync(flag, 0, sizeof(int), s), "down flag reset") != 0) return -1;
    if (pairs > 0) {
        const unsigned check_blocks = pairs / 256 + 1 < 1024 ? (unsigned)(pairs / 256 + 1) : 1024;
        down_check_ids_kernel<<<check_blocks, 256, 0, s>>>((const int32_t *)expert_ids->data, pairs, n_expert);
        if (!MINI_CUDA_LAUNCH_OK("down_check_ids_kernel")) return -1;
    }
    routed_down_q2_k_kernel<<<dim3(n_tokens, (unsigned)gy), 32 * DOWN_WARPS, 0, s>>>(
        (float *)out->data, wd, (const float *)mid->data, (const int32_t *)expert_ids->data,
        (const float *)expert_weights->data, n_ff, n_embd, top_k);
    if (!MINI_CUDA_LAUNCH_OK("routed_down_q2_k_kernel")) return -1;
    int bad = 0;
    if (mini_cuda_check(cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, s), "down flag read") != 0) return -1;
    if (mini_cuda_check(cudaStreamSynchronize(s), "down sync") != 0) return -1;
    return bad ? -1 : 0;
}
