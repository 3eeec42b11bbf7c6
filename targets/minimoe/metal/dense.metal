// minimoe Metal: embedding rows, dense mat-vec projections, diagnostics.
//
// Weights are read straight from the memory-mapped GGUF (the host wraps the
// map in one no-copy MTLBuffer and binds it at the tensor's byte offset), so
// every weight pointer here is `device const char *` and rows are addressed
// with the row size in bytes.

// ---- Embedding ----------------------------------------------------------------

struct mini_args_get_rows {
    uint32_t n_embd;
    uint32_t n_tokens;
};

// dst[t][:] = F16 row tokens[t] of the table, widened to float.  Token ids were
// range-checked by the host before this dispatch.
// grid: (n_tokens, 1, 1)   threadgroup: (min(n_embd, 256), 1, 1)
kernel void kernel_get_rows_f16(
        constant mini_args_get_rows & args [[buffer(0)]],
        device const char    * table  [[buffer(1)]],
        device const int32_t * tokens [[buffer(2)]],
        device       float   * dst    [[buffer(3)]],
        uint   tgpig [[threadgroup_position_in_grid]],
        ushort tpitg [[thread_position_in_threadgroup]],
        ushort ntg   [[threads_per_threadgroup]]) {
    const int32_t tok = tokens[tgpig];
    device const half * row = (device const half *) (table + (uint64_t) tok * args.n_embd * sizeof(half));
    device float * y = dst + (uint64_t) tgpig * args.n_embd;
    for (uint i = tpitg; i < args.n_embd; i += ntg) {
        y[i] = float(row[i]);
    }
}

// ---- Quantized mat-vec ---------------------------------------------------------

struct mini_args_mul_mv {
    uint64_t in_dim;      // values per weight row (a multiple of the block size)
    uint64_t out_dim;     // weight rows
    uint64_t n_tok;       // input rows
    uint64_t row_bytes;   // bytes of one weight row
};

// y[t][r] = sum_i W[r][i] * x[t][i] for one quant block type.
//
// One threadgroup computes MINI_MV_NSG consecutive output rows for one token:
// simdgroup s owns row tgpig.x*MINI_MV_NSG + s and its 32 lanes stride over the
// row's blocks.  The token's input row is staged through threadgroup memory in
// chunks of MINI_MV_CHUNK floats, shared by the four rows.
// grid: (ceil(out_dim / MINI_MV_NSG), n_tok, 1)   threadgroup: (MINI_MV_NSG*32, 1, 1)
// threadgroup memory: MINI_MV_CHUNK floats at index 0
template <typename block_t>
kernel void kernel_mul_mv(
        constant mini_args_mul_mv & args [[buffer(0)]],
        device const char  * src0  [[buffer(1)]],
        device const float * src1  [[buffer(2)]],
        device       float * dst   [[buffer(3)]],
        threadgroup  float * shmem [[threadgroup(0)]],
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort tpitg [[thread_index_in_threadgroup]],
        ushort tiisg [[thread_index_in_simdgroup]],
        ushort sgitg [[simdgroup_index_in_threadgroup]]) {
    constexpr short QK = block_traits<block_t>::qk;

    const uint64_t row = (uint64_t) tgpig.x * MINI_MV_NSG + sgitg;
    const uint64_t tok = tgpig.y;

    device const float   * x = src1 + tok * args.in_dim;
    device const block_t * w = (device const block_t *) (src0 + row * args.row_bytes);

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
        dst[tok*args.out_dim + row] = sumf;
    }
}

typedef decltype(kernel_mul_mv<block_q8_0>) mul_mv_t;

template [[host_name("kernel_mul_mv_q8_0_f32")]] kernel mul_mv_t kernel_mul_mv<block_q8_0>;
template [[host_name("kernel_mul_mv_q4_k_f32")]] kernel mul_mv_t kernel_mul_mv<block_q4_k>;

