/* engine.c — the minimoe engine: GGUF loading, prefill, greedy decode.
 *
 * The engine drives a backend through mini_gpu.h only; which backend (the CPU
 * reference mini_cpu.c, or a CUDA port built as libmini_cuda.so) is chosen at
 * link time.  Weights are never copied: the GGUF file is memory-mapped and
 * every weight is handed to the backend as (model_map, model_size, offset),
 * the way ds4 does it.
 *
 * Two functions are the engine's entry points, and porter's scanner walks the
 * call graph from them to learn which API functions gate each phase:
 *   mini_engine_prefill      — the prompt, n tokens at positions 0..n-1
 *   mini_engine_decode_step  — one token at position pos
 *
 * Usage: minimoe-cpu MODEL.gguf [--prompt 1,2,3,...] [--decode N] [--logits-out PATH]
 *                   [--states-out PATH] [--verbose]
 * stdout:
 *   tokens: t0 t1 ... tN     t0 = argmax of the prefill logits, t1..tN the
 *                            argmax of each of the N decode steps
 *   digest: fnv1a64=<hex> sum=<float>
 *                            FNV-1a over every logit (prefill and decode)
 *                            rounded to 1e-3, and the sum of those logits
 * --logits-out writes every logit row (prefill's, then each decode step's) as
 * raw float32 (host byte order), (1+N) x n_vocab, for comparisons with a tolerance
 * across backends (the digest is exact, so it only compares like with like).
 * --states-out writes the prefill's residual stream as raw float32,
 * (1+n_layer) x n_prompt x n_embd: the embeddings, then the stream after each
 * layer.  porter's e2e gate compares these per layer and per token, so a wrong
 * op is named by the first layer and token where it shows.  Each snapshot is a
 * device-side tensor_copy read back only after the prefill has finished, so
 * dumping adds no host synchronisation inside the forward (a missing sync in
 * the backend is not hidden by the dump).
 * --verbose adds one line on stderr naming the backend and the sizes.
 * Any failure prints one line "minimoe: error: ..." on stderr and exits 1.
 */

#include "mini_gpu.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MINI_BACKEND_NAME
#define MINI_BACKEND_NAME "unknown"
#endif

/* ---- Errors --------------------------------------------------------------- */

static char g_err[512];

static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    /* Messages quote names read from the file: keep them one printable line. */
    for (char *c = g_err; *c; c++) {
        if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f) *c = '?';
    }
    return -1;
}

/* ---- GGUF (v2/v3) ------------------------------------------------------ */

enum {
    GGUF_T_UINT8 = 0, GGUF_T_INT8 = 1, GGUF_T_UINT16 = 2, GGUF_T_INT16 = 3,
    GGUF_T_UINT32 = 4, GGUF_T_INT32 = 5, GGUF_T_FLOAT32 = 6, GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8, GGUF_T_ARRAY = 9, GGUF_T_UINT64 = 10, GGUF_T_INT64 = 11,
    GGUF_T_FLOAT64 = 12,
};

/* The GGML tensor types minimoe uses (GGUF type ids). */
enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q8_0 = 8, GGML_Q2_K = 10, GGML_Q4_K = 12, GGML_IQ2_XXS = 16,
};

typedef struct {
    uint32_t    id;
    const char *name;
    uint32_t    block_vals;
    uint32_t    block_bytes;
} ggml_type_info;

static const ggml_type_info k_types[] = {
    {0, "F32", 1, 4},        {1, "F16", 1, 2},        {2, "Q4_0", 32, 18},     {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},     {7, "Q5_1", 32, 24},     {8, "Q8_0", 32, 34},     {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},   {11, "Q3_K", 256, 110},  {12, "Q4_K", 256, 144},  {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},  {15, "Q8_K", 256, 292},  {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50}, {20, "IQ4_NL", 32, 18},  {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},  {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},      {25, "I16", 1, 2},
    {26, "I32", 1, 4},       {27, "I64", 1, 8},       {28, "F64", 1, 8},       {30, "BF16", 1, 2},
};

static const ggml_type_info *type_info(uint32_t id) {
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++) {
        if (k_types[i].id == id) return &k_types[i];
    }
    return NULL;
}

static const char *type_name(uint32_t id) {
    const ggml_type_info *ti = type_info(id);
    return ti ? ti->name : "unknown";
}

typedef struct {
    const char *key;        /* points into the map, not NUL-terminated */
    uint64_t    key_len;
    uint32_t    type;
    uint64_t    u;          /* integer and bool values */
    int64_t     i;
    double      f;          /* float values */
    const char *str;        /* string values (into the map) */
    uint64_t    str_len;
} gguf_kv;

typedef struct {
    const char *name;
    uint64_t    name_len;
    uint32_t    n_dims;
    uint64_t    ne[4];
    uint32_t    type;
    uint64_t    offset;     /* relative to the data section */
} gguf_tensor_info;

typedef struct {
    const uint8_t    *map;
    uint64_t          size;
    uint32_t          version;
    uint64_t          n_kv;
    gguf_kv          *kv;
    uint64_t          n_tensors;
    gguf_tensor_info *tensors;
    uint64_t          alignment;
    uint64_t          data_offset;   /* absolute file offset of the data section */
} gguf_file;

typedef struct {
    const uint8_t *p;
    uint64_t       pos, size;
} gguf_cursor;

static int cur_take(gguf_cursor *c, uint64_t n, const uint8_t **out) {
    if (n > c->size - c->pos) return fail("truncated file (needs %llu more bytes at offset %llu)",
                                          (unsigned long long)n, (unsigned long long)c->pos);
    *out = c->p + c->pos;
    c->pos += n;
    return 0;
}

