/* mini_cpu.c — the CPU backend of minimoe.
 *
 * Implements every function of mini_gpu.h on host memory.  It is the
 * reference backend: the engine runs on it end to end, and the parity tests
 * load it as a shared library (libmini_cpu.so) and compare it with numpy.  It
 * therefore favours being obviously right over being fast: quant blocks are
 * decoded to double, dot products accumulate in double, every size and byte
 * range is checked before anything is written, and an op that fails writes
 * nothing.
 *
 * A tensor is a malloc'ed buffer.  A view points into its base's buffer and
 * never frees it.  The struct has the same three fields, in the same order, as
 * the CUDA backend's (cuda/mini_cuda.cuh), so a ctypes caller can build one
 * around its own buffer (owner = 0) to fence it with guard bytes.
 */

#include "mini_gpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The accumulator of the matmul and attention dot products.  double is the
 * reference; porter's e2e calibration also builds this backend with
 * -DMINI_CPU_DOT=float (sums rounded like a GPU's float accumulators) as a
 * known-good backend that differs from the reference only by round-off. */
#ifndef MINI_CPU_DOT
#define MINI_CPU_DOT double
#endif

struct mini_gpu_tensor {
    void    *data;    /* host pointer (already offset for views) */
    uint64_t bytes;   /* usable bytes from data */
    int32_t  owner;   /* 1: data was malloc'ed by this tensor; 0: a view / foreign buffer */
};

/* ---- Block layouts (GGML) ------------------------------------------------ */

#define QK8_0 32      /* Q8_0:    f16 d, int8 qs[32]                                  = 34 bytes  */
#define QK_K  256     /* K-quants and IQ2: super-blocks of 256 values                  */
#define Q8_0_BYTES    34
#define Q2_K_BYTES    84   /* uint8 scales[16], uint8 qs[64], f16 d, f16 dmin           */
#define Q4_K_BYTES    144  /* f16 d, f16 dmin, uint8 scales[12], uint8 qs[128]         */
#define IQ2_XXS_BYTES 66   /* f16 d, uint16 qs[32]                                      */

/* IQ2_XXS codebook: 256 entries of 8 magnitudes, one byte each (0x08, 0x19
 * or 0x2b), entry i packed little-endian into a uint64.  This is a constant
 * of the GGUF format (ggml's iq2xxs_grid). */
static const uint64_t iq2xxs_grid[256] = {
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

/* IQ2_XXS sign patterns: 7 stored bits, the 8th makes the count of negative
 * signs even (ggml's ksigns_iq2xs[i] = i | parity(i) << 7). */
static uint8_t iq2xxs_signs(uint32_t i7) {
    uint32_t v = i7 & 127u, p = v;
    p ^= p >> 4; p ^= p >> 2; p ^= p >> 1;
    return (uint8_t)(v | ((p & 1u) << 7));
}

static double f16_to_double(uint16_t h) {
    const int sign = (h >> 15) & 1;
    const int exp  = (h >> 10) & 0x1f;
    const int mant = h & 0x3ff;
    double v;
    if (exp == 0)       v = ldexp((double)mant, -24);                 /* zero / subnormal */
    else if (exp == 31) v = mant ? NAN : INFINITY;
    else                v = ldexp((double)(mant | 0x400), exp - 25);
    return sign ? -v : v;
}

static uint16_t rd_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Decoders: one block to its values, in order along the row. */

static void dequant_q8_0(const uint8_t *b, double *y) {
    const double d = f16_to_double(rd_u16(b));
    for (int i = 0; i < QK8_0; i++) y[i] = d * (double)(int8_t)b[2 + i];
}

static void dequant_q2_k(const uint8_t *b, double *y) {
    const uint8_t *scales = b;
    const uint8_t *qs     = b + 16;
    const double d    = f16_to_double(rd_u16(b + 80));
    const double dmin = f16_to_double(rd_u16(b + 82));
    /* Two halves of 128 values; each half reads 32 bytes of qs four times
     * (shifts 0,2,4,6), every 16 values take the next scale byte. */
    for (int half = 0; half < 2; half++) {
        for (int j = 0; j < 4; j++) {
            for (int l = 0; l < 32; l++) {
                const int idx = half * 128 + j * 32 + l;
                const uint8_t sc = scales[idx / 16];
                const int q = (qs[half * 32 + l] >> (2 * j)) & 3;
                y[idx] = d * (double)(sc & 0xf) * q - dmin * (double)(sc >> 4);
            }
        }
    }
}

static void q4_k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4)  | ((s[j]     >> 6) << 4);
    }
}