// F16 weights have no block structure and any in_dim: each lane strides over
// the row directly, no staging.  Same grid and threadgroup as kernel_mul_mv.
kernel void kernel_mul_mv_f16_f32(
        constant mini_args_mul_mv & args [[buffer(0)]],
        device const char  * src0 [[buffer(1)]],
        device const float * src1 [[buffer(2)]],
        device       float * dst  [[buffer(3)]],
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort tiisg [[thread_index_in_simdgroup]],
        ushort sgitg [[simdgroup_index_in_threadgroup]]) {
    const uint64_t row = (uint64_t) tgpig.x * MINI_MV_NSG + sgitg;
    const uint64_t tok = tgpig.y;
    if (row >= args.out_dim) {
        return;
    }

    device const half  * w = (device const half *) (src0 + row * args.row_bytes);
    device const float * x = src1 + tok * args.in_dim;

    float sumf = 0.0f;
    for (uint64_t i = tiisg; i < args.in_dim; i += N_SIMDWIDTH) {
        sumf += float(w[i]) * x[i];
    }
    sumf = simd_sum(sumf);
    if (tiisg == 0) {
        dst[tok*args.out_dim + row] = sumf;
    }
}

// First Q4_K mat-vec, from the model revision whose attention weights were
// Q4_K: one thread per output value, decoding each block from device memory.
// Superseded by kernel_mul_mv<block_q4_k> and no longer dispatched.
// grid: (ceil(out_dim*n_tok / 64), 1, 1)   threadgroup: (64, 1, 1)
kernel void kernel_mul_mv_q4_k_f32_v0(
        constant mini_args_mul_mv & args [[buffer(0)]],
        device const char  * src0 [[buffer(1)]],
        device const float * src1 [[buffer(2)]],
        device       float * dst  [[buffer(3)]],
        uint tpig [[thread_position_in_grid]]) {
    if (tpig >= args.out_dim * args.n_tok) {
        return;
    }
    const uint64_t row = tpig % args.out_dim;
    const uint64_t tok = tpig / args.out_dim;

    device const block_q4_k * w = (device const block_q4_k *) (src0 + row * args.row_bytes);
    device const float      * x = src1 + tok * args.in_dim;

    float sumf = 0.0f;
    for (uint64_t ib = 0; ib < args.in_dim/QK_K; ++ib) {
        device const block_q4_k * b = w + ib;
        for (short j = 0; j < QK_K/32; ++j) {
            float sc, mn;
            get_scale_min_k4(j, b->scales, sc, mn);
            const float dl = float(b->d) * sc;
            const float ml = float(b->dmin) * mn;
            for (short l = 0; l < 32; ++l) {
                const uint8_t q = b->qs[32*(j/2) + l];
                const float v = float((j & 1) ? (q >> 4) : (q & 0xF));
                sumf += (dl*v - ml) * x[ib*QK_K + 32*j + l];
            }
        }
    }
    dst[tok*args.out_dim + row] = sumf;
}

// ---- Diagnostics ------------------------------------------------------------------

struct mini_args_checksum {
    uint64_t n;
};

// checksum[0] = sum x[i], checksum[1] = sum x[i]^2, by one threadgroup.
// grid: (1, 1, 1)   threadgroup: (1024, 1, 1)
kernel void kernel_debug_checksum_f32(
        constant mini_args_checksum & args [[buffer(0)]],
        device const float * x        [[buffer(1)]],
        device       float * checksum [[buffer(2)]],
        threadgroup  float * shmem    [[threadgroup(0)]],
        ushort tpitg [[thread_index_in_threadgroup]],
        ushort tiisg [[thread_index_in_simdgroup]],
        ushort sgitg [[simdgroup_index_in_threadgroup]],
        ushort ntg   [[threads_per_threadgroup]]) {
    float s = 0.0f, s2 = 0.0f;
    for (uint64_t i = tpitg; i < args.n; i += ntg) {
        const float v = x[i];
        s  += v;
        s2 += v*v;
    }
    const ushort nsg = (ntg + N_SIMDWIDTH - 1) / N_SIMDWIDTH;
    s  = threadgroup_sum(s,  shmem, tiisg, sgitg, nsg);
    s2 = threadgroup_sum(s2, shmem, tiisg, sgitg, nsg);
    if (tpitg == 0) {
        checksum[0] = s;
        checksum[1] = s2;
    }
}

struct mini_args_dump {
    uint64_t n;
    uint64_t stride;
};

// Copies every stride-th value of x into a debug buffer.  A leftover of the
// bring-up; nothing on the host dispatches it.
kernel void kernel_debug_dump_f32(
        constant mini_args_dump & args [[buffer(0)]],
        device const float * x   [[buffer(1)]],
        device       float * out [[buffer(2)]],
        uint tpig [[thread_position_in_grid]]) {
    if (tpig < args.n) {
        out[tpig] = x[(uint64_t) tpig * args.stride];
    }
}
