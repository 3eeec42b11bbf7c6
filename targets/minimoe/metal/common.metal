// minimoe Metal: definitions shared by every kernel file.
//
// mini_metal.m concatenates this file first and then dense.metal, rows.metal,
// attention.metal and moe.metal into one source string and builds a single
// MTLLibrary from it, so the block layouts, tables and dot helpers below are
// visible to all kernels.  Nothing here is a kernel.

#include <metal_stdlib>
using namespace metal;

#define N_SIMDWIDTH 32

#define QK8_0 32          // values per Q8_0 block
#define QK_K  256         // values per K-quant / IQ2 super-block

// Mat-vec kernels: rows per threadgroup (one simdgroup per output row) and how
// many floats of the input row are staged in threadgroup memory per pass.  The
// chunk is a multiple of QK_K so no quant block straddles two passes.
#define MINI_MV_NSG   4
#define MINI_MV_CHUNK 2048

// ---- GGML block layouts (byte-exact with the GGUF file) -------------------

typedef struct {
    half   d;                   // scale
    int8_t qs[QK8_0];           // value = d * q
} block_q8_0;                   // 34 bytes

typedef struct {
    half    d;                  // super-block scale for the 6-bit scales
    half    dmin;               // super-block scale for the 6-bit mins
    uint8_t scales[12];         // 8 (scale, min) pairs, 6 bits each, packed
    uint8_t qs[QK_K/2];         // 4-bit quants, two per byte
} block_q4_k;                   // 144 bytes

typedef struct {
    uint8_t scales[QK_K/16];    // per 16 values: low nibble scale, high nibble min
    uint8_t qs[QK_K/4];         // 2-bit quants, four per byte
    half    d;
    half    dmin;
} block_q2_k;                   // 84 bytes

typedef struct {
    half     d;
    uint16_t qs[QK_K/8];        // per 32 values: 4 grid indices, 4x7 sign bits, 4-bit scale
} block_iq2_xxs;                // 66 bytes

template <typename block_t> struct block_traits;
template <> struct block_traits<block_q8_0>    { enum { qk = QK8_0 }; };
template <> struct block_traits<block_q4_k>    { enum { qk = QK_K  }; };
template <> struct block_traits<block_q2_k>    { enum { qk = QK_K  }; };
template <> struct block_traits<block_iq2_xxs> { enum { qk = QK_K  }; };

// ---- IQ2_XXS tables ---------------------------------------------------------