static void dequant_q4_k(const uint8_t *b, double *y) {
    const double d    = f16_to_double(rd_u16(b));
    const double dmin = f16_to_double(rd_u16(b + 2));
    const uint8_t *scales = b + 4;
    const uint8_t *qs     = b + 16;
    /* Four chunks of 64 values: 32 low nibbles then 32 high nibbles of the
     * same 32 bytes; sub-block j = 2*chunk + (0 low | 1 high). */
    for (int c = 0; c < 4; c++) {
        for (int s = 0; s < 2; s++) {
            int sc, mn;
            q4_k_scale_min(scales, 2 * c + s, &sc, &mn);
            for (int l = 0; l < 32; l++) {
                const int q = (qs[c * 32 + l] >> (4 * s)) & 0xf;
                y[c * 64 + s * 32 + l] = d * sc * q - dmin * mn;
            }
        }
    }
}

static void dequant_iq2_xxs(const uint8_t *b, double *y) {
    const double d = f16_to_double(rd_u16(b));
    const uint8_t *qs = b + 2;
    /* Eight groups of 32 values, each described by two uint32: the first
     * holds four grid indices (one byte each), the second four 7-bit sign
     * indices and, in its top 4 bits, the group scale. */
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t aux0 = rd_u32(qs + 8 * ib);
        const uint32_t aux1 = rd_u32(qs + 8 * ib + 4);
        const double db = d * (0.5 + (double)(aux1 >> 28)) * 0.25;
        for (int l = 0; l < 4; l++) {
            const uint64_t g = iq2xxs_grid[(aux0 >> (8 * l)) & 0xff];
            const uint8_t signs = iq2xxs_signs(aux1 >> (7 * l));
            for (int j = 0; j < 8; j++) {
                const double m = (double)((g >> (8 * j)) & 0xff);
                y[ib * 32 + l * 8 + j] = db * m * ((signs >> j) & 1 ? -1.0 : 1.0);
            }
        }
    }
}

/* ---- Argument checks ------------------------------------------------------ */

/* [offset, offset+bytes) lies inside a map of `size` bytes. */
static int range_ok(uint64_t offset, uint64_t bytes, uint64_t size) {
    return offset <= size && bytes <= size - offset;
}

/* a*b without wrapping; 0 on overflow (callers treat that as too big). */
static int mul_ok(uint64_t a, uint64_t b, uint64_t *r) {
    if (a != 0 && b > UINT64_MAX / a) return 0;
    *r = a * b;
    return 1;
}

/* The tensor holds at least count elements of elem_bytes. */
static int holds(const mini_gpu_tensor *t, uint64_t count, uint64_t elem_bytes) {
    uint64_t need;
    if (!t || !mul_ok(count, elem_bytes, &need)) return 0;
    if (need > 0 && !t->data) return 0;
    return t->bytes >= need;
}

static int model_ok(const void *map, uint64_t size, uint64_t offset, uint64_t bytes) {
    return map != NULL && range_ok(offset, bytes, size);
}

#define F32(t)  ((float *)(t)->data)
#define CF32(t) ((const float *)(t)->data)
#define CI32(t) ((const int32_t *)(t)->data)

/* ---- Runtime and tensor lifetime ----------------------------------------- */

int mini_gpu_init(void) { return 0; }

void mini_gpu_cleanup(void) {}