static int cur_u32(gguf_cursor *c, uint32_t *v) {
    const uint8_t *b = NULL;
    if (cur_take(c, 4, &b)) return -1;
    memcpy(v, b, 4);
    return 0;
}

static int cur_u64(gguf_cursor *c, uint64_t *v) {
    const uint8_t *b = NULL;
    if (cur_take(c, 8, &b)) return -1;
    memcpy(v, b, 8);
    return 0;
}

static int cur_str(gguf_cursor *c, const char **s, uint64_t *len) {
    const uint8_t *b = NULL;
    if (cur_u64(c, len)) return -1;
    if (cur_take(c, *len, &b)) return -1;
    *s = (const char *)b;
    return 0;
}

static uint64_t scalar_size(uint32_t type) {
    switch (type) {
    case GGUF_T_UINT8: case GGUF_T_INT8: case GGUF_T_BOOL: return 1;
    case GGUF_T_UINT16: case GGUF_T_INT16: return 2;
    case GGUF_T_UINT32: case GGUF_T_INT32: case GGUF_T_FLOAT32: return 4;
    case GGUF_T_UINT64: case GGUF_T_INT64: case GGUF_T_FLOAT64: return 8;
    default: return 0;
    }
}

/* Reads one scalar value of `type` into kv (numbers and strings). */
static int read_scalar(gguf_cursor *c, uint32_t type, gguf_kv *kv) {
    if (type == GGUF_T_STRING) return cur_str(c, &kv->str, &kv->str_len);
    const uint64_t n = scalar_size(type);
    const uint8_t *b = NULL;
    if (n == 0) return fail("bad metadata value type %u", type);
    if (cur_take(c, n, &b)) return -1;
    switch (type) {
    case GGUF_T_UINT8:  kv->u = b[0]; kv->i = b[0]; break;
    case GGUF_T_BOOL:   kv->u = b[0] != 0; kv->i = b[0] != 0; break;
    case GGUF_T_INT8:   kv->i = (int8_t)b[0]; kv->u = (uint64_t)kv->i; break;
    case GGUF_T_UINT16: { uint16_t v; memcpy(&v, b, 2); kv->u = v; kv->i = v; break; }
    case GGUF_T_INT16:  { int16_t v; memcpy(&v, b, 2); kv->i = v; kv->u = (uint64_t)kv->i; break; }
    case GGUF_T_UINT32: { uint32_t v; memcpy(&v, b, 4); kv->u = v; kv->i = v; break; }
    case GGUF_T_INT32:  { int32_t v; memcpy(&v, b, 4); kv->i = v; kv->u = (uint64_t)kv->i; break; }
    case GGUF_T_UINT64: { uint64_t v; memcpy(&v, b, 8); kv->u = v; kv->i = (int64_t)v; break; }
    case GGUF_T_INT64:  { int64_t v; memcpy(&v, b, 8); kv->i = v; kv->u = (uint64_t)v; break; }
    case GGUF_T_FLOAT32: { float v; memcpy(&v, b, 4); kv->f = v; break; }
    case GGUF_T_FLOAT64: { double v; memcpy(&v, b, 8); kv->f = v; break; }
    default: break;
    }
    return 0;
}

static int skip_array(gguf_cursor *c) {
    uint32_t elem_type;
    uint64_t count;
    if (cur_u32(c, &elem_type) || cur_u64(c, &count)) return -1;
    if (elem_type == GGUF_T_STRING) {
        for (uint64_t i = 0; i < count; i++) {
            const char *s;
            uint64_t len;
            if (cur_str(c, &s, &len)) return -1;
        }
        return 0;
    }
    if (elem_type == GGUF_T_ARRAY) return fail("nested metadata arrays are not supported");
    const uint64_t n = scalar_size(elem_type);
    const uint8_t *b = NULL;
    if (n == 0) return fail("bad metadata array element type %u", elem_type);
    if (count > (c->size - c->pos) / n) return fail("truncated file (metadata array)");
    return cur_take(c, count * n, &b);
}

static int key_is(const char *key, uint64_t len, const char *want) {
    return strlen(want) == len && memcmp(key, want, len) == 0;
}

static const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (key_is(g->kv[i].key, g->kv[i].key_len, key)) return &g->kv[i];
    }
    return NULL;
}

static const gguf_tensor_info *gguf_find_tensor(const gguf_file *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (key_is(g->tensors[i].name, g->tensors[i].name_len, name)) return &g->tensors[i];
    }
    return NULL;
}

static void gguf_free(gguf_file *g) {
    free(g->kv);
    free(g->tensors);
    g->kv = NULL;
    g->tensors = NULL;
}

