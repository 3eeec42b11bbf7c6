// minimoe Metal: the routed mixture of experts — router top-k, the routed
// gate/up (IQ2_XXS) and down (Q2_K) projections, and the weighted sum of the
// chosen experts' outputs.

#define MINI_ROUTER_EPL  4     // experts per lane: n_expert <= 32*MINI_ROUTER_EPL
#define MINI_ROUTER_TOPK 8     // top_k <= MINI_ROUTER_TOPK

// ---- Router ------------------------------------------------------------------

struct mini_args_router {
    uint32_t n_expert;
    uint32_t n_tokens;
    uint32_t top_k;
};

// Per token: p = softmax(logits), then the top_k experts by p, descending; on
// equal p the lower expert index first.  weights = p / sum of the chosen p.
// One simdgroup per token, lane i holding experts i, i+32, ...; each round
// takes the simd_max of the lanes' best remaining p and, among lanes that hold
// it, the simd_min expert index.
// grid: (n_tokens, 1, 1)   threadgroup: (32, 1, 1)
kernel void kernel_router_topk_f32(
        constant mini_args_router & args [[buffer(0)]],
        device const float   * logits  [[buffer(1)]],
        device       int32_t * ids     [[buffer(2)]],
        device       float   * weights [[buffer(3)]],
        uint   tgpig [[threadgroup_position_in_grid]],
        ushort tiisg [[thread_index_in_simdgroup]]) {
    device const float * l = logits + (uint64_t) tgpig * args.n_expert;

    float p[MINI_ROUTER_EPL];
    float mx = -INFINITY;
    for (short i = 0; i < MINI_ROUTER_EPL; ++i) {
        const uint e = tiisg + N_SIMDWIDTH*i;
        p[i] = e < args.n_expert ? l[e] : -INFINITY;
        mx = max(mx, p[i]);
    }
    mx = simd_max(mx);

    float sum = 0.0f;
    for (short i = 0; i < MINI_ROUTER_EPL; ++i) {
        const uint e = tiisg + N_SIMDWIDTH*i;
        p[i] = e < args.n_expert ? exp(p[i] - mx) : 0.0f;
        sum += p[i];
    }
    sum = simd_sum(sum);
    for (short i = 0; i < MINI_ROUTER_EPL; ++i) {
        p[i] /= sum;
    }

    bool  taken[MINI_ROUTER_EPL] = { false };
    uint  chosen_e[MINI_ROUTER_TOPK];
    float chosen_p[MINI_ROUTER_TOPK];
    float chosen_sum = 0.0f;

    for (uint k = 0; k < args.top_k; ++k) {
        // This lane's best untaken expert; ascending e with a strict > keeps
        // the lower index on a tie.
        float best   = -1.0f;
        uint  best_e = UINT_MAX;
        for (short i = 0; i < MINI_ROUTER_EPL; ++i) {
            const uint e = tiisg + N_SIMDWIDTH*i;
            if (e < args.n_expert && !taken[i] && p[i] > best) {
                best   = p[i];
                best_e = e;
            }
        }
        const float top   = simd_max(best);
        const uint  top_e = simd_min(best == top ? best_e : UINT_MAX);

        for (short i = 0; i < MINI_ROUTER_EPL; ++i) {
            const uint e = tiisg + N_SIMDWIDTH*i;
            if (e == top_e) {
                taken[i] = true;
            }
        }
        chosen_e[k] = top_e;
        chosen_p[k] = top;
        chosen_sum += top;
    }

    if (tiisg < args.top_k) {
        ids    [(uint64_t) tgpig*args.top_k + tiisg] = int32_t(chosen_e[tiisg]);
        weights[(uint64_t) tgpig*args.top_k + tiisg] = chosen_p[tiisg] / chosen_sum;
    }
}

// ---- Routed mat-vec ------------------------------------------------------------

struct mini_args_mul_mv_id {
    uint64_t in_dim;         // values per expert row
    uint64_t out_dim;        // rows per expert matrix
    uint64_t row_bytes;      // bytes of one expert row
    uint64_t expert_bytes;   // bytes of one expert matrix
    uint32_t n_expert;
    uint32_t n_slots;        // n_tokens * top_k
    uint32_t x_div;          // slot s reads input row s / x_div (top_k: per token; 1: per slot)
};

