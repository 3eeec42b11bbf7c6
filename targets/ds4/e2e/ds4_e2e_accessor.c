/* ds4_e2e_accessor.c — porter's accessor for per-layer prefill outputs of ds4.
 *
 * Ours, not ds4's: porter copies the user's ds4 checkout to a scratch folder,
 * applies the declared patch rules of targets/ds4/e2e/patches.toml (the layer
 * count, and one call into this file after each prefill layer and after the
 * prefill logits), and links this file into that scratch build only.  Nothing
 * here changes what ds4 computes; it copies values out.
 *
 * Environment (unset: every function returns at once):
 *   DS4_E2E_STATES=PATH   records of the hyper-connection state after a layer:
 *                         int32 il, int32 pos, then row float32 values
 *   DS4_E2E_TOKENS=LIST   comma-separated prompt positions to record (a sample:
 *                         a full 2k-token x 16k-float state per layer is too big)
 *   DS4_E2E_LOGITS=PATH   the CPU prefill's logits of the last prompt token, n_vocab float32
 *                         (ds4's CLI writes the GPU prefill's with DS4_METAL_DUMP_PREFILL_LOGITS)
 *   DS4_E2E_HEAD=PATH     the output head's collapsed row of the last prompt token (the
 *                         hyper-connection weighted sum, before its RMSNorm), n_embd float32:
 *                         the norm after it hides a scale error from the logits
 *
 * On the GPU path a record synchronises first and resumes the command batch
 * after, as ds4's own graph dump does: an e2e run therefore cannot see a
 * synchronisation missing *between* layers, only one inside a layer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DS4_NO_GPU
#include "ds4_gpu.h"
#endif

#define E2E_MAX_POS 65536

static FILE *g_states;
static int g_ready;
static unsigned char g_want[E2E_MAX_POS];

static void e2e_init(void) {
    if (g_ready) return;
    g_ready = 1;
    const char *path = getenv("DS4_E2E_STATES");
    const char *list = getenv("DS4_E2E_TOKENS");
    if (!path || !path[0] || !list) return;
    for (const char *p = list; *p;) {
        char *end = NULL;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p) break;
        if (v < E2E_MAX_POS) g_want[v] = 1;
        p = (*end == ',') ? end + 1 : end;
    }
    g_states = fopen(path, "wb");
    if (!g_states) fprintf(stderr, "ds4-e2e: cannot write %s\n", path);
}

static void e2e_record(uint32_t il, uint32_t pos, const float *row, uint64_t n) {
    int32_t head[2] = { (int32_t)il, (int32_t)pos };
    fwrite(head, sizeof head, 1, g_states);
    fwrite(row, sizeof(float), (size_t)n, g_states);
}

void ds4_e2e_cpu_layer(const float *cur, uint32_t il, uint32_t pos0, uint32_t n_tok, uint64_t row) {
    e2e_init();
    if (!g_states) return;
    for (uint32_t t = 0; t < n_tok; t++) {
        const uint32_t pos = pos0 + t;
        if (pos < E2E_MAX_POS && g_want[pos]) e2e_record(il, pos, cur + (uint64_t)t * row, row);
    }
    fflush(g_states);
}

void ds4_e2e_gpu_layer(void *tensor, uint32_t il, uint32_t pos0, uint32_t n_tok, uint64_t row) {
#ifdef DS4_NO_GPU
    (void)tensor; (void)il; (void)pos0; (void)n_tok; (void)row;
#else
    e2e_init();
    if (!g_states || !tensor) return;
    float *buf = (float *)malloc((size_t)row * sizeof(float));
    if (!buf) return;
    if (ds4_gpu_synchronize() == 0) fprintf(stderr, "ds4-e2e: synchronize failed at layer %u\n", il);
    for (uint32_t t = 0; t < n_tok; t++) {
        const uint32_t pos = pos0 + t;
        if (pos >= E2E_MAX_POS || !g_want[pos]) continue;
        if (ds4_gpu_tensor_read((const ds4_gpu_tensor *)tensor, (uint64_t)t * row * sizeof(float), buf,
                                row * sizeof(float)) == 0) {
            fprintf(stderr, "ds4-e2e: read failed at layer %u pos %u\n", il, pos);
            continue;
        }
        e2e_record(il, pos, buf, row);
    }
    fflush(g_states);
    free(buf);
    if (ds4_gpu_begin_commands() == 0) fprintf(stderr, "ds4-e2e: cannot resume the command batch\n");
#endif
}

/* n float32 values to the file $env names (unset or empty: nothing). */
static void e2e_write_floats(const char *env, const float *v, uint32_t n) {
    const char *path = getenv(env);
    if (!path || !path[0] || !v) return;
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(v, sizeof(float), n, f);
    fclose(f);
}

static int g_head_armed;

/* The CPU head is shared with decode and diagnostics: only the call the prefill arms is recorded. */
void ds4_e2e_arm_head(void) { g_head_armed = 1; }

void ds4_e2e_cpu_head(const float *row, uint32_t n) {
    if (!g_head_armed) return;
    g_head_armed = 0;
    e2e_write_floats("DS4_E2E_HEAD", row, n);
}

void ds4_e2e_gpu_head(void *tensor, uint32_t n) {
#ifdef DS4_NO_GPU
    (void)tensor; (void)n;
#else
    const char *path = getenv("DS4_E2E_HEAD");
    if (!path || !path[0] || !tensor) return;
    float *buf = (float *)malloc((size_t)n * sizeof(float));
    if (!buf) return;
    if (ds4_gpu_synchronize() == 0) fprintf(stderr, "ds4-e2e: synchronize failed at the head\n");
    if (ds4_gpu_tensor_read((const ds4_gpu_tensor *)tensor, 0, buf, (uint64_t)n * sizeof(float)) == 0)
        fprintf(stderr, "ds4-e2e: head read failed\n");
    else
        e2e_write_floats("DS4_E2E_HEAD", buf, n);
    free(buf);
#endif
}

void ds4_e2e_logits(const float *logits, uint32_t n_vocab) {
    e2e_write_floats("DS4_E2E_LOGITS", logits, n_vocab);
}