static int gguf_parse(gguf_file *g, const uint8_t *map, uint64_t size) {
    gguf_cursor c = { map, 0, size };
    const uint8_t *magic;
    memset(g, 0, sizeof *g);
    g->map = map;
    g->size = size;

    if (size < 4) return fail("not a GGUF file (%llu bytes)", (unsigned long long)size);
    if (cur_take(&c, 4, &magic)) return -1;
    if (memcmp(magic, "GGUF", 4) != 0) return fail("not a GGUF file (bad magic)");
    if (cur_u32(&c, &g->version)) return -1;
    if (g->version != 2 && g->version != 3) return fail("unsupported GGUF version %u", g->version);
    if (cur_u64(&c, &g->n_tensors) || cur_u64(&c, &g->n_kv)) return -1;
    /* Every KV and tensor info takes at least 8 bytes: a cheap bound. */
    if (g->n_kv > size / 8 || g->n_tensors > size / 8) return fail("corrupt GGUF header (counts too large)");

    g->kv = (gguf_kv *)calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = (gguf_tensor_info *)calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return fail("out of memory");

    g->alignment = 32;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        if (cur_str(&c, &kv->key, &kv->key_len) || cur_u32(&c, &kv->type)) return -1;
        if (kv->type == GGUF_T_ARRAY) {
            if (skip_array(&c)) return -1;
        } else if (read_scalar(&c, kv->type, kv)) {
            return -1;
        }
        if (key_is(kv->key, kv->key_len, "general.alignment")) {
            if (kv->type != GGUF_T_UINT32 || kv->u == 0) return fail("bad general.alignment");
            g->alignment = kv->u;
        }
    }

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor_info *t = &g->tensors[i];
        if (cur_str(&c, &t->name, &t->name_len) || cur_u32(&c, &t->n_dims)) return -1;
        if (t->n_dims == 0 || t->n_dims > 4) return fail("tensor '%.*s' has %u dims", (int)t->name_len, t->name, t->n_dims);
        for (uint32_t d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if (cur_u64(&c, &t->ne[d])) return -1;
        }
        if (cur_u32(&c, &t->type) || cur_u64(&c, &t->offset)) return -1;
    }

    const uint64_t a = g->alignment;
    const uint64_t data = (c.pos + a - 1) / a * a;
    if (data > size) return fail("truncated file (no tensor data)");
    g->data_offset = data;
    return 0;
}

/* ---- Model ------------------------------------------------------------------ */

typedef struct {
    uint32_t n_vocab, n_embd, n_layer, n_head, head_dim, n_rot;
    uint32_t n_expert, top_k, n_ff, window;
    float    freq_base, eps;
} mini_hparams;

/* Absolute byte offsets of each layer's weights in the map. */
typedef struct {
    uint64_t attn_norm, attn_q, attn_k, attn_v, attn_output, attn_sinks;
    uint64_t ffn_norm, ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;
} mini_layer;

typedef struct {
    const uint8_t *map;
    uint64_t       size;
    gguf_file      gguf;
    mini_hparams   hp;
    uint64_t       token_embd, output_norm, output;
    mini_layer    *layers;
} mini_model;

static int meta_u32(const gguf_file *g, const char *key, uint32_t *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return fail("missing metadata key %s", key);
    switch (kv->type) {
    case GGUF_T_UINT8: case GGUF_T_UINT16: case GGUF_T_UINT32: case GGUF_T_UINT64:
        if (kv->u > UINT32_MAX) return fail("metadata %s out of range", key);
        *out = (uint32_t)kv->u;
        return 0;
    case GGUF_T_INT8: case GGUF_T_INT16: case GGUF_T_INT32: case GGUF_T_INT64:
        if (kv->i < 0 || kv->i > (int64_t)UINT32_MAX) return fail("metadata %s out of range", key);
        *out = (uint32_t)kv->i;
        return 0;
    default:
        return fail("metadata %s is not an integer", key);
    }
}

static int meta_f32(const gguf_file *g, const char *key, float *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return fail("missing metadata key %s", key);
    if (kv->type != GGUF_T_FLOAT32 && kv->type != GGUF_T_FLOAT64) return fail("metadata %s is not a float", key);
    *out = (float)kv->f;
    return 0;
}

/* Looks a tensor up and checks its type, its shape (GGUF order: ne0 is the
 * contiguous dimension, so [out][in] is written ne = {in, out}) and that its
 * data lies inside the file.  Returns its absolute offset via *offset. */