// The IQ2_XXS codebook, a constant of the format: 256 entries of 8 magnitudes
// (0x08, 0x19 or 0x2b), entry i stored as one little-endian ulong.
constant ulong iq2xxs_grid[256] = {
    0x0808080808080808UL, 0x080808080808082bUL, 0x0808080808081919UL, 0x0808080808082b08UL,
    0x0808080808082b2bUL, 0x0808080808190819UL, 0x0808080808191908UL, 0x08080808082b0808UL,
    0x08080808082b082bUL, 0x08080808082b2b08UL, 0x08080808082b2b2bUL, 0x0808080819080819UL,
    0x0808080819081908UL, 0x0808080819190808UL, 0x0808080819192b08UL, 0x08080808192b0819UL,
    0x08080808192b1908UL, 0x080808082b080808UL, 0x080808082b08082bUL, 0x080808082b082b2bUL,
    0x080808082b2b082bUL, 0x0808081908080819UL, 0x0808081908081908UL, 0x0808081908190808UL,
    0x0808081908191919UL, 0x0808081919080808UL, 0x080808192b081908UL, 0x080808192b192b08UL,
    0x0808082b08080808UL, 0x0808082b0808082bUL, 0x0808082b082b082bUL, 0x0808082b2b08082bUL,
    0x0808190808080819UL, 0x0808190808081908UL, 0x0808190808190808UL, 0x08081908082b0819UL,
    0x08081908082b1908UL, 0x0808190819080808UL, 0x080819081908082bUL, 0x0808190819082b08UL,
    0x08081908192b0808UL, 0x080819082b080819UL, 0x080819082b081908UL, 0x080819082b190808UL,
    0x080819082b2b1908UL, 0x0808191908080808UL, 0x080819190808082bUL, 0x0808191908082b08UL,
    0x08081919082b0808UL, 0x080819191908192bUL, 0x08081919192b2b19UL, 0x080819192b080808UL,
    0x080819192b190819UL, 0x0808192b08082b19UL, 0x0808192b08190808UL, 0x0808192b19080808UL,
    0x0808192b2b081908UL, 0x0808192b2b2b1908UL, 0x08082b0808080808UL, 0x08082b0808081919UL,
    0x08082b0808082b08UL, 0x08082b0808191908UL, 0x08082b08082b2b08UL, 0x08082b0819080819UL,
    0x08082b0819081908UL, 0x08082b0819190808UL, 0x08082b081919082bUL, 0x08082b082b082b08UL,
    0x08082b1908081908UL, 0x08082b1919080808UL, 0x08082b2b0808082bUL, 0x08082b2b08191908UL,
    0x0819080808080819UL, 0x0819080808081908UL, 0x0819080808190808UL, 0x08190808082b0819UL,
    0x0819080819080808UL, 0x08190808192b0808UL, 0x081908082b081908UL, 0x081908082b190808UL,
    0x081908082b191919UL, 0x0819081908080808UL, 0x0819081908082b08UL, 0x08190819082b0808UL,
    0x0819081919190808UL, 0x0819081919192b2bUL, 0x081908192b080808UL, 0x0819082b082b1908UL,
    0x0819082b19081919UL, 0x0819190808080808UL, 0x0819190808082b08UL, 0x08191908082b0808UL,
    0x08191908082b1919UL, 0x0819190819082b19UL, 0x081919082b080808UL, 0x0819191908192b08UL,
    0x08191919192b082bUL, 0x0819192b08080808UL, 0x0819192b0819192bUL, 0x08192b0808080819UL,
    0x08192b0808081908UL, 0x08192b0808190808UL, 0x08192b0819080808UL, 0x08192b082b080819UL,
    0x08192b1908080808UL, 0x08192b1908081919UL, 0x08192b192b2b0808UL, 0x08192b2b19190819UL,
    0x082b080808080808UL, 0x082b08080808082bUL, 0x082b080808082b2bUL, 0x082b080819081908UL,
    0x082b0808192b0819UL, 0x082b08082b080808UL, 0x082b08082b08082bUL, 0x082b0819082b2b19UL,
    0x082b081919082b08UL, 0x082b082b08080808UL, 0x082b082b0808082bUL, 0x082b190808080819UL,
    0x082b190808081908UL, 0x082b190808190808UL, 0x082b190819080808UL, 0x082b19081919192bUL,
    0x082b191908080808UL, 0x082b191919080819UL, 0x082b1919192b1908UL, 0x082b192b2b190808UL,
    0x082b2b0808082b08UL, 0x082b2b08082b0808UL, 0x082b2b082b191908UL, 0x082b2b2b19081908UL,
    0x1908080808080819UL, 0x1908080808081908UL, 0x1908080808190808UL, 0x1908080808192b08UL,
    0x19080808082b0819UL, 0x19080808082b1908UL, 0x1908080819080808UL, 0x1908080819082b08UL,
    0x190808081919192bUL, 0x19080808192b0808UL, 0x190808082b080819UL, 0x190808082b081908UL,
    0x190808082b190808UL, 0x1908081908080808UL, 0x19080819082b0808UL, 0x19080819192b0819UL,
    0x190808192b080808UL, 0x190808192b081919UL, 0x1908082b08080819UL, 0x1908082b08190808UL,
    0x1908082b19082b08UL, 0x1908082b1919192bUL, 0x1908082b192b2b08UL, 0x1908190808080808UL,
    0x1908190808082b08UL, 0x19081908082b0808UL, 0x190819082b080808UL, 0x190819082b192b19UL,
    0x190819190819082bUL, 0x19081919082b1908UL, 0x1908192b08080808UL, 0x19082b0808080819UL,
    0x19082b0808081908UL, 0x19082b0808190808UL, 0x19082b0819080808UL, 0x19082b0819081919UL,
    0x19082b1908080808UL, 0x19082b1919192b08UL, 0x19082b19192b0819UL, 0x19082b192b08082bUL,
    0x19082b2b19081919UL, 0x19082b2b2b190808UL, 0x1919080808080808UL, 0x1919080808082b08UL,
    0x1919080808190819UL, 0x1919080808192b19UL, 0x19190808082b0808UL, 0x191908082b080808UL,
    0x191908082b082b08UL, 0x1919081908081908UL, 0x191908191908082bUL, 0x191908192b2b1908UL,
    0x1919082b2b190819UL, 0x191919082b190808UL, 0x191919082b19082bUL, 0x1919191908082b2bUL,
    0x1919192b08080819UL, 0x1919192b19191908UL, 0x19192b0808080808UL, 0x19192b0808190819UL,
    0x19192b0808192b19UL, 0x19192b08192b1908UL, 0x19192b1919080808UL, 0x19192b2b08082b08UL,
    0x192b080808081908UL, 0x192b080808190808UL, 0x192b080819080808UL, 0x192b0808192b2b08UL,
    0x192b081908080808UL, 0x192b081919191919UL, 0x192b082b08192b08UL, 0x192b082b192b0808UL,
    0x192b190808080808UL, 0x192b190808081919UL, 0x192b191908190808UL, 0x192b19190819082bUL,
    0x192b19192b081908UL, 0x192b2b081908082bUL, 0x2b08080808080808UL, 0x2b0808080808082bUL,
    0x2b08080808082b2bUL, 0x2b08080819080819UL, 0x2b0808082b08082bUL, 0x2b08081908081908UL,
    0x2b08081908192b08UL, 0x2b08081919080808UL, 0x2b08082b08190819UL, 0x2b08190808080819UL,
    0x2b08190808081908UL, 0x2b08190808190808UL, 0x2b08190808191919UL, 0x2b08190819080808UL,
    0x2b081908192b0808UL, 0x2b08191908080808UL, 0x2b0819191908192bUL, 0x2b0819192b191908UL,
    0x2b08192b08082b19UL, 0x2b08192b19080808UL, 0x2b08192b192b0808UL, 0x2b082b080808082bUL,
    0x2b082b1908081908UL, 0x2b082b2b08190819UL, 0x2b19080808081908UL, 0x2b19080808190808UL,
    0x2b190808082b1908UL, 0x2b19080819080808UL, 0x2b1908082b2b0819UL, 0x2b1908190819192bUL,
    0x2b1908192b080808UL, 0x2b19082b19081919UL, 0x2b19190808080808UL, 0x2b191908082b082bUL,
    0x2b19190819081908UL, 0x2b19191919190819UL, 0x2b192b082b080819UL, 0x2b192b19082b0808UL,
    0x2b2b08080808082bUL, 0x2b2b080819190808UL, 0x2b2b08082b081919UL, 0x2b2b081908082b19UL,
    0x2b2b082b08080808UL, 0x2b2b190808192b08UL, 0x2b2b2b0819190808UL, 0x2b2b2b1908081908UL,
};