mini_gpu_tensor *mini_gpu_tensor_alloc(uint64_t bytes) {
    if (bytes > (uint64_t)SIZE_MAX) return NULL;
    mini_gpu_tensor *t = (mini_gpu_tensor *)calloc(1, sizeof *t);
    if (!t) return NULL;
    t->data = calloc(1, bytes ? (size_t)bytes : 1);
    if (!t->data) {
        free(t);
        return NULL;
    }
    t->bytes = bytes;
    t->owner = 1;
    return t;
}

mini_gpu_tensor *mini_gpu_tensor_view(const mini_gpu_tensor *base, uint64_t offset, uint64_t bytes) {
    if (!base || !range_ok(offset, bytes, base->bytes)) return NULL;
    mini_gpu_tensor *t = (mini_gpu_tensor *)calloc(1, sizeof *t);
    if (!t) return NULL;
    t->data  = (uint8_t *)base->data + offset;
    t->bytes = bytes;
    t->owner = 0;
    return t;
}

void mini_gpu_tensor_free(mini_gpu_tensor *tensor) {
    if (!tensor) return;
    if (tensor->owner) free(tensor->data);
    free(tensor);
}

uint64_t mini_gpu_tensor_bytes(const mini_gpu_tensor *tensor) {
    return tensor ? tensor->bytes : 0;
}

int mini_gpu_tensor_write(mini_gpu_tensor *tensor, uint64_t offset, const void *data, uint64_t bytes) {
    if (!tensor || !range_ok(offset, bytes, tensor->bytes)) return 1;
    if (bytes == 0) return 0;
    if (!data) return 1;
    memmove((uint8_t *)tensor->data + offset, data, (size_t)bytes);
    return 0;
}

int mini_gpu_tensor_read(const mini_gpu_tensor *tensor, uint64_t offset, void *data, uint64_t bytes) {
    if (!tensor || !range_ok(offset, bytes, tensor->bytes)) return 1;
    if (bytes == 0) return 0;
    if (!data) return 1;
    memmove(data, (const uint8_t *)tensor->data + offset, (size_t)bytes);
    return 0;
}

int mini_gpu_tensor_copy(mini_gpu_tensor *dst, uint64_t dst_offset,
                         const mini_gpu_tensor *src, uint64_t src_offset,
                         uint64_t bytes) {
    if (!dst || !src) return 1;
    if (!range_ok(dst_offset, bytes, dst->bytes) || !range_ok(src_offset, bytes, src->bytes)) return 1;
    if (bytes == 0) return 0;
    memmove((uint8_t *)dst->data + dst_offset, (const uint8_t *)src->data + src_offset, (size_t)bytes);
    return 0;
}

int mini_gpu_synchronize(void) { return 0; }

/* ---- Embedding ------------------------------------------------------------ */

int mini_gpu_embed_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *tokens,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint32_t               n_vocab,
        uint32_t               n_embd,
        uint32_t               n_tokens) {
    const uint64_t row_bytes = (uint64_t)n_embd * 2;
    if (!holds(out, (uint64_t)n_tokens * n_embd, 4) || !holds(tokens, n_tokens, 4)) return 1;
    if (!model_ok(model_map, model_size, weight_offset, (uint64_t)n_vocab * row_bytes)) return 1;
    const int32_t *tok = CI32(tokens);
    for (uint32_t t = 0; t < n_tokens; t++) {
        if (tok[t] < 0 || (uint32_t)tok[t] >= n_vocab) return 1;
    }
    const uint8_t *table = (const uint8_t *)model_map + weight_offset;
    float *y = F32(out);
    for (uint32_t t = 0; t < n_tokens; t++) {
        const uint8_t *row = table + (uint64_t)tok[t] * row_bytes;
        for (uint32_t i = 0; i < n_embd; i++) {
            y[(uint64_t)t * n_embd + i] = (float)f16_to_double(rd_u16(row + 2 * (uint64_t)i));
        }
    }
    return 0;
}

/* ---- Norms ---------------------------------------------------------------- */