static int expect_tensor(const mini_model *m, const char *name, uint32_t type,
                         uint64_t ne0, uint64_t ne1, uint64_t ne2, uint64_t *offset) {
    const gguf_file *g = &m->gguf;
    const gguf_tensor_info *t = gguf_find_tensor(g, name);
    if (!t) return fail("missing tensor %s", name);
    if (t->type != type) {
        return fail("tensor %s has type %s (%u), expected %s", name, type_name(t->type), t->type, type_name(type));
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1) {
        return fail("tensor %s has shape [%llu,%llu,%llu,%llu], expected [%llu,%llu,%llu]", name,
                    (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                    (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
                    (unsigned long long)ne0, (unsigned long long)ne1, (unsigned long long)ne2);
    }
    const ggml_type_info *ti = type_info(type);
    if (ne0 % ti->block_vals != 0) return fail("tensor %s: row of %llu is not whole %s blocks", name,
                                               (unsigned long long)ne0, ti->name);
    const uint64_t bytes = ne0 / ti->block_vals * ti->block_bytes * ne1 * ne2;
    if (t->offset % g->alignment != 0) return fail("tensor %s is misaligned", name);
    if (t->offset > m->size - g->data_offset || bytes > m->size - g->data_offset - t->offset) {
        return fail("truncated file (data of tensor %s ends past the end of the file)", name);
    }
    *offset = g->data_offset + t->offset;
    return 0;
}

static int load_hparams(mini_model *m) {
    const gguf_file *g = &m->gguf;
    mini_hparams *hp = &m->hp;
    const gguf_kv *arch = gguf_find_kv(g, "general.architecture");
    if (!arch || arch->type != GGUF_T_STRING) return fail("missing metadata key general.architecture");
    if (!key_is(arch->str, arch->str_len, "minimoe")) {
        return fail("architecture is '%.*s', expected 'minimoe'", (int)arch->str_len, arch->str);
    }
    if (meta_u32(g, "minimoe.vocab_size", &hp->n_vocab) ||
        meta_u32(g, "minimoe.embedding_length", &hp->n_embd) ||
        meta_u32(g, "minimoe.block_count", &hp->n_layer) ||
        meta_u32(g, "minimoe.attention.head_count", &hp->n_head) ||
        meta_u32(g, "minimoe.attention.key_length", &hp->head_dim) ||
        meta_u32(g, "minimoe.rope.dimension_count", &hp->n_rot) ||
        meta_f32(g, "minimoe.rope.freq_base", &hp->freq_base) ||
        meta_u32(g, "minimoe.expert_count", &hp->n_expert) ||
        meta_u32(g, "minimoe.expert_used_count", &hp->top_k) ||
        meta_u32(g, "minimoe.expert_feed_forward_length", &hp->n_ff) ||
        meta_u32(g, "minimoe.attention.sliding_window", &hp->window) ||
        meta_f32(g, "minimoe.attention.layer_norm_rms_epsilon", &hp->eps)) {
        return -1;
    }
    if (hp->n_vocab == 0 || hp->n_embd == 0 || hp->n_layer == 0 || hp->n_head == 0 || hp->head_dim == 0) {
        return fail("bad hyperparameters (a zero dimension)");
    }
    if (hp->n_embd % 256 != 0 || hp->n_ff == 0 || hp->n_ff % 256 != 0) {
        return fail("n_embd (%u) and n_ff (%u) must be multiples of 256", hp->n_embd, hp->n_ff);
    }
    if (hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim) return fail("bad rope.dimension_count %u", hp->n_rot);
    if (hp->top_k == 0 || hp->top_k > hp->n_expert) return fail("bad expert_used_count %u", hp->top_k);
    if (hp->window == 0) return fail("bad attention.sliding_window 0");
    /* Caps far above any minimoe model keep every size product below 2^64. */
    if (hp->n_layer > 1024) return fail("bad block_count %u", hp->n_layer);
    if (hp->n_vocab > (1u << 24) || hp->n_embd > (1u << 16) || hp->n_ff > (1u << 16) ||
        hp->n_head > 1024 || hp->head_dim > 4096 || hp->n_expert > 1024) {
        return fail("hyperparameters out of range");
    }
    return 0;
}

static int load_tensors(mini_model *m) {
    const mini_hparams *hp = &m->hp;
    const uint64_t q_dim = (uint64_t)hp->n_head * hp->head_dim;
    char name[96];
    if (expect_tensor(m, "token_embd.weight", GGML_F16, hp->n_embd, hp->n_vocab, 1, &m->token_embd) ||
        expect_tensor(m, "output_norm.weight", GGML_F32, hp->n_embd, 1, 1, &m->output_norm) ||
        expect_tensor(m, "output.weight", GGML_Q8_0, hp->n_embd, hp->n_vocab, 1, &m->output)) {
        return -1;
    }
    m->layers = (mini_layer *)calloc(hp->n_layer, sizeof *m->layers);
    if (!m->layers) return fail("out of memory");
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        mini_layer *L = &m->layers[il];
#define EXPECT(suffix, type, a, b, c, field) \
        (snprintf(name, sizeof name, "blk.%u." suffix, il), expect_tensor(m, name, type, a, b, c, &L->field))
        if (EXPECT("attn_norm.weight",     GGML_F32,     hp->n_embd, 1, 1, attn_norm) ||
            EXPECT("attn_q.weight",        GGML_Q8_0,    hp->n_embd, q_dim, 1, attn_q) ||
            EXPECT("attn_k.weight",        GGML_Q8_0,    hp->n_embd, hp->head_dim, 1, attn_k) ||
            EXPECT("attn_v.weight",        GGML_Q8_0,    hp->n_embd, hp->head_dim, 1, attn_v) ||
            EXPECT("attn_output.weight",   GGML_Q8_0,    q_dim, hp->n_embd, 1, attn_output) ||
            EXPECT("attn_sinks.weight",    GGML_F32,     hp->n_head, 1, 1, attn_sinks) ||
            EXPECT("ffn_norm.weight",      GGML_F32,     hp->n_embd, 1, 1, ffn_norm) ||
            EXPECT("ffn_gate_inp.weight",  GGML_F16,     hp->n_embd, hp->n_expert, 1, ffn_gate_inp) ||
            EXPECT("ffn_gate_exps.weight", GGML_IQ2_XXS, hp->n_embd, hp->n_ff, hp->n_expert, ffn_gate_exps) ||
            EXPECT("ffn_up_exps.weight",   GGML_IQ2_XXS, hp->n_embd, hp->n_ff, hp->n_expert, ffn_up_exps) ||
            EXPECT("ffn_down_exps.weight", GGML_Q2_K,    hp->n_ff, hp->n_embd, hp->n_expert, ffn_down_exps)) {
            return -1;
        }
#undef EXPECT
    }
    return 0;
}

static void model_close(mini_model *m) {
    if (m->map && m->size) munmap((void *)m->map, m->size);
    gguf_free(&m->gguf);
    free(m->layers);
    memset(m, 0, sizeof *m);
}

static int model_open(mini_model *m, const char *path) {
    memset(m, 0, sizeof *m);
    const int fd = open(path, O_RDONLY);
    if (fd < 0) return fail("cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return fail("cannot stat: %s", strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fail("not a regular file");
    }
    if (st.st_size < 4) {
        close(fd);
        return fail("not a GGUF file (%lld bytes)", (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return fail("mmap failed: %s", strerror(errno));
    m->map = (const uint8_t *)map;
    m->size = (uint64_t)st.st_size;
    if (gguf_parse(&m->gguf, m->map, m->size) || load_hparams(m) || load_tensors(m)) {
        model_close(m);
        return -1;
    }
    return 0;
}

/* ---- Engine state ------------------------------------------------------- */

typedef struct {
    const mini_model *model;
    uint32_t n_ctx;       /* KV cache rows (absolute positions) */
    uint32_t max_rows;    /* most tokens in one forward (the prompt) */

    /* Activations, max_rows tokens each. */
    mini_gpu_tensor *tokens;   /* int32 [n] */
    mini_gpu_tensor *h;        /* [n][n_embd] residual stream */
    mini_gpu_tensor *xn;       /* [n][n_embd] normed input of a block */
    mini_gpu_tensor *q;        /* [n][n_head*head_dim] */
    mini_gpu_tensor *k;        /* [n][head_dim] */
    mini_gpu_tensor *v;        /* [n][head_dim] */
    mini_gpu_tensor *qn;       /* [n][n_head*head_dim] normed + rotated queries */
    mini_gpu_tensor *kn;       /* [n][head_dim] normed + rotated keys */
    mini_gpu_tensor *att;      /* [n][n_head*head_dim] */
    mini_gpu_tensor *proj;     /* [n][n_embd] attention output projection */
    mini_gpu_tensor *router;   /* [n][n_expert] */
    mini_gpu_tensor *ids;      /* int32 [n][top_k] */
    mini_gpu_tensor *weights;  /* [n][top_k] */
    mini_gpu_tensor *gate;     /* [n][top_k][n_ff] */
    mini_gpu_tensor *up;       /* [n][top_k][n_ff] */
    mini_gpu_tensor *mid;      /* [n][top_k][n_ff] */
    mini_gpu_tensor *moe;      /* [n][n_embd] */
    mini_gpu_tensor *hn;       /* [1][n_embd] final norm of the last row */
    mini_gpu_tensor *logits;   /* [1][n_vocab] */

    /* Per layer KV cache: n_ctx rows of head_dim floats (one shared KV head). */
    mini_gpu_tensor **k_cache;
    mini_gpu_tensor **v_cache;

    /* --states-out only: 1+n_layer snapshots of h ([max_rows][n_embd] each),
     * taken on the device during prefill; NULL when not asked for. */
    mini_gpu_tensor **states;
} mini_engine;

static void engine_free(mini_engine *e) {
    mini_gpu_tensor **all[] = {
        &e->tokens, &e->h, &e->xn, &e->q, &e->k, &e->v, &e->qn, &e->kn, &e->att, &e->proj,
        &e->router, &e->ids, &e->weights, &e->gate, &e->up, &e->mid, &e->moe, &e->hn, &e->logits,
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        mini_gpu_tensor_free(*all[i]);
        *all[i] = NULL;
    }
    if (e->model) {
        for (uint32_t il = 0; il < e->model->hp.n_layer; il++) {
            if (e->k_cache) mini_gpu_tensor_free(e->k_cache[il]);
            if (e->v_cache) mini_gpu_tensor_free(e->v_cache[il]);
        }
    }
    if (e->states && e->model) {
        for (uint32_t i = 0; i <= e->model->hp.n_layer; i++) mini_gpu_tensor_free(e->states[i]);
    }
    free(e->k_cache);
    free(e->v_cache);
    free(e->states);
    e->k_cache = e->v_cache = NULL;
    e->states = NULL;
}

static int engine_init(mini_engine *e, const mini_model *m, uint32_t max_rows, uint32_t n_ctx, int keep_states) {
    const mini_hparams *hp = &m->hp;
    const uint64_t n = max_rows, f = sizeof(float);
    const uint64_t q_dim = (uint64_t)hp->n_head * hp->head_dim;
    const uint64_t slots = n * hp->top_k;
    memset(e, 0, sizeof *e);
    e->model = m;
    e->max_rows = max_rows;
    e->n_ctx = n_ctx;
    e->tokens  = mini_gpu_tensor_alloc(n * sizeof(int32_t));
    e->h       = mini_gpu_tensor_alloc(n * hp->n_embd * f);
    e->xn      = mini_gpu_tensor_alloc(n * hp->n_embd * f);
    e->q       = mini_gpu_tensor_alloc(n * q_dim * f);
    e->k       = mini_gpu_tensor_alloc(n * hp->head_dim * f);
    e->v       = mini_gpu_tensor_alloc(n * hp->head_dim * f);
    e->qn      = mini_gpu_tensor_alloc(n * q_dim * f);
    e->kn      = mini_gpu_tensor_alloc(n * hp->head_dim * f);
    e->att     = mini_gpu_tensor_alloc(n * q_dim * f);
    e->proj    = mini_gpu_tensor_alloc(n * hp->n_embd * f);
    e->router  = mini_gpu_tensor_alloc(n * hp->n_expert * f);
    e->ids     = mini_gpu_tensor_alloc(slots * sizeof(int32_t));
    e->weights = mini_gpu_tensor_alloc(slots * f);
    e->gate    = mini_gpu_tensor_alloc(slots * hp->n_ff * f);
    e->up      = mini_gpu_tensor_alloc(slots * hp->n_ff * f);
    e->mid     = mini_gpu_tensor_alloc(slots * hp->n_ff * f);
    e->moe     = mini_gpu_tensor_alloc(n * hp->n_embd * f);
    e->hn      = mini_gpu_tensor_alloc(hp->n_embd * f);
    e->logits  = mini_gpu_tensor_alloc((uint64_t)hp->n_vocab * f);
    e->k_cache = (mini_gpu_tensor **)calloc(hp->n_layer, sizeof *e->k_cache);
    e->v_cache = (mini_gpu_tensor **)calloc(hp->n_layer, sizeof *e->v_cache);
    int ok = e->tokens && e->h && e->xn && e->q && e->k && e->v && e->qn && e->kn && e->att &&
             e->proj && e->router && e->ids && e->weights && e->gate && e->up && e->mid &&
             e->moe && e->hn && e->logits && e->k_cache && e->v_cache;
    for (uint32_t il = 0; ok && il < hp->n_layer; il++) {
        e->k_cache[il] = mini_gpu_tensor_alloc((uint64_t)n_ctx * hp->head_dim * f);
        e->v_cache[il] = mini_gpu_tensor_alloc((uint64_t)n_ctx * hp->head_dim * f);
        ok = e->k_cache[il] && e->v_cache[il];
    }
    if (ok && keep_states) {
        e->states = (mini_gpu_tensor **)calloc(hp->n_layer + 1, sizeof *e->states);
        ok = e->states != NULL;
        for (uint32_t i = 0; ok && i <= hp->n_layer; i++) {
            e->states[i] = mini_gpu_tensor_alloc(n * hp->n_embd * f);
            ok = e->states[i] != NULL;
        }
    }
    if (!ok) {
        engine_free(e);
        return fail("backend tensor allocation failed");
    }
    return 0;
}

/* ---- Forward ---------------------------------------------------------------- */

#define CHECK(call) do { if ((call) != 0) return fail("backend op failed: %s", #call); } while (0)

/* One transformer block over n rows of e->h at positions pos0..pos0+n-1:
 * attention with a sliding window over the layer's KV cache, then the routed
 * MoE feed-forward; both add into the residual stream in place. */
static int mini_engine_layer(mini_engine *e, uint32_t il, uint32_t n, uint32_t pos0) {
    const mini_model *m = e->model;
    const mini_hparams *hp = &m->hp;
    const mini_layer *L = &m->layers[il];
    const void *map = m->map;
    const uint64_t size = m->size;
    const uint64_t q_dim = (uint64_t)hp->n_head * hp->head_dim;
    const uint64_t kv_row = (uint64_t)hp->head_dim * sizeof(float);

    /* Attention. */
    CHECK(mini_gpu_rms_norm_weight_rows_tensor(e->xn, e->h, map, size, L->attn_norm, hp->n_embd, n, hp->eps));
    CHECK(mini_gpu_matmul_q8_0_tensor(e->q, map, size, L->attn_q, hp->n_embd, q_dim, e->xn, n));
    CHECK(mini_gpu_matmul_q8_0_tensor(e->k, map, size, L->attn_k, hp->n_embd, hp->head_dim, e->xn, n));
    CHECK(mini_gpu_matmul_q8_0_tensor(e->v, map, size, L->attn_v, hp->n_embd, hp->head_dim, e->xn, n));
    CHECK(mini_gpu_rms_norm_plain_rows_tensor(e->qn, e->q, hp->head_dim, n * hp->n_head, hp->eps));
    CHECK(mini_gpu_rms_norm_plain_rows_tensor(e->kn, e->k, hp->head_dim, n, hp->eps));
    CHECK(mini_gpu_rope_tail_tensor(e->qn, n, hp->n_head, hp->head_dim, hp->n_rot, pos0, hp->freq_base));
    CHECK(mini_gpu_rope_tail_tensor(e->kn, n, 1, hp->head_dim, hp->n_rot, pos0, hp->freq_base));
    CHECK(mini_gpu_tensor_copy(e->k_cache[il], (uint64_t)pos0 * kv_row, e->kn, 0, (uint64_t)n * kv_row));
    CHECK(mini_gpu_tensor_copy(e->v_cache[il], (uint64_t)pos0 * kv_row, e->v, 0, (uint64_t)n * kv_row));
    CHECK(mini_gpu_attention_window_tensor(e->att, e->qn, e->k_cache[il], e->v_cache[il], map, size,
                                           L->attn_sinks, n, pos0, hp->n_head, hp->head_dim, hp->window,
                                           1.0f / sqrtf((float)hp->head_dim)));
    CHECK(mini_gpu_matmul_q8_0_tensor(e->proj, map, size, L->attn_output, q_dim, hp->n_embd, e->att, n));
    CHECK(mini_gpu_add_tensor(e->h, e->h, e->proj, (uint64_t)n * hp->n_embd));

    /* Routed MoE feed-forward. */
    const uint64_t n_mid = (uint64_t)n * hp->top_k * hp->n_ff;
    CHECK(mini_gpu_rms_norm_weight_rows_tensor(e->xn, e->h, map, size, L->ffn_norm, hp->n_embd, n, hp->eps));
    CHECK(mini_gpu_matmul_f16_tensor(e->router, map, size, L->ffn_gate_inp, hp->n_embd, hp->n_expert, e->xn, n));
    CHECK(mini_gpu_router_topk_tensor(e->ids, e->weights, e->router, hp->n_expert, n, hp->top_k));
    CHECK(mini_gpu_routed_gate_up_iq2_xxs_tensor(e->gate, e->up, map, size, L->ffn_gate_exps, L->ffn_up_exps,
                                                 hp->n_embd, hp->n_ff, hp->n_expert, e->xn, e->ids, n, hp->top_k));
    CHECK(mini_gpu_swiglu_tensor(e->mid, e->gate, e->up, n_mid));
    CHECK(mini_gpu_routed_down_q2_k_tensor(e->moe, map, size, L->ffn_down_exps, hp->n_ff, hp->n_embd,
                                           hp->n_expert, e->mid, e->ids, e->weights, n, hp->top_k));
    CHECK(mini_gpu_add_tensor(e->h, e->h, e->moe, (uint64_t)n * hp->n_embd));
    return 0;
}

/* Prefill: the prompt at positions 0..n_tokens-1.  Fills the KV caches and
 * writes the logits of the last prompt token to logits_out (n_vocab floats). */
int mini_engine_prefill(mini_engine *e, const int32_t *tokens, uint32_t n_tokens, float *logits_out) {
    const mini_model *m = e->model;
    const mini_hparams *hp = &m->hp;
    const uint64_t row = (uint64_t)hp->n_embd * sizeof(float);
    if (n_tokens == 0 || n_tokens > e->max_rows || n_tokens > e->n_ctx) return fail("bad prompt length %u", n_tokens);

    CHECK(mini_gpu_tensor_write(e->tokens, 0, tokens, (uint64_t)n_tokens * sizeof(int32_t)));
    CHECK(mini_gpu_embed_rows_tensor(e->h, e->tokens, m->map, m->size, m->token_embd, hp->n_vocab, hp->n_embd, n_tokens));
    if (e->states) CHECK(mini_gpu_tensor_copy(e->states[0], 0, e->h, 0, (uint64_t)n_tokens * row));
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        if (mini_engine_layer(e, il, n_tokens, 0) != 0) return -1;
        if (e->states) CHECK(mini_gpu_tensor_copy(e->states[il + 1], 0, e->h, 0, (uint64_t)n_tokens * row));
    }

    /* Output head on the last prompt row only. */
    mini_gpu_tensor *last = mini_gpu_tensor_view(e->h, (uint64_t)(n_tokens - 1) * row, row);
    if (!last) return fail("backend tensor view failed");
    const int rc = mini_gpu_rms_norm_weight_rows_tensor(e->hn, last, m->map, m->size, m->output_norm, hp->n_embd, 1, hp->eps);
    mini_gpu_tensor_free(last);
    if (rc != 0) return fail("backend op failed: output norm");
    CHECK(mini_gpu_matmul_q8_0_tensor(e->logits, m->map, m->size, m->output, hp->n_embd, hp->n_vocab, e->hn, 1));
    CHECK(mini_gpu_synchronize());
    CHECK(mini_gpu_tensor_read(e->logits, 0, logits_out, (uint64_t)hp->n_vocab * sizeof(float)));
    return 0;
}

/* Decode: one token at position pos (the KV caches hold rows 0..pos-1).
 * Writes the logits of that token to logits_out. */
int mini_engine_decode_step(mini_engine *e, int32_t token, uint32_t pos, float *logits_out) {
    const mini_model *m = e->model;
    const mini_hparams *hp = &m->hp;
    if (pos >= e->n_ctx) return fail("context full at position %u", pos);

    CHECK(mini_gpu_tensor_write(e->tokens, 0, &token, sizeof token));
    CHECK(mini_gpu_embed_rows_tensor(e->h, e->tokens, m->map, m->size, m->token_embd, hp->n_vocab, hp->n_embd, 1));
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        if (mini_engine_layer(e, il, 1, pos) != 0) return -1;
    }
    CHECK(mini_gpu_rms_norm_weight_rows_tensor(e->hn, e->h, m->map, m->size, m->output_norm, hp->n_embd, 1, hp->eps));
    CHECK(mini_gpu_matmul_q8_0_tensor(e->logits, m->map, m->size, m->output, hp->n_embd, hp->n_vocab, e->hn, 1));
    CHECK(mini_gpu_synchronize());
    CHECK(mini_gpu_tensor_read(e->logits, 0, logits_out, (uint64_t)hp->n_vocab * sizeof(float)));
    return 0;
}

/* ---- Sampling and digest ------------------------------------------------- */

/* Greedy: the highest logit; on a tie the lower token id. */
static int32_t argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++) {
        if (x[i] > x[best]) best = i;
    }
    return (int32_t)best;
}

