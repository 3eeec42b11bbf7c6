// porter adversarial mutant of mini_gpu_routed_gate_up_iq2_xxs_tensor: expert matrices located with the Q8_0 stride (34 bytes per 32 weights) instead of IQ2_XXS (66 per 256)
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"

#define GU_WARPS 4
#define IQ2XXS_BLOCK_BYTES 66

// IQ2_XXS format tables (GGML): grid entry g holds 8 magnitudes, byte j = element j.
static __constant__ uint64_t iq2xxs_grid[256] = {
    0x0808080808080808ULL, 0x080808080808082bULL, 0x0808080808081919ULL, 0x0808080808082b08ULL,
    0x0808080808082b2bULL, 0x0808080808190819ULL, 0x0808080808191908ULL, 0x08080808082b0808ULL,
    0x08080808082b082bULL, 0x08080808082b2b08ULL, 0x08080808082b2b2bULL, 0x0808080819080819ULL,
    0x0808080819081908ULL, 0x0808080819190808ULL, 0x0808080819192b08ULL, 0x08080808192b0819ULL,
    0x08080808192b1908ULL, 0x080808082b080808ULL, 0x080808082b08082bULL, 0x080808082b082b2bULL,
    0x080808082b2b082bULL, 0x0808081908080819ULL, 0x0808081908081908ULL, 0x0808081908190808ULL,
    0x0808081908191919ULL, 0x0808081919080808ULL, 0x080808192b081908ULL, 0x080808192b192b08ULL,
    0x0808082b08080808ULL, 0x0808082b0808082bULL, 0x0808082b082b082bULL, 0x0808082b2b08082bULL,
    0x0808190808080819ULL, 0x0808190808081908ULL, 0x0808190808190808ULL, 0x08081908082b0819ULL,
    0x08081908082b1908ULL, 0x0808190819080808ULL, 0x080819081908082bULL, 0x0808190819082b08ULL,
    0x08081908192b0808ULL, 0x080819082b080819ULL, 0x080819082b081908ULL, 0x080819082b190808ULL,
    0x080819082b2b1908ULL, 0x0808191908080808ULL, 0x080819190808082bULL, 0x0808191908082b08ULL,
    0x08081919082b0808ULL, 0x080819191908192bULL, 0x08081919192b2b19ULL, 0x080819192b080808ULL,
    0x080819192b190819ULL, 0x0808192b08082b19ULL, 0x0808192b08190808ULL, 0x0808192b19080808ULL,
    0x0808192b2b081908ULL, 0x0808192b2b2b1908ULL, 0x08082b0808080808ULL, 0x08082b0808081919ULL,
    0x08082b0808082b08ULL, 0x08082b0808191908ULL, 0x08082b08082b2b08ULL, 0x08082b0819080819ULL,
    0x08082b0819081908ULL, 0x08082b0819190808ULL, 0x08082b081919082bULL, 0x08082b082b082b08ULL,
    0x08082b1908081908ULL, 0x08082b1919080808ULL, 0x08082b2b0808082bULL, 0x08082b2b08191908ULL,
    0x0819080808080819ULL, 0x0819080808081908ULL, 0x0819080808190808ULL, 0x08190808082b0819ULL,
    0x0819080819080808ULL, 0x08190808192b0808ULL, 0x081908082b081908ULL, 0x081908082b190808ULL,
    0x081908082b191919ULL, 0x0819081908080808ULL, 0x0819081908082b08ULL, 0x08190819082b0808ULL,
    0x0819081919190808ULL, 0x0819081919192b2bULL, 0x081908192b080808ULL, 0x0819082b082b1908ULL,
    0x0819082b19081919ULL, 0x0819190808080808ULL, 0x0819190808082b08ULL, 0x08191908082b0808ULL,
    0x08191908082b1919ULL, 0x0819190819082b19ULL, 0x081919082b080808ULL, 0x0819191908192b08ULL,
    0x08191919192b082bULL, 0x0819192b08080808ULL, 0x0819192b0819192bULL, 0x08192b0808080819ULL,
    0x08192b0808081908ULL, 0x08192b0808190808ULL, 0x08192b0819080808ULL, 0x08192b082b080819ULL,
    0x08192b1908080808ULL, 0x08192b1908081919ULL, 0x08192b192b2b0808ULL, 0x08192b2b19190819ULL,
    0x082b080808080808ULL, 0x082b08080808082bULL, 0x082b080808082b2bULL, 0x082b080819081908ULL,
    0x082b0808192b0819ULL, 0x082b08082b080808ULL, 0x082b08082b08082bULL, 0x082b0819082b2b19ULL,
    0x082b081919082b08ULL, 0x082b082b08080808ULL, 0x082b082b0808082bULL, 0x082b190808080819ULL,
    0x082b190808081908ULL, 0x082b190808190808ULL, 0x082b190819080808ULL, 0x082b19081919192bULL,
    0x082b191908080808ULL, 0x082b191919080819ULL, 0x082b1919192b1908ULL, 0x082b192b2b190808ULL,
    0x082b2b0808082b08ULL, 0x082b2b08082b0808ULL, 0x082b2b082b191908ULL, 0x082b2b2b19081908ULL,
    0x1908080808080819ULL, 0x1908080808081908ULL, 0x1908080808190808ULL, 0x1908080808192b08ULL,
    0x19080808082b0819ULL, 0x19080808082b1908ULL, 0x1908080819080808ULL, 0x1908080819082b08ULL,
    0x190808081919192bULL, 0x19080808192b0808ULL, 0x190808082b080819ULL, 0x190808082b081908ULL,
    0x190808082b190808ULL, 0x1908081908080808ULL, 0x19080819082b0808ULL, 0x19080819192b0819ULL,
    0x190808192b080808ULL, 0x190808192b081919ULL, 0x1908082b08080819ULL, 0x1908082b08190808ULL,
    0x1908082b19082b08ULL, 0x1908082b1919192bULL, 0x1908082b192b2b08ULL, 0x1908190808080808ULL,
    0x1908190808082b08ULL, 0x19081908082b0808ULL, 0x190819082b080808ULL, 0x190819082b192b19ULL,
    0x190819190819082bULL, 0x19081919082b1908ULL, 0x1908192b08080808ULL, 0x19082b0808080819ULL,
    0x19082b0808081908ULL, 0x19082b0808190808ULL, 0x19082b0819080808ULL, 0x19082b0819081919ULL,
    0x19082b1908080808ULL, 0x19082b1919192b08ULL, 0x19082b19192b0819ULL, 0x19082b192b08082bULL,
    0x19082b2b19081919ULL, 0x19082b2b2b190808ULL, 0x1919080808080808ULL, 0x1919080808082b08ULL,
    0x1919080808190819ULL, 0x1919080808192b19ULL, 0x19190808082b0808ULL, 0x191908082b080808ULL,
    0x191908082b082b08ULL, 0x1919081908081908ULL, 0x191908191908082bULL, 0x191908192b2b1908ULL,
    0x1919082b2b190819ULL, 0x191919082b190808ULL, 0x191919082b19082bULL, 0x1919191908082b2bULL,
    0x1919192b08080819ULL, 0x1919192b19191908ULL, 0x19192b0808080808ULL, 0x19192b0808190819ULL,
    0x19192b0808192b19ULL, 0x19192b08192b1908ULL, 0x19192b1919080808ULL, 0x19192b2b08082b08ULL,
    0x192b080808081908ULL, 0x192b080808190808ULL, 0x192b080819080808ULL, 0x192b0808192b2b08ULL,
    0x192b081908080808ULL, 0x192b081919191919ULL, 0x192b082b08192b08ULL, 0x192b082b192b0808ULL,
    0x192b190808080808ULL, 0x192b190808081919ULL, 0x192b191908190808ULL, 0x192b19190819082bULL,
    0x192b19192b081908ULL, 0x192b2b081908082bULL, 0x2b08080808080808ULL, 0x2b0808080808082bULL,
    0x2b08080808082b2bULL, 0x2b08080819080819ULL, 0x2b0808082b08082bULL, 0x2b08081908081908ULL,
    0x2b08081908192b08ULL, 0x2b08081919080808ULL, 0x2b08082b08190819ULL, 0x2b08190808080819ULL,
    0x2b08190808081908ULL, 0x2b08190808190808ULL, 0x2b08190808191919ULL, 0x2b08190819080808ULL,
    0x2b081908192b0808ULL, 0x2b08191908080808ULL, 0x2b0819191908192bULL, 0x2b0819192b191908ULL,
    0x2b08192b08082b19ULL, 0x2b08192b19080808ULL, 0x2b08192b192b0808ULL, 0x2b082b080808082bULL,
    0x2b082b1908081908ULL, 0x2b082b2b08190819ULL, 0x2b19080808081908ULL, 0x2b19080808190808ULL,
    0x2b190808082b1908ULL, 0x2b19080819080808ULL, 0x2b1908082b2b0819ULL, 0x2b1908190819192bULL,
    0x2b1908192b080808ULL, 0x2b19082b19081919ULL, 0x2b19190808080808ULL, 0x2b191908082b082bULL,
    0x2b19190819081908ULL, 0x2b19191919190819ULL, 0x2b192b082b080819ULL, 0x2b192b19082b0808ULL,
    0x2b2b08080808082bULL, 0x2b2b080819190808ULL, 0x2b2b08082b081919ULL, 0x2b2b081908082b19ULL,
    0x2b2b082b08080808ULL, 0x2b2b190808192b08ULL, 0x2b2b2b0819190808ULL, 0x2b2b2b1908081908ULL,
};
static __constant__ uint8_t iq2xxs_signs[128] = {
    0x00, 0x81, 0x82, 0x03, 0x84, 0x05, 0x06, 0x87, 0x88, 0x09, 0x0a, 0x8b, 0x0c, 0x8d, 0x8e, 0x0f,
    0x90, 0x11, 0x12, 0x93, 0x14, 0x95, 0x96, 0x17, 0x18, 0x99, 0x9a, 0x1b, 0x9c, 0x1d, 0x1e, 0x9f,
    0xa0, 0x21, 0x22, 0xa3, 0x24, 0xa5, 0xa6, 0x27, 0x28, 0xa9, 0xaa, 0x2b, 0xac, 0x2d, 0x2e, 0xaf,
    0x30, 0xb1, 0xb2, 0x33, 0xb4, 0x35, 0x36, 0xb7, 0xb8, 0x39, 0x3a, 0xbb, 0x3c, 0xbd, 0xbe, 0x3f,
    0xc0, 0x41, 0x42, 0xc3, 0x44, 0xc5, 0xc6, 0x47, 0x48, 0xc9, 0xca, 0x4b, 0xcc, 0x4d, 0x4e, 0xcf,
    0x50, 0xd1, 0xd2, 0x53, 0xd4, 0x55, 0x56, 0xd7, 0xd8, 0x59, 0x5a, 0xdb, 0x5c, 0xdd, 0xde, 0x5f,
    0x60, 0xe1, 0xe2, 0x63, 0xe4, 0x65, 0x66, 0xe7, 0xe8, 0x69, 0x6a, 0xeb, 0x6c, 0xed, 0xee, 0x6f,
    0xf0, 0x71, 0x72, 0xf3, 0x74, 0xf5, 0xf6, 0x77, 0x78, 0xf9, 0xfa, 0x7b, 0xfc, 0x7d, 0x7e, 0xff,
};
static __device__ int gate_up_bad_expert;