/* Shared by both norms; w == NULL means no weight.  A row is reduced before
 * it is written, so out may alias x. */
static void rms_norm_rows(float *y, const float *x, const float *w, uint32_t n, uint32_t n_rows, float eps) {
    for (uint32_t r = 0; r < n_rows; r++) {
        const float *xr = x + (uint64_t)r * n;
        float *yr = y + (uint64_t)r * n;
        double ss = 0.0;
        for (uint32_t i = 0; i < n; i++) ss += (double)xr[i] * (double)xr[i];
        const double scale = 1.0 / sqrt(ss / (double)n + (double)eps);
        for (uint32_t i = 0; i < n; i++) {
            const double v = (double)xr[i] * scale;
            yr[i] = (float)(w ? v * (double)w[i] : v);
        }
    }
}

int mini_gpu_rms_norm_plain_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *x,
        uint32_t               n,
        uint32_t               n_rows,
        float                  eps) {
    const uint64_t count = (uint64_t)n * n_rows;
    if (n == 0 || !holds(out, count, 4) || !holds(x, count, 4)) return 1;
    rms_norm_rows(F32(out), CF32(x), NULL, n, n_rows, eps);
    return 0;
}

int mini_gpu_rms_norm_weight_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *x,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint32_t               n,
        uint32_t               n_rows,
        float                  eps) {
    const uint64_t count = (uint64_t)n * n_rows;
    if (n == 0 || !holds(out, count, 4) || !holds(x, count, 4)) return 1;
    if (!model_ok(model_map, model_size, weight_offset, (uint64_t)n * 4)) return 1;
    /* The map may sit at any alignment: copy the weight out. */
    float *w = (float *)malloc((size_t)n * sizeof(float));
    if (!w) return 1;
    memcpy(w, (const uint8_t *)model_map + weight_offset, (size_t)n * sizeof(float));
    rms_norm_rows(F32(out), CF32(x), w, n, n_rows, eps);
    free(w);
    return 0;
}

/* ---- Dense projections ---------------------------------------------------- */

typedef void (*dequant_fn)(const uint8_t *block, double *y);

/* y[t][o] = sum_i W[o][i] x[t][i] for a weight of out_dim rows, each a run of
 * in_dim/block_vals blocks of block_bytes.  Rows are decoded once and applied
 * to every token. */
static int matmul_blocks(mini_gpu_tensor *out, const void *model_map, uint64_t model_size,
                         uint64_t weight_offset, uint64_t in_dim, uint64_t out_dim,
                         const mini_gpu_tensor *x, uint64_t n_tok,
                         uint64_t block_vals, uint64_t block_bytes, dequant_fn dequant) {
    uint64_t n_out, n_in, w_bytes;
    if (in_dim == 0 || in_dim % block_vals != 0) return 1;
    if (!mul_ok(n_tok, out_dim, &n_out) || !mul_ok(n_tok, in_dim, &n_in)) return 1;
    if (!holds(out, n_out, 4) || !holds(x, n_in, 4)) return 1;
    const uint64_t row_bytes = in_dim / block_vals * block_bytes;
    if (!mul_ok(out_dim, row_bytes, &w_bytes)) return 1;
    if (!model_ok(model_map, model_size, weight_offset, w_bytes)) return 1;

    double *row = (double *)malloc((size_t)in_dim * sizeof(double));
    double *acc = (double *)calloc((size_t)(n_tok ? n_tok : 1), sizeof(double));
    if (!row || !acc) {
        free(row);
        free(acc);
        return 1;
    }
    const uint8_t *w = (const uint8_t *)model_map + weight_offset;
    const float *xf = CF32(x);
    float *y = F32(out);
    for (uint64_t o = 0; o < out_dim; o++) {
        const uint8_t *wr = w + o * row_bytes;
        for (uint64_t b = 0; b < in_dim / block_vals; b++) dequant(wr + b * block_bytes, row + b * block_vals);
        for (uint64_t t = 0; t < n_tok; t++) {
            const float *xt = xf + t * in_dim;
            MINI_CPU_DOT s = 0.0;
            for (uint64_t i = 0; i < in_dim; i++) s += (MINI_CPU_DOT)(row[i] * (double)xt[i]);
            acc[t] = s;
        }
        for (uint64_t t = 0; t < n_tok; t++) y[t * out_dim + o] = (float)acc[t];
    }
    free(row);
    free(acc);
    return 0;
}