// 7 stored sign bits; the 8th makes the number of negative signs even.
static inline uint8_t iq2xxs_signs(uint s7) {
    return uint8_t(s7 | ((popcount(s7) & 1u) << 7));
}

// ---- Block dot products against a staged input chunk ---------------------
//
// block_dot(b, y) = sum over the block's values of W[i] * y[i], where y points
// at the block's first input value in threadgroup memory.

static inline float block_dot(device const block_q8_0 * b, threadgroup const float * y) {
    float sum = 0.0f;
    for (short i = 0; i < QK8_0; i += 4) {
        const float4 q = float4(b->qs[i + 0], b->qs[i + 1], b->qs[i + 2], b->qs[i + 3]);
        sum += dot(q, *((threadgroup const float4 *) (y + i)));
    }
    return sum * float(b->d);
}

static inline void get_scale_min_k4(short j, device const uint8_t * q, thread float & sc, thread float & mn) {
    if (j < 4) {
        sc = float(q[j] & 63);
        mn = float(q[j + 4] & 63);
    } else {
        sc = float((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        mn = float((q[j + 4] >>  4) | ((q[j    ] >> 6) << 4));
    }
}

static inline float block_dot(device const block_q4_k * b, threadgroup const float * y) {
    const float d    = float(b->d);
    const float dmin = float(b->dmin);
    float sum = 0.0f;
    // Four chunks of 64 values: the low nibbles of 32 bytes, then their high nibbles.
    for (short c = 0; c < 4; ++c) {
        device const uint8_t * q = b->qs + 32*c;
        float sc0, m0, sc1, m1;
        get_scale_min_k4(2*c + 0, b->scales, sc0, m0);
        get_scale_min_k4(2*c + 1, b->scales, sc1, m1);
        float dot_lo = 0.0f, dot_hi = 0.0f, sum_lo = 0.0f, sum_hi = 0.0f;
        for (short l = 0; l < 32; ++l) {
            const float ylo = y[64*c + l];
            const float yhi = y[64*c + 32 + l];
            dot_lo += float(q[l] & 0xF) * ylo;
            dot_hi += float(q[l] >>  4) * yhi;
            sum_lo += ylo;
            sum_hi += yhi;
        }
        sum += d*(sc0*dot_lo + sc1*dot_hi) - dmin*(m0*sum_lo + m1*sum_hi);
    }
    return sum;
}

static inline float block_dot(device const block_q2_k * b, threadgroup const float * y) {
    const float d    = float(b->d);
    const float dmin = float(b->dmin);
    float sum = 0.0f;
    // Two halves of 128 values; each reads its 32 bytes of qs at shifts 0,2,4,6;
    // every 16 values use the next scale byte.
    for (short h = 0; h < 2; ++h) {
        for (short j = 0; j < 4; ++j) {
            for (short g = 0; g < 2; ++g) {
                const uint8_t sc = b->scales[8*h + 2*j + g];
                device const uint8_t * q = b->qs + 32*h + 16*g;
                threadgroup const float * yy = y + 128*h + 32*j + 16*g;
                float dq = 0.0f, sy = 0.0f;
                for (short l = 0; l < 16; ++l) {
                    dq += float((q[l] >> (2*j)) & 3) * yy[l];
                    sy += yy[l];
                }
                sum += d*float(sc & 0xF)*dq - dmin*float(sc >> 4)*sy;
            }
        }
    }
    return sum;
}

static inline float block_dot(device const block_iq2_xxs * b, threadgroup const float * y) {
    const float d = float(b->d);
    float sum = 0.0f;
    for (short ib = 0; ib < QK_K/32; ++ib) {
        device const uint16_t * q2 = b->qs + 4*ib;
        const uint aux0 = uint(q2[0]) | (uint(q2[1]) << 16);   // four grid indices
        const uint aux1 = uint(q2[2]) | (uint(q2[3]) << 16);   // four sign indices + scale
        const float db = d * (0.5f + float(aux1 >> 28)) * 0.25f;
        float s = 0.0f;
        for (short l = 0; l < 4; ++l) {
            constant uint8_t * grid = (constant uint8_t *) (iq2xxs_grid + ((aux0 >> (8*l)) & 0xFF));
            const uint8_t signs = iq2xxs_signs((aux1 >> (7*l)) & 127);
            threadgroup const float * yy = y + 32*ib + 8*l;
            for (short j = 0; j < 8; ++j) {
                const float v = float(grid[j]) * yy[j];
                s += (signs & (1 << j)) ? -v : v;
            }
        }
        sum += db * s;
    }
    return sum;
}

// ---- Reductions ------------------------------------------------------------

// Sum of one float per thread over the whole threadgroup (up to 32 simdgroups).
// shmem holds N_SIMDWIDTH floats.  Every thread gets the total.
static inline float threadgroup_sum(float v, threadgroup float * shmem, ushort tiisg, ushort sgitg, ushort nsg) {
    v = simd_sum(v);
    threadgroup_barrier(mem_flags::mem_threadgroup);   // shmem may still be read by a previous call
    if (sgitg == 0) {
        shmem[tiisg] = 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tiisg == 0) {
        shmem[sgitg] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    v = tiisg < nsg ? shmem[tiisg] : 0.0f;
    return simd_sum(v);
}