static __device__ __forceinline__ float load_f16_bytes(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Dot product of this lane's 8 weights of one IQ2_XXS block with xv[0..8).
// group = lane / 4 (32 weights), sub = lane % 4 (8 weights, one grid entry).
static __device__ __forceinline__ float iq2xxs_dot8(const uint8_t *blk, uint32_t group, uint32_t sub,
                                                    const float *xv) {
    const float d = load_f16_bytes(blk);
    const uint8_t *g = blk + 2 + group * 8;
    const uint32_t aux1 = (uint32_t)g[4] | ((uint32_t)g[5] << 8) | ((uint32_t)g[6] << 16) | ((uint32_t)g[7] << 24);
    const float db = d * (0.5f + (float)(aux1 >> 28)) * 0.25f;
    const uint64_t grid = iq2xxs_grid[g[sub]];
    const uint32_t signs = iq2xxs_signs[(aux1 >> (7 * sub)) & 127];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const float mag = (float)((grid >> (8 * j)) & 0xff);
        s += ((signs >> j) & 1u) ? -mag * xv[j] : mag * xv[j];
    }
    return db * s;
}

static __global__ void gate_up_check_ids_kernel(const int32_t *__restrict__ ids, uint64_t n_slots, uint32_t n_expert) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_slots;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const int32_t e = ids[i];
        if (e < 0 || (uint32_t)e >= n_expert) atomicExch(&gate_up_bad_expert, 1);
    }
}