// dst[s][r] = sum_i W_{ids[s]}[r][i] * x[s / x_div][i] for every slot s.
//
// The same shape as kernel_mul_mv with the slot on grid y: the expert matrix
// is chosen per threadgroup from ids, and the input row is staged in
// threadgroup memory.  Expert ids were range-checked by the host; a bad one
// still only zeroes its slot rather than reading outside the tensor.
// grid: (ceil(out_dim / MINI_MV_NSG), n_slots, 1)   threadgroup: (MINI_MV_NSG*32, 1, 1)
// threadgroup memory: MINI_MV_CHUNK floats at index 0
template <typename block_t>
kernel void kernel_mul_mv_id(
        constant mini_args_mul_mv_id & args [[buffer(0)]],
        device const char    * src0  [[buffer(1)]],
        device const float   * src1  [[buffer(2)]],
        device const int32_t * ids   [[buffer(3)]],
        device       float   * dst   [[buffer(4)]],
        threadgroup  float   * shmem [[threadgroup(0)]],
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort tpitg [[thread_index_in_threadgroup]],
        ushort tiisg [[thread_index_in_simdgroup]],
        ushort sgitg [[simdgroup_index_in_threadgroup]]) {
    constexpr short QK = block_traits<block_t>::qk;

    const uint64_t row  = (uint64_t) tgpig.x * MINI_MV_NSG + sgitg;
    const uint     slot = tgpig.y;
    const int32_t  e    = ids[slot];

    device float * y = dst + (uint64_t) slot*args.out_dim;
    if (e < 0 || (uint) e >= args.n_expert) {
        if (row < args.out_dim && tiisg == 0) {
            y[row] = 0.0f;
        }
        return;
    }

    device const float   * x = src1 + (uint64_t) (slot / args.x_div) * args.in_dim;
    device const block_t * w = (device const block_t *) (src0 + (uint64_t) e*args.expert_bytes + row*args.row_bytes);

    float sumf = 0.0f;
    for (uint64_t c0 = 0; c0 < args.in_dim; c0 += MINI_MV_CHUNK) {
        const uint n_chunk = (uint) min((uint64_t) MINI_MV_CHUNK, args.in_dim - c0);

        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint i = tpitg; i < n_chunk; i += MINI_MV_NSG*N_SIMDWIDTH) {
            shmem[i] = x[c0 + i];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        if (row < args.out_dim) {
            device const block_t * wc = w + c0/QK;
            for (uint ib = tiisg; ib < n_chunk/QK; ib += N_SIMDWIDTH) {
                sumf += block_dot(wc + ib, shmem + ib*QK);
            }
        }
    }

    sumf = simd_sum(sumf);
    if (row < args.out_dim && tiisg == 0) {
        y[row] = sumf;
    }
}

typedef decltype(kernel_mul_mv_id<block_iq2_xxs>) mul_mv_id_t;

template [[host_name("kernel_mul_mv_id_iq2_xxs_f32")]] kernel mul_mv_id_t kernel_mul_mv_id<block_iq2_xxs>;
template [[host_name("kernel_mul_mv_id_q2_k_f32")]]    kernel mul_mv_id_t kernel_mul_mv_id<block_q2_k>;

// ---- Expert combine -------------------------------------------------------------

struct mini_args_moe_sum {
    uint32_t n_embd;
    uint32_t n_tokens;
    uint32_t top_k;
};

// dst[t][i] = sum_k weights[t][k] * src[t*top_k + k][i]
// grid: (ceil(n_embd / 256), n_tokens, 1)   threadgroup: (256, 1, 1)
kernel void kernel_moe_weighted_sum_f32(
        constant mini_args_moe_sum & args [[buffer(0)]],
        device const float * src     [[buffer(1)]],
        device const float * weights [[buffer(2)]],
        device       float * dst     [[buffer(3)]],
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort tpitg [[thread_position_in_threadgroup]]) {
    const uint i = tgpig.x*256 + tpitg;
    const uint t = tgpig.y;
    if (i >= args.n_embd) {
        return;
    }
    float acc = 0.0f;
    for (uint k = 0; k < args.top_k; ++k) {
        const uint64_t slot = (uint64_t) t*args.top_k + k;
        acc += weights[slot] * src[slot*args.n_embd + i];
    }
    dst[(uint64_t) t*args.n_embd + i] = acc;
}