typedef struct {
    uint64_t fnv;
    double   sum;
    int      non_finite;
} logits_digest;

static void digest_add(logits_digest *d, const float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            d->non_finite++;
            continue;
        }
        const int64_t r = (int64_t)llround((double)x[i] * 1000.0);
        for (int b = 0; b < 8; b++) {
            d->fnv ^= (uint64_t)(((uint64_t)r >> (8 * b)) & 0xff);
            d->fnv *= 0x100000001b3ULL;
        }
        d->sum += (double)r / 1000.0;
    }
}

static int save_logits(FILE *f, const float *x, uint32_t n) {
    if (!f) return 0;
    return fwrite(x, sizeof(float), n, f) == n ? 0 : fail("short write of logits");
}

/* Reads the prefill snapshots back (after the prefill's own synchronize) and
 * writes them to path: (1+n_layer) x n_tokens x n_embd float32. */
static int save_states(const mini_engine *e, uint32_t n_tokens, const char *path) {
    const mini_hparams *hp = &e->model->hp;
    const uint64_t count = (uint64_t)n_tokens * hp->n_embd;
    float *buf = (float *)malloc(count * sizeof(float));
    FILE *f = fopen(path, "wb");
    int rc = (!buf || !f) ? fail("cannot write %s: %s", path, f ? "out of memory" : strerror(errno)) : 0;
    for (uint32_t i = 0; rc == 0 && i <= hp->n_layer; i++) {
        if (mini_gpu_tensor_read(e->states[i], 0, buf, count * sizeof(float)) != 0) rc = fail("backend op failed: read states");
        else if (fwrite(buf, sizeof(float), count, f) != count) rc = fail("short write of states");
    }
    if (f && fclose(f) != 0 && rc == 0) rc = fail("cannot write %s", path);
    free(buf);
    return rc;
}