static __global__ void routed_gate_up_iq2_xxs_kernel(float *__restrict__ gate, float *__restrict__ up,
                                                     const uint8_t *__restrict__ wg,
                                                     const uint8_t *__restrict__ wu,
                                                     const float *__restrict__ x,
                                                     const int32_t *__restrict__ ids,
                                                     uint32_t n_embd, uint32_t n_ff, uint32_t top_k) {
    if (*(volatile int *)&gate_up_bad_expert) return;  // bad expert id somewhere: write nothing
    const uint32_t lane = threadIdx.x & 31;
    const uint64_t pair = blockIdx.x;                                   // t * top_k + k
    const uint32_t o = blockIdx.y * GU_WARPS + (threadIdx.x >> 5);      // output row
    if (o >= n_ff) return;
    const uint64_t t = pair / top_k;
    const int32_t e = ids[pair];
    float *gout = gate + pair * n_ff + o;
    float *uout = up + pair * n_ff + o;
    const uint64_t n_blocks = n_embd / 256;
    const uint64_t row_off = (uint64_t)e * n_ff * (n_blocks * 8) * 34 / 4 + (uint64_t)o * n_blocks * IQ2XXS_BLOCK_BYTES;
    const uint8_t *rg = wg + row_off;
    const uint8_t *ru = wu + row_off;
    const float *xt = x + t * n_embd;
    const uint32_t group = lane >> 2, sub = lane & 3;
    float acc_g = 0.0f, acc_u = 0.0f;
    for (uint64_t b = 0; b < n_blocks; ++b) {
        float xv[8];
        const float *xb = xt + b * 256 + lane * 8;
#pragma unroll
        for (int j = 0; j < 8; ++j) xv[j] = xb[j];
        acc_g += iq2xxs_dot8(rg + b * IQ2XXS_BLOCK_BYTES, group, sub, xv);
        acc_u += iq2xxs_dot8(ru + b * IQ2XXS_BLOCK_BYTES, group, sub, xv);
    }
    acc_g = warp_sum(acc_g);
    acc_u = warp_sum(acc_u);
    if (lane == 0) {
        *gout = acc_g;
        *uout = acc_u;
    }
}