static void dequant_f16_one(const uint8_t *b, double *y) { y[0] = f16_to_double(rd_u16(b)); }

int mini_gpu_matmul_q8_0_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok) {
    return matmul_blocks(out, model_map, model_size, weight_offset, in_dim, out_dim, x, n_tok,
                         QK8_0, Q8_0_BYTES, dequant_q8_0);
}

int mini_gpu_matmul_f16_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok) {
    return matmul_blocks(out, model_map, model_size, weight_offset, in_dim, out_dim, x, n_tok,
                         1, 2, dequant_f16_one);
}

int mini_gpu_matmul_q4_k_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok) {
    return matmul_blocks(out, model_map, model_size, weight_offset, in_dim, out_dim, x, n_tok,
                         QK_K, Q4_K_BYTES, dequant_q4_k);
}

/* ---- Positional encoding -------------------------------------------------- */

int mini_gpu_rope_tail_tensor(
        mini_gpu_tensor *x,
        uint32_t         n_tokens,
        uint32_t         n_head,
        uint32_t         head_dim,
        uint32_t         n_rot,
        uint32_t         pos0,
        float            freq_base) {
    if (n_rot % 2 != 0 || n_rot > head_dim) return 1;
    if (!holds(x, (uint64_t)n_tokens * n_head * head_dim, 4)) return 1;
    float *xf = F32(x);
    const uint32_t tail = head_dim - n_rot;
    for (uint32_t t = 0; t < n_tokens; t++) {
        const double pos = (double)pos0 + (double)t;
        for (uint32_t j = 0; j < n_rot / 2; j++) {
            const double theta = pos * pow((double)freq_base, -2.0 * (double)j / (double)n_rot);
            const double c = cos(theta), s = sin(theta);
            for (uint32_t h = 0; h < n_head; h++) {
                float *p = xf + ((uint64_t)t * n_head + h) * head_dim + tail + 2 * j;
                const double x0 = p[0], x1 = p[1];
                p[0] = (float)(x0 * c - x1 * s);
                p[1] = (float)(x0 * s + x1 * c);
            }
        }
    }
    return 0;
}

/* ---- Attention ------------------------------------------------------------ */