/* ---- Command line ---------------------------------------------------------- */

static const int32_t k_default_prompt[] = { 1, 17, 42, 99, 256, 311, 7, 480 };

#define MAX_PROMPT 4096
#define MAX_DECODE 65536

static int parse_u32(const char *s, uint32_t max, uint32_t *out) {
    char *end;
    errno = 0;
    if (!*s || *s == '-' || *s == '+') return -1;
    const unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max) return -1;
    *out = (uint32_t)v;
    return 0;
}

static int parse_prompt(const char *s, int32_t *tokens, uint32_t *n) {
    char buf[16];
    *n = 0;
    while (*s) {
        const char *comma = strchr(s, ',');
        const size_t len = comma ? (size_t)(comma - s) : strlen(s);
        uint32_t v;
        if (len == 0 || len >= sizeof buf || *n >= MAX_PROMPT) return -1;
        memcpy(buf, s, len);
        buf[len] = 0;
        if (parse_u32(buf, INT32_MAX, &v)) return -1;
        tokens[(*n)++] = (int32_t)v;
        s += len;
        if (*s == ',') {
            s++;
            if (!*s) return -1;
        }
    }
    return *n > 0 ? 0 : -1;
}

static void usage_error(const char *msg) {
    fprintf(stderr, "minimoe: error: %s (usage: engine MODEL.gguf [--prompt 1,2,3,...] [--decode N] [--logits-out PATH] [--states-out PATH] [--verbose])\n", msg);
    exit(1);
}

