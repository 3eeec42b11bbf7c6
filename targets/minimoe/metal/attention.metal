// minimoe Metal: causal sliding-window attention with one shared KV head
// (multi-query) and a learned per-head sink logit.

#define MINI_ATTN_NSG 4        // simdgroups per threadgroup, each a slice of the keys
#define MINI_ATTN_DPL 4        // head dims per lane: head_dim <= 32*MINI_ATTN_DPL

// Whether the learned sink logit takes part in the softmax.  Set by the host
// through MTLFunctionConstantValues when it builds the pipeline.
constant bool FC_attn_has_sinks [[function_constant(0)]];

struct mini_args_attn_window {
    uint32_t n_tokens;
    uint32_t pos0;
    uint32_t n_head;
    uint32_t head_dim;
    uint32_t window;
    float    scale;
};

// For the query of token t, head h (position p = pos0 + t), over the visible
// keys j = max(0, p-window+1) .. p of the caches:
//   s_j = scale * dot(q, k_j);  m = max(max_j s_j, sink_h)
//   out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m))
// The sink takes probability mass but contributes no value.
//
// One threadgroup per (head, token).  Simdgroup s visits keys lo+s, lo+s+NSG,
// ... with an online softmax (running max m, running sum l, running output
// acc, lane i holding dims i, i+32, ...); the NSG partial states are merged
// through threadgroup memory by simdgroup 0, where the sink joins.
// grid: (n_head, n_tokens, 1)   threadgroup: (32*MINI_ATTN_NSG, 1, 1)
// threadgroup memory: (MINI_ATTN_NSG*(2 + 32*MINI_ATTN_DPL)) floats at index 0
kernel void kernel_attn_window_f32(
        constant mini_args_attn_window & args [[buffer(0)]],
        device const float * q       [[buffer(1)]],
        device const float * k_cache [[buffer(2)]],
        device const float * v_cache [[buffer(3)]],
        device const float * sinks   [[buffer(4)]],
        device       float * dst     [[buffer(5)]],
        threadgroup  float * shmem   [[threadgroup(0)]],
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort tiisg [[thread_index_in_simdgroup]],
        ushort sgitg [[simdgroup_index_in_threadgroup]]) {
    const uint h = tgpig.x;
    const uint t = tgpig.y;
    const uint D = args.head_dim;

    const uint p  = args.pos0 + t;
    const uint lo = p + 1 > args.window ? p + 1 - args.window : 0;

    device const float * qh = q + ((uint64_t) t*args.n_head + h)*D;

    float qr[MINI_ATTN_DPL];
    float acc[MINI_ATTN_DPL];
    for (short i = 0; i < MINI_ATTN_DPL; ++i) {
        const uint d = tiisg + N_SIMDWIDTH*i;
        qr[i]  = d < D ? qh[d] * args.scale : 0.0f;
        acc[i] = 0.0f;
    }

    float m = -INFINITY;
    float l = 0.0f;
    for (uint j = lo + sgitg; j <= p; j += MINI_ATTN_NSG) {
        device const float * kj = k_cache + (uint64_t) j*D;
        device const float * vj = v_cache + (uint64_t) j*D;

        float s = 0.0f;
        for (short i = 0; i < MINI_ATTN_DPL; ++i) {
            const uint d = tiisg + N_SIMDWIDTH*i;
            s += d < D ? qr[i] * kj[d] : 0.0f;
        }
        s = simd_sum(s);

        const float m_new = max(m, s);
        const float c = exp(m - m_new);
        const float e = exp(s - m_new);
        l = l*c + e;
        for (short i = 0; i < MINI_ATTN_DPL; ++i) {
            const uint d = tiisg + N_SIMDWIDTH*i;
            acc[i] = acc[i]*c + (d < D ? e * vj[d] : 0.0f);
        }
        m = m_new;
    }

    // Partial states: [NSG] maxima, [NSG] sums, [NSG][32*DPL] outputs.
    threadgroup float * sm   = shmem;
    threadgroup float * sl   = shmem + MINI_ATTN_NSG;
    threadgroup float * sacc = shmem + 2*MINI_ATTN_NSG;

    if (tiisg == 0) {
        sm[sgitg] = m;
        sl[sgitg] = l;
    }
    for (short i = 0; i < MINI_ATTN_DPL; ++i) {
        sacc[sgitg*N_SIMDWIDTH*MINI_ATTN_DPL + tiisg + N_SIMDWIDTH*i] = acc[i];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    if (sgitg != 0) {
        return;
    }

    float M = -INFINITY;
    for (short g = 0; g < MINI_ATTN_NSG; ++g) {
        M = max(M, sm[g]);
    }
    float sink = 0.0f;
    if (FC_attn_has_sinks) {
        sink = sinks[h];
        M = max(M, sink);
    }

    float L = FC_attn_has_sinks ? exp(sink - M) : 0.0f;
    float out[MINI_ATTN_DPL] = { 0.0f };
    for (short g = 0; g < MINI_ATTN_NSG; ++g) {
        // A simdgroup that saw no key has m = -inf: its weight is exp(-inf) = 0.
        const float wg = exp(sm[g] - M);
        L += sl[g] * wg;
        for (short i = 0; i < MINI_ATTN_DPL; ++i) {
            out[i] += sacc[g*N_SIMDWIDTH*MINI_ATTN_DPL + tiisg + N_SIMDWIDTH*i] * wg;
        }
    }

    device float * y = dst + ((uint64_t) t*args.n_head + h)*D;
    for (short i = 0; i < MINI_ATTN_DPL; ++i) {
        const uint d = tiisg + N_SIMDWIDTH*i;
        if (d < D) {
            y[d] = out[i] / L;
        }
    }
}