int mini_gpu_attention_window_tensor(
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
    const uint64_t n_q = (uint64_t)n_tokens * n_head * head_dim;
    const uint64_t n_kv = ((uint64_t)pos0 + n_tokens) * head_dim;
    if (!holds(out, n_q, 4) || !holds(q, n_q, 4)) return 1;
    if (!holds(k_cache, n_kv, 4) || !holds(v_cache, n_kv, 4)) return 1;
    if (!model_ok(model_map, model_size, sinks_offset, (uint64_t)n_head * 4)) return 1;
    if (head_dim == 0) return 0;

    const float *qf = CF32(q), *kf = CF32(k_cache), *vf = CF32(v_cache);
    float *y = F32(out);
    /* At most min(window, pos0+n_tokens) keys are visible to one query. */
    const uint64_t max_keys = window < (uint64_t)pos0 + n_tokens ? window : (uint64_t)pos0 + n_tokens;
    double *s   = (double *)malloc(((size_t)max_keys + 1) * sizeof(double));
    double *acc = (double *)malloc((size_t)head_dim * sizeof(double));
    float  *res = (float *)malloc(n_q ? (size_t)n_q * sizeof(float) : 1);
    if (!s || !acc || !res) {
        free(s); free(acc); free(res);
        return 1;
    }
    for (uint32_t t = 0; t < n_tokens; t++) {
        const uint64_t p  = (uint64_t)pos0 + t;
        const uint64_t lo = (p + 1 > window) ? p + 1 - window : 0;   /* max(0, p-window+1) */
        for (uint32_t h = 0; h < n_head; h++) {
            const float *qh = qf + ((uint64_t)t * n_head + h) * head_dim;
            float sink_f;
            memcpy(&sink_f, (const uint8_t *)model_map + sinks_offset + 4 * (uint64_t)h, 4);
            double m = sink_f;
            for (uint64_t j = lo; j <= p && window > 0; j++) {
                const float *kj = kf + j * head_dim;
                MINI_CPU_DOT d = 0.0;
                for (uint32_t i = 0; i < head_dim; i++) d += (MINI_CPU_DOT)((double)qh[i] * (double)kj[i]);
                s[j - lo] = (double)scale * d;
                if (s[j - lo] > m) m = s[j - lo];
            }
            double denom = exp((double)sink_f - m);
            for (uint32_t i = 0; i < head_dim; i++) acc[i] = 0.0;
            for (uint64_t j = lo; j <= p && window > 0; j++) {
                const double e = exp(s[j - lo] - m);
                const float *vj = vf + j * head_dim;
                denom += e;
                for (uint32_t i = 0; i < head_dim; i++) acc[i] += e * (double)vj[i];
            }
            float *yh = res + ((uint64_t)t * n_head + h) * head_dim;
            for (uint32_t i = 0; i < head_dim; i++) yh[i] = (float)(acc[i] / denom);
        }
    }
    /* Written at the end so that out may alias q. */
    memcpy(y, res, (size_t)n_q * sizeof(float));
    free(s); free(acc); free(res);
    return 0;
}

/* ---- Mixture of experts --------------------------------------------------- */

int mini_gpu_router_topk_tensor(
        mini_gpu_tensor       *expert_ids,
        mini_gpu_tensor       *expert_weights,
        const mini_gpu_tensor *logits,
        uint32_t               n_expert,
        uint32_t               n_tokens,
        uint32_t               top_k) {
    if (top_k == 0 || top_k > n_expert) return 1;
    if (!holds(logits, (uint64_t)n_tokens * n_expert, 4)) return 1;
    if (!holds(expert_ids, (uint64_t)n_tokens * top_k, 4) || !holds(expert_weights, (uint64_t)n_tokens * top_k, 4)) return 1;
    const float *l = CF32(logits);
    int32_t *ids = (int32_t *)expert_ids->data;
    float *w = F32(expert_weights);
    double *p = (double *)malloc((size_t)n_expert * sizeof(double));
    unsigned char *taken = (unsigned char *)malloc(n_expert);
    if (!p || !taken) {
        free(p); free(taken);
        return 1;
    }
    for (uint32_t t = 0; t < n_tokens; t++) {
        const float *lt = l + (uint64_t)t * n_expert;
        double mx = lt[0];
        for (uint32_t e = 1; e < n_expert; e++) if (lt[e] > mx) mx = lt[e];
        double sum = 0.0;
        for (uint32_t e = 0; e < n_expert; e++) {
            p[e] = exp((double)lt[e] - mx);
            sum += p[e];
            taken[e] = 0;
        }
        for (uint32_t e = 0; e < n_expert; e++) p[e] /= sum;
        /* Selection: repeated strict-greater scan from index 0, so on equal p
         * the lower expert index is chosen first. */
        double chosen = 0.0;
        for (uint32_t k = 0; k < top_k; k++) {
            int32_t best = -1;
            for (uint32_t e = 0; e < n_expert; e++) {
                if (taken[e]) continue;
                if (best < 0 || p[e] > p[best]) best = (int32_t)e;
            }
            taken[best] = 1;
            ids[(uint64_t)t * top_k + k] = best;
            chosen += p[best];
        }
        for (uint32_t k = 0; k < top_k; k++) {
            const int32_t e = ids[(uint64_t)t * top_k + k];
            w[(uint64_t)t * top_k + k] = (float)(p[e] / chosen);
        }
    }
    free(p);
    free(taken);
    return 0;
}

