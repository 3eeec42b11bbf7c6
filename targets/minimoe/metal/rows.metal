// minimoe Metal: per-row and elementwise ops — RMS norms, tail RoPE, residual
// add and SwiGLU.

// ---- RMS norm -----------------------------------------------------------------

struct mini_args_rms_norm {
    uint32_t n;          // values per row
    uint32_t n_rows;
    float    eps;
};

// y[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps)          (F == 1, plain)
// y[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * w[i]   (F == 2, weighted)
// One threadgroup per row; the sum of squares is reduced with simd_sum inside
// each simdgroup and across simdgroups through threadgroup memory.  The plain
// variant gets x bound again at index 2 in place of the weight.
// grid: (n_rows, 1, 1)   threadgroup: (min(1024, round_up(n, 32)), 1, 1)
// threadgroup memory: 32 floats at index 0
template <short F>
kernel void kernel_rms_norm(
        constant mini_args_rms_norm & args [[buffer(0)]],
        device const float * src0  [[buffer(1)]],
        device const float * w     [[buffer(2)]],
        device       float * dst   [[buffer(3)]],
        threadgroup  float * shmem [[threadgroup(0)]],
        uint   tgpig [[threadgroup_position_in_grid]],
        ushort tpitg [[thread_index_in_threadgroup]],
        ushort tiisg [[thread_index_in_simdgroup]],
        ushort sgitg [[simdgroup_index_in_threadgroup]],
        ushort ntg   [[threads_per_threadgroup]]) {
    device const float * x = src0 + (uint64_t) tgpig * args.n;
    device       float * y = dst  + (uint64_t) tgpig * args.n;

    float sumf = 0.0f;
    for (uint i = tpitg; i < args.n; i += ntg) {
        sumf += x[i] * x[i];
    }
    const ushort nsg = (ntg + N_SIMDWIDTH - 1) / N_SIMDWIDTH;
    sumf = threadgroup_sum(sumf, shmem, tiisg, sgitg, nsg);

    const float scale = 1.0f / sqrt(sumf / float(args.n) + args.eps);

    // Every thread has read its x values before any y is written, so y may be x.
    threadgroup_barrier(mem_flags::mem_device);
    for (uint i = tpitg; i < args.n; i += ntg) {
        if (F == 1) {
            y[i] = x[i] * scale;
        } else {
            y[i] = (x[i] * scale) * w[i];
        }
    }
}

typedef decltype(kernel_rms_norm<1>) rms_norm_t;

template [[host_name("kernel_rms_norm_plain_f32")]]  kernel rms_norm_t kernel_rms_norm<1>;
template [[host_name("kernel_rms_norm_weight_f32")]] kernel rms_norm_t kernel_rms_norm<2>;

// ---- Tail RoPE ------------------------------------------------------------------

struct mini_args_rope_tail {
    uint32_t n_tokens;
    uint32_t n_head;
    uint32_t head_dim;
    uint32_t n_rot;      // rotated dims at the end of each head (even)
    uint32_t pos0;
    float    freq_base;
};

// In place.  Only the last n_rot dims of each head rotate; the pairs are
// adjacent inside that tail (ds4's "tail" RoPE), token t is at pos0 + t and
// pair j turns by theta_j = pos * freq_base^(-2j/n_rot).
// grid: (n_head, n_tokens, 1)   threadgroup: (n_rot/2, 1, 1)
kernel void kernel_rope_tail_f32(
        constant mini_args_rope_tail & args [[buffer(0)]],
        device float * x [[buffer(1)]],
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort tpitg [[thread_position_in_threadgroup]]) {
    const uint h = tgpig.x;
    const uint t = tgpig.y;
    const uint j = tpitg;
    if (j >= args.n_rot/2) {
        return;
    }

    const float pos   = float(args.pos0 + t);
    const float theta = pos * pow(args.freq_base, -2.0f*float(j)/float(args.n_rot));
    const float c = cos(theta);
    const float s = sin(theta);

    device float * p = x + ((uint64_t) t*args.n_head + h)*args.head_dim + (args.head_dim - args.n_rot) + 2*j;
    const float x0 = p[0];
    const float x1 = p[1];
    p[0] = x0*c - x1*s;
    p[1] = x0*s + x1*c;
}

// ---- Elementwise ------------------------------------------------------------------

struct mini_args_elementwise {
    uint64_t n;
};

// dst[i] = a[i] + b[i]; dst may be a (the residual stream is updated in place).
// grid: (ceil(n / 256), 1, 1)   threadgroup: (256, 1, 1)
kernel void kernel_add_f32(
        constant mini_args_elementwise & args [[buffer(0)]],
        device const float * a   [[buffer(1)]],
        device const float * b   [[buffer(2)]],
        device       float * dst [[buffer(3)]],
        uint tpig [[thread_position_in_grid]]) {
    if (tpig < args.n) {
        dst[tpig] = a[tpig] + b[tpig];
    }
}

// dst[i] = silu(gate[i]) * up[i].
// grid: (ceil(n / 256), 1, 1)   threadgroup: (256, 1, 1)
kernel void kernel_swiglu_f32(
        constant mini_args_elementwise & args [[buffer(0)]],
        device const float * gate [[buffer(1)]],
        device const float * up   [[buffer(2)]],
        device       float * dst  [[buffer(3)]],
        uint tpig [[thread_position_in_grid]]) {
    if (tpig < args.n) {
        const float g = gate[tpig];
        dst[tpig] = (g / (1.0f + exp(-g))) * up[tpig];
    }
}