int main(int argc, char **argv) {
    static int32_t prompt[MAX_PROMPT];
    uint32_t n_prompt = (uint32_t)(sizeof k_default_prompt / sizeof k_default_prompt[0]);
    uint32_t n_decode = 16;
    const char *path = NULL;
    const char *logits_path = NULL;
    const char *states_path = NULL;
    int verbose = 0;
    memcpy(prompt, k_default_prompt, sizeof k_default_prompt);

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--prompt") == 0) {
            if (++i >= argc || parse_prompt(argv[i], prompt, &n_prompt)) usage_error("--prompt wants comma-separated token ids");
        } else if (strcmp(argv[i], "--decode") == 0) {
            if (++i >= argc || parse_u32(argv[i], MAX_DECODE, &n_decode)) usage_error("--decode wants a count");
        } else if (strcmp(argv[i], "--verbose") == 0) {
            verbose = 1;
        } else if (strcmp(argv[i], "--logits-out") == 0) {
            if (++i >= argc || !argv[i][0]) usage_error("--logits-out wants a path");
            logits_path = argv[i];
        } else if (strcmp(argv[i], "--states-out") == 0) {
            if (++i >= argc || !argv[i][0]) usage_error("--states-out wants a path");
            states_path = argv[i];
        } else if (argv[i][0] == '-' && argv[i][1] == '-') {
            usage_error("unknown option");
        } else if (!path) {
            path = argv[i];
        } else {
            usage_error("more than one model file");
        }
    }
    if (!path) usage_error("no model file");

    mini_model model;
    if (model_open(&model, path) != 0) {
        fprintf(stderr, "minimoe: error: %s: %s\n", path, g_err);
        return 1;
    }
    const mini_hparams *hp = &model.hp;
    for (uint32_t i = 0; i < n_prompt; i++) {
        if ((uint32_t)prompt[i] >= hp->n_vocab) {
            fprintf(stderr, "minimoe: error: prompt token %d is outside the vocabulary [0, %u)\n", prompt[i], hp->n_vocab);
            model_close(&model);
            return 1;
        }
    }
    if (mini_gpu_init() != 0) {
        fprintf(stderr, "minimoe: error: backend %s failed to initialise\n", MINI_BACKEND_NAME);
        model_close(&model);
        return 1;
    }

    mini_engine engine;
    float *logits = (float *)malloc((size_t)hp->n_vocab * sizeof(float));
    int32_t *generated = (int32_t *)malloc(((size_t)n_decode + 1) * sizeof(int32_t));
    logits_digest digest = { 0xcbf29ce484222325ULL, 0.0, 0 };
    int rc = (!logits || !generated) ? fail("out of memory") : engine_init(&engine, &model, n_prompt, n_prompt + n_decode, states_path != NULL);
    FILE *logits_file = NULL;
    if (rc == 0 && logits_path && !(logits_file = fopen(logits_path, "wb"))) {
        rc = fail("cannot write %s: %s", logits_path, strerror(errno));
        engine_free(&engine);
    }
    if (rc == 0 && verbose) {
        fprintf(stderr, "minimoe: backend=%s layers=%u prompt=%u decode=%u\n",
                MINI_BACKEND_NAME, hp->n_layer, n_prompt, n_decode);
    }
    if (rc == 0) {
        rc = mini_engine_prefill(&engine, prompt, n_prompt, logits);
        if (rc == 0) {
            digest_add(&digest, logits, hp->n_vocab);
            generated[0] = argmax(logits, hp->n_vocab);
            rc = save_logits(logits_file, logits, hp->n_vocab);
        }
        if (rc == 0 && states_path) rc = save_states(&engine, n_prompt, states_path);
        for (uint32_t s = 0; rc == 0 && s < n_decode; s++) {
            rc = mini_engine_decode_step(&engine, generated[s], n_prompt + s, logits);
            if (rc == 0) {
                digest_add(&digest, logits, hp->n_vocab);
                generated[s + 1] = argmax(logits, hp->n_vocab);
                rc = save_logits(logits_file, logits, hp->n_vocab);
            }
        }
        engine_free(&engine);
    }
    if (logits_file && fclose(logits_file) != 0 && rc == 0) rc = fail("cannot write %s", logits_path);
    if (rc == 0 && digest.non_finite) rc = fail("%d non-finite logits", digest.non_finite);

    if (rc == 0) {
        printf("tokens:");
        for (uint32_t i = 0; i <= n_decode; i++) printf(" %d", generated[i]);
        printf("\ndigest: fnv1a64=%016llx sum=%.3f\n", (unsigned long long)digest.fnv, digest.sum);
    } else {
        fprintf(stderr, "minimoe: error: %s\n", g_err);
    }
    free(logits);
    free(generated);
    mini_gpu_cleanup();
    model_close(&model);
    return rc == 0 ? 0 : 1;
}