/* All expert ids of n_tokens*top_k slots are in [0, n_expert). */
static int expert_ids_ok(const mini_gpu_tensor *expert_ids, uint64_t n_slots, uint32_t n_expert) {
    if (!holds(expert_ids, n_slots, 4)) return 0;
    const int32_t *ids = CI32(expert_ids);
    for (uint64_t i = 0; i < n_slots; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= n_expert) return 0;
    }
    return 1;
}

/* Decodes a whole [rows][cols] expert matrix of 256-value blocks to doubles. */
static void dequant_matrix(const uint8_t *w, uint32_t rows, uint32_t cols, uint64_t block_bytes,
                           dequant_fn dequant, double *y) {
    const uint64_t nb = cols / QK_K;
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t b = 0; b < nb; b++) dequant(w + (r * nb + b) * block_bytes, y + r * cols + b * QK_K);
    }
}

int mini_gpu_routed_gate_up_iq2_xxs_tensor(
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
    if (n_embd == 0 || n_embd % QK_K != 0) return 1;
    const uint64_t n_slots = (uint64_t)n_tokens * top_k;
    const uint64_t expert_bytes = (uint64_t)n_ff * (n_embd / QK_K) * IQ2_XXS_BYTES;
    uint64_t all_bytes;
    if (!mul_ok(expert_bytes, n_expert, &all_bytes)) return 1;
    if (!holds(gate, n_slots * n_ff, 4) || !holds(up, n_slots * n_ff, 4)) return 1;
    if (!holds(x, (uint64_t)n_tokens * n_embd, 4)) return 1;
    if (!expert_ids_ok(expert_ids, n_slots, n_expert)) return 1;
    if (!model_ok(model_map, model_size, gate_offset, all_bytes)) return 1;
    if (!model_ok(model_map, model_size, up_offset, all_bytes)) return 1;

    const size_t mat_vals = (size_t)n_ff * n_embd;
    double *wg = (double *)malloc((mat_vals ? mat_vals : 1) * sizeof(double));
    double *wu = (double *)malloc((mat_vals ? mat_vals : 1) * sizeof(double));
    if (!wg || !wu) {
        free(wg); free(wu);
        return 1;
    }
    const uint8_t *map = (const uint8_t *)model_map;
    const int32_t *ids = CI32(expert_ids);
    const float *xf = CF32(x);
    float *g = F32(gate), *u = F32(up);
    /* Expert-major: decode each used expert once, apply it to its slots. */
    for (uint32_t e = 0; e < n_expert; e++) {
        int used = 0;
        for (uint64_t s = 0; s < n_slots; s++) used |= ids[s] == (int32_t)e;
        if (!used) continue;
        dequant_matrix(map + gate_offset + e * expert_bytes, n_ff, n_embd, IQ2_XXS_BYTES, dequant_iq2_xxs, wg);
        dequant_matrix(map + up_offset   + e * expert_bytes, n_ff, n_embd, IQ2_XXS_BYTES, dequant_iq2_xxs, wu);
        for (uint64_t s = 0; s < n_slots; s++) {
            if (ids[s] != (int32_t)e) continue;
            const float *xt = xf + (s / top_k) * n_embd;
            for (uint32_t f = 0; f < n_ff; f++) {
                const double *rg = wg + (uint64_t)f * n_embd, *ru = wu + (uint64_t)f * n_embd;
                double sg = 0.0, su = 0.0;
                for (uint32_t i = 0; i < n_embd; i++) {
                    sg += rg[i] * (double)xt[i];
                    su += ru[i] * (double)xt[i];
                }
                g[s * n_ff + f] = (float)sg;
                u[s * n_ff + f] = (float)su;
            }
        }
    }
    free(wg);
    free(wu);
    return 0;
}