extern "C" int mini_gpu_routed_gate_up_iq2_xxs_tensor(
        mini_gpu_tensor       *gate,
        mini_gpu_tensor       *up,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               gate_offset,
        uint64_t               up_offset,
        uint32_t               n_embd,
        uint32_t               n_ff,
        uint32_t               n_expert,
        const mini_gpu_tensor *x,
        const mini_gpu_tensor *expert_ids,
        uint32_t               n_tokens,
        uint32_t               top_k) {
    if (gate == nullptr || up == nullptr || x == nullptr || expert_ids == nullptr) return -1;
    if (n_embd == 0 || n_embd % 256 != 0) return -1;
    const uint64_t pairs = (uint64_t)n_tokens * top_k;
    if (gate->bytes < pairs * n_ff * sizeof(float) || up->bytes < pairs * n_ff * sizeof(float)) return -1;
    if (x->bytes < (uint64_t)n_tokens * n_embd * sizeof(float)) return -1;
    if (expert_ids->bytes < pairs * sizeof(int32_t)) return -1;
    const uint64_t w_bytes = (uint64_t)n_expert * n_ff * (n_embd / 256) * IQ2XXS_BLOCK_BYTES;
    const uint8_t *wg = (const uint8_t *)mini_cuda_model_ptr(model_map, model_size, gate_offset, w_bytes);
    const uint8_t *wu = (const uint8_t *)mini_cuda_model_ptr(model_map, model_size, up_offset, w_bytes);
    if (wg == nullptr || wu == nullptr) return -1;
    if (pairs == 0) return 0;
    if (gate->data == nullptr || up->data == nullptr || x->data == nullptr || expert_ids->data == nullptr) return -1;
    const uint64_t gy = ((uint64_t)n_ff + GU_WARPS - 1) / GU_WARPS;
    if (pairs > 0x7fffffffULL || gy > 65535ULL) return -1;

    cudaStream_t s = mini_cuda_stream();
    int *flag = nullptr;
    if (mini_cuda_check(cudaGetSymbolAddress((void **)&flag, gate_up_bad_expert), "gate_up flag") != 0) return -1;
    if (mini_cuda_check(cudaMemsetAsync(flag, 0, sizeof(int), s), "gate_up flag reset") != 0) return -1;
    const unsigned check_blocks = pairs / 256 + 1 < 1024 ? (unsigned)(pairs / 256 + 1) : 1024;
    gate_up_check_ids_kernel<<<check_blocks, 256, 0, s>>>((const int32_t *)expert_ids->data, pairs, n_expert);
    if (!MINI_CUDA_LAUNCH_OK("gate_up_check_ids_kernel")) return -1;
    if (n_ff > 0) {
        routed_gate_up_iq2_xxs_kernel<<<dim3((unsigned)pairs, (unsigned)gy), 32 * GU_WARPS, 0, s>>>(
            (float *)gate->data, (float *)up->data, wg, wu, (const float *)x->data,
            (const int32_t *)expert_ids->data, n_embd, n_ff, top_k);
        if (!MINI_CUDA_LAUNCH_OK("routed_gate_up_iq2_xxs_kernel")) return -1;
    }
    int bad = 0;
    if (mini_cuda_check(cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, s), "gate_up flag read") != 0) return -1;
    if (mini_cuda_check(cudaStreamSynchronize(s), "gate_up sync") != 0) return -1;
    return bad ? -1 : 0;
}