int mini_gpu_routed_down_q2_k_tensor(
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
    if (n_ff == 0 || n_ff % QK_K != 0) return 1;
    const uint64_t n_slots = (uint64_t)n_tokens * top_k;
    const uint64_t expert_bytes = (uint64_t)n_embd * (n_ff / QK_K) * Q2_K_BYTES;
    uint64_t all_bytes;
    if (!mul_ok(expert_bytes, n_expert, &all_bytes)) return 1;
    if (!holds(out, (uint64_t)n_tokens * n_embd, 4)) return 1;
    if (!holds(mid, n_slots * n_ff, 4) || !holds(expert_weights, n_slots, 4)) return 1;
    if (!expert_ids_ok(expert_ids, n_slots, n_expert)) return 1;
    if (!model_ok(model_map, model_size, down_offset, all_bytes)) return 1;

    const size_t mat_vals = (size_t)n_embd * n_ff;
    double *wd  = (double *)malloc((mat_vals ? mat_vals : 1) * sizeof(double));
    double *acc = (double *)calloc((size_t)(n_tokens ? (uint64_t)n_tokens * n_embd : 1), sizeof(double));
    if (!wd || !acc) {
        free(wd); free(acc);
        return 1;
    }
    const uint8_t *map = (const uint8_t *)model_map;
    const int32_t *ids = CI32(expert_ids);
    const float *ew = CF32(expert_weights);
    const float *mf = CF32(mid);
    for (uint32_t e = 0; e < n_expert; e++) {
        int used = 0;
        for (uint64_t s = 0; s < n_slots; s++) used |= ids[s] == (int32_t)e;
        if (!used) continue;
        dequant_matrix(map + down_offset + e * expert_bytes, n_embd, n_ff, Q2_K_BYTES, dequant_q2_k, wd);
        for (uint64_t s = 0; s < n_slots; s++) {
            if (ids[s] != (int32_t)e) continue;
            const float *ms = mf + s * n_ff;
            double *at = acc + (s / top_k) * n_embd;
            for (uint32_t o = 0; o < n_embd; o++) {
                const double *r = wd + (uint64_t)o * n_ff;
                double d = 0.0;
                for (uint32_t i = 0; i < n_ff; i++) d += r[i] * (double)ms[i];
                at[o] += (double)ew[s] * d;
            }
        }
    }
    float *y = F32(out);
    for (uint64_t i = 0; i < (uint64_t)n_tokens * n_embd; i++) y[i] = (float)acc[i];
    free(wd);
    free(acc);
    return 0;
}

/* ---- Elementwise ---------------------------------------------------------- */

int mini_gpu_swiglu_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *gate,
        const mini_gpu_tensor *up,
        uint64_t               n) {
    if (!holds(out, n, 4) || !holds(gate, n, 4) || !holds(up, n, 4)) return 1;
    const float *g = CF32(gate), *u = CF32(up);
    float *y = F32(out);
    for (uint64_t i = 0; i < n; i++) {
        const double gi = g[i];
        y[i] = (float)(gi / (1.0 + exp(-gi)) * (double)u[i]);
    }
    return 0;
}

int mini_gpu_add_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *a,
        const mini_gpu_tensor *b,
        uint64_t               n) {
    if (!holds(out, n, 4) || !holds(a, n, 4) || !holds(b, n, 4)) return 1;
    const float *af = CF32(a), *bf = CF32(b);
    float *y = F32(out);
    for (uint64_t i = 0; i < n; i++) y[i] = af[i] + bf[i];
    return 0;
}

/* ---- Diagnostics ---------------------------------------------------------- */

int mini_gpu_debug_checksum_tensor(
        mini_gpu_tensor       *checksum,
        const mini_gpu_tensor *x,
        uint64_t               n) {
    if (!holds(checksum, 2, 4) || !holds(x, n, 4)) return 1;
    const float *xf = CF32(x);
    double s = 0.0, s2 = 0.0;
    for (uint64_t i = 0; i < n; i++) {
        s  += (double)xf[i];
        s2 += (double)xf[i] * (double)xf[i];
    }
    F32(checksum)[0] = (float)s;
    F32(checksum)[1] = (float)s2;
    return 0;
}
