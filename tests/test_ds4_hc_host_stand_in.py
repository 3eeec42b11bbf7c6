"""The hc/norm/router specs end to end through the parity child in host mode (no GPU).

A plain-C stand-in of nine of the family's ops (written for this test from
ds4.c's CPU semantics, with switchable faults) runs in host memory, so the
specs' argument bindings (model map, int32 tensors, C bools, in-place tensors,
several outputs, Exact outputs with tie keys), ds4's non-zero-success
convention on the error cases, and the check each fault class must be named
by are exercised in CI.  Needs the ds4 checkout (the header) and a C compiler.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import NO_DS4

REPO = Path(__file__).resolve().parents[1]

STAND_IN_C = r"""
#include <stdint.h>
#include <stdbool.h>
#include <math.h>
typedef struct { void *ptr; uint64_t bytes; int owner; } T;
#define FP(t) ((float *)(t)->ptr)
#define MAPF(map, off) ((const float *)((const char *)(map) + (off)))
int ds4_gpu_init(void) { return 1; }

int ds4_gpu_add_tensor(T *out, const T *a, const T *b, uint32_t n) {
#ifndef FAULT_NO_NULL_CHECK
  if (!out || !a || !b) return 0;
#endif
  if (out->bytes < 4ull * n || a->bytes < 4ull * n || b->bytes < 4ull * n) return 0;
  uint32_t m = n;
#ifdef FAULT_ADD_TAIL
  m = n / 256 * 256; if (!m) m = n;
#endif
  for (uint32_t i = 0; i < m; i++) FP(out)[i] = FP(a)[i] + FP(b)[i];
  return 1;
}

int ds4_gpu_repeat_hc_tensor(T *out, const T *row, uint32_t n_embd, uint32_t n_hc) {
#ifndef FAULT_NO_NULL_CHECK
  if (!out || !row) return 0;
#endif
  if (!n_embd || !n_hc || row->bytes < 4ull * n_embd || out->bytes < 4ull * n_embd * n_hc) return 0;
  for (uint64_t i = 0; i < (uint64_t)n_embd * n_hc; i++) FP(out)[i] = FP(row)[i % n_embd];
  return 1;
}

int ds4_gpu_dsv4_topk_mask_tensor(T *mask, const T *topk, uint32_t n_comp, uint32_t n_tokens, uint32_t top_k) {
#ifndef FAULT_NO_NULL_CHECK
  if (!mask || !topk) return 0;
#endif
  if (!n_comp || !n_tokens || !top_k || mask->bytes < 4ull * n_tokens * n_comp ||
      topk->bytes < 4ull * n_tokens * top_k) return 0;
  const uint32_t *s = topk->ptr;
  for (uint32_t t = 0; t < n_tokens; t++) {
    for (uint32_t c = 0; c < n_comp; c++) FP(mask)[(uint64_t)t * n_comp + c] = -INFINITY;
    for (uint32_t k = 0; k < top_k; k++) {
      uint32_t c = s[(uint64_t)t * top_k + k];
      if (c < n_comp) FP(mask)[(uint64_t)t * n_comp + c] = 0.0f;
    }
  }
  return 1;
}

static float rms_scale(const float *x, uint32_t n, float eps) {
  double ss = 0; for (uint32_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  return 1.0f / sqrtf((float)(ss / n) + eps);
}

int ds4_gpu_rms_norm_weight_rows_tensor(T *out, const T *x, const void *map, uint64_t size, uint64_t off, uint32_t n,
                                        uint32_t rows, float eps) {
#ifndef FAULT_NO_NULL_CHECK
  if (!out || !x) return 0;
#endif
  if (off > size || size - off < 4ull * n || out->bytes < 4ull * n * rows || x->bytes < 4ull * n * rows) return 0;
  const float *w = MAPF(map, off);
#ifdef FAULT_EPS
  eps = 0.0f;
#endif
  for (uint32_t r = 0; r < rows; r++) {
    const float *xr = FP(x) + (uint64_t)r * n; float *o = FP(out) + (uint64_t)r * n;
    float sc = rms_scale(xr, n, eps);
    for (uint32_t i = 0; i < n; i++) o[i] = xr[i] * sc * w[i];
  }
  return 1;
}

int ds4_gpu_head_rms_norm_tensor(T *x, uint32_t n_tok, uint32_t n_head, uint32_t head_dim, float eps) {
#ifndef FAULT_NO_NULL_CHECK
  if (!x) return 0;
#endif
  if (x->bytes < 4ull * n_tok * n_head * head_dim) return 0;
  uint64_t heads = (uint64_t)n_tok * n_head;
#ifdef FAULT_FIRST_TOKEN
  heads = n_head;
#endif
  for (uint64_t h = 0; h < heads; h++) {
    float *xr = FP(x) + h * head_dim;
    float sc = rms_scale(xr, head_dim, eps);
    for (uint32_t i = 0; i < head_dim; i++) xr[i] *= sc;
  }
  return 1;
}

static void split_one(float *out, const float *mix, const float *sc, const float *base, int iters, float eps) {
  const int n = 4; float c[16];
  for (int i = 0; i < n; i++) out[i] = 1.0f / (1.0f + expf(-(mix[i] * sc[0] + base[i]))) + eps;
  for (int i = 0; i < n; i++) out[n + i] = 2.0f / (1.0f + expf(-(mix[n + i] * sc[1] + base[n + i])));
  for (int dst = 0; dst < n; dst++) {
    float mx = -1e30f, s = 0;
    for (int src = 0; src < n; src++) { c[src + dst * n] = mix[8 + src + dst * n] * sc[2] + base[8 + src + dst * n];
                                        if (c[src + dst * n] > mx) mx = c[src + dst * n]; }
#ifdef FAULT_SINKHORN_NO_MAX
    mx = 0.0f;
#endif
    for (int src = 0; src < n; src++) { c[src + dst * n] = expf(c[src + dst * n] - mx); s += c[src + dst * n]; }
    for (int src = 0; src < n; src++) c[src + dst * n] = c[src + dst * n] / s + eps;
  }
  for (int it = 0; it < iters; it++) {
    if (it > 0) for (int dst = 0; dst < n; dst++) {
      float s = 0; for (int src = 0; src < n; src++) s += c[src + dst * n];
      for (int src = 0; src < n; src++) c[src + dst * n] /= s + eps;
    }
    for (int src = 0; src < n; src++) {
      float s = 0; for (int dst = 0; dst < n; dst++) s += c[src + dst * n];
      for (int dst = 0; dst < n; dst++) c[src + dst * n] /= s + eps;
    }
  }
  for (int i = 0; i < 16; i++) out[8 + i] = c[i];
}

int ds4_gpu_hc_split_sinkhorn_tensor(T *out, const T *mix, const void *map, uint64_t size, uint64_t s_off,
                                     uint64_t b_off, uint32_t n_hc, uint32_t iters, float eps) {
#ifndef FAULT_NO_NULL_CHECK
  if (!out || !mix) return 0;
#endif
  if (n_hc != 4 || s_off > size || size - s_off < 12 || b_off > size || size - b_off < 96 ||
      mix->bytes < 96 || out->bytes < 96) return 0;
  uint64_t rows = mix->bytes / 96; if (out->bytes / 96 < rows) rows = out->bytes / 96;
#ifdef FAULT_ITER
  iters += 1;
#endif
  for (uint64_t r = 0; r < rows; r++) split_one(FP(out) + r * 24, FP(mix) + r * 24, MAPF(map, s_off), MAPF(map, b_off),
                                                (int)iters, eps);
  return 1;
}

int ds4_gpu_hc_expand_split_tensor(T *out_hc, const T *block_out, const T *residual_hc, const T *split,
                                   uint32_t n_embd, uint32_t n_hc) {
#ifndef FAULT_NO_NULL_CHECK
  if (!out_hc || !block_out || !residual_hc || !split) return 0;
#endif
  if (!n_embd || !n_hc) return 0;
  uint64_t nt = out_hc->bytes / (4ull * n_hc * n_embd); uint32_t mw = 2 * n_hc + n_hc * n_hc;
  const float *blk = FP(block_out), *res = FP(residual_hc), *sp = FP(split);
  for (uint64_t t = 0; t < nt; t++)
    for (uint32_t dst = 0; dst < n_hc; dst++)
      for (uint32_t d = 0; d < n_embd; d++) {
        float acc = blk[t * n_embd + d] * sp[t * mw + n_hc + dst];
        for (uint32_t src = 0; src < n_hc; src++) {
#ifdef FAULT_COMB_T
          float cv = sp[t * mw + 2 * n_hc + src + dst * n_hc];
#else
          float cv = sp[t * mw + 2 * n_hc + dst + src * n_hc];
#endif
          acc += cv * res[(t * n_hc + src) * n_embd + d];
        }
        FP(out_hc)[(t * n_hc + dst) * n_embd + d] = acc;
      }
  return 1;
}

static float half_to_float(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023; float s = (h & 0x8000) ? -1.0f : 1.0f;
  if (e == 0) return s * ldexpf((float)m, -24);
  if (e == 31) return m ? NAN : s * INFINITY;
  return s * ldexpf((float)(m | 1024), e - 25);
}

int ds4_gpu_embed_tokens_hc_tensor(T *out_hc, const T *tokens, const void *map, uint64_t size, uint64_t off,
                                   uint32_t n_vocab, uint32_t n_tokens, uint32_t n_embd, uint32_t n_hc) {
#ifndef FAULT_NO_NULL_CHECK
  if (!out_hc || !tokens) return 0;
#endif
  if (off > size || 2ull * n_vocab * n_embd > size - off || tokens->bytes < 4ull * n_tokens ||
      out_hc->bytes < 4ull * n_tokens * n_hc * n_embd) return 0;
  const uint16_t *w = (const uint16_t *)((const char *)map + off);
  const int32_t *tok = tokens->ptr;
  for (uint64_t t = 0; t < n_tokens; t++)
    for (uint32_t h = 0; h < n_hc; h++)
      for (uint32_t d = 0; d < n_embd; d++)
        FP(out_hc)[(t * n_hc + h) * n_embd + d] = half_to_float(w[(uint64_t)tok[t] * n_embd + d]);
  return 1;
}

#ifdef FAULT_SOFTPLUS_NO_CUTOFF
static float softplus(float x) { return x < -20.0f ? expf(x) : log1pf(expf(x)); }
#else
static float softplus(float x) { return x > 20.0f ? x : (x < -20.0f ? expf(x) : log1pf(expf(x))); }
#endif

int ds4_gpu_router_select_batch_tensor(T *selected, T *weights, T *probs, const void *map, uint64_t size,
    uint64_t b_off, uint64_t h_off, uint32_t hash_rows, uint32_t groups, uint32_t used, bool has_bias,
    bool hash_mode, const T *logits, const T *tokens, uint32_t n_tokens) {
#ifndef FAULT_NO_NULL_CHECK
  if (!selected || !weights || !probs || !logits || !tokens) return 0;
#endif
  if (!n_tokens || groups > 1 || used > 0 || logits->bytes < 1024ull * n_tokens || probs->bytes < 1024ull * n_tokens ||
      selected->bytes < 24ull * n_tokens || weights->bytes < 24ull * n_tokens) return 0;
  const float *bias = 0; const int32_t *hash = 0;
  if (has_bias && !hash_mode) { if (b_off > size || size - b_off < 1024) return 0; bias = MAPF(map, b_off); }
  if (hash_mode) { if (h_off > size || 24ull * hash_rows > size - h_off) return 0;
                   hash = (const int32_t *)((const char *)map + h_off); }
  for (uint32_t t = 0; t < n_tokens; t++) {
    const float *l = FP(logits) + t * 256; float *p = FP(probs) + t * 256;
    int32_t *sel = (int32_t *)selected->ptr + t * 6; float *w = FP(weights) + t * 6; float score[256];
    for (int i = 0; i < 256; i++) { p[i] = sqrtf(softplus(l[i])); score[i] = bias ? p[i] + bias[i] : p[i]; }
    if (hash_mode) { int32_t tk = ((const int32_t *)tokens->ptr)[t]; for (int j = 0; j < 6; j++) sel[j] = hash[tk * 6 + j]; }
    else {
      for (int j = 0; j < 6; j++) sel[j] = -1;
      for (int i = 0; i < 256; i++)
        for (int j = 0; j < 6; j++)
#ifdef FAULT_TIES
          if (sel[j] < 0 || score[i] >= score[sel[j]]) {
#else
          if (sel[j] < 0 || score[i] > score[sel[j]]) {
#endif
            for (int k = 5; k > j; k--) sel[k] = sel[k - 1];
            sel[j] = i; break;
          }
    }
    float sum = 0; for (int j = 0; j < 6; j++) { w[j] = p[sel[j]]; sum += w[j]; }
    if (sum < 6.103515625e-5f) sum = 6.103515625e-5f;
    for (int j = 0; j < 6; j++) w[j] = w[j] / sum * 1.5f;
  }
  return 1;
}
"""


def _checkout() -> Path | None:
    env = os.environ.get("PORTER_DS4_SOURCE")
    for p in ([Path(env)] if env else []) + [REPO / "external" / "ds4"]:
        if (p / "ds4_gpu.h").is_file():
            return p.resolve()
    return None


CHECKOUT = _checkout()
pytestmark = pytest.mark.skipif(CHECKOUT is None, reason=NO_DS4 + " (the specs bind against its ds4_gpu.h)")


@pytest.fixture(scope="module")
def target():
    from porter.target import load_target

    return load_target(REPO, "ds4", CHECKOUT)


def _stand_in(tmp_path, *defines) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) for the host stand-in")
    src = tmp_path / "hc_stand_in.c"
    src.write_text(STAND_IN_C)
    lib = tmp_path / ("libhc_stand_in" + "".join(d.lower() for d in defines) + ".so")
    subprocess.run([cc, "-O1", "-shared", "-fPIC", *[f"-D{d}" for d in defines], "-o", str(lib), str(src), "-lm"],
                   check=True, capture_output=True)
    return lib


@pytest.mark.parametrize("unit,fault,check", [
    ("ds4_gpu_add_tensor", None, "pass"),
    ("ds4_gpu_repeat_hc_tensor", None, "pass"),
    ("ds4_gpu_dsv4_topk_mask_tensor", None, "pass"),
    ("ds4_gpu_rms_norm_weight_rows_tensor", None, "pass"),
    ("ds4_gpu_head_rms_norm_tensor", None, "pass"),
    ("ds4_gpu_hc_split_sinkhorn_tensor", None, "pass"),
    ("ds4_gpu_hc_expand_split_tensor", None, "pass"),
    ("ds4_gpu_embed_tokens_hc_tensor", None, "pass"),
    ("ds4_gpu_router_select_batch_tensor", None, "pass"),
    ("ds4_gpu_add_tensor", "FAULT_ADD_TAIL", "sentinel"),
    # upstream's first check refuses a NULL tensor (targets/ds4/parity/_null_guards.py); without it: SIGSEGV
    ("ds4_gpu_add_tensor", "FAULT_NO_NULL_CHECK", "crash"),
    ("ds4_gpu_router_select_batch_tensor", "FAULT_NO_NULL_CHECK", "crash"),
    ("ds4_gpu_rms_norm_weight_rows_tensor", "FAULT_EPS", "values"),
    ("ds4_gpu_head_rms_norm_tensor", "FAULT_FIRST_TOKEN", "values"),
    ("ds4_gpu_hc_split_sinkhorn_tensor", "FAULT_ITER", "values"),
    ("ds4_gpu_hc_expand_split_tensor", "FAULT_COMB_T", "values"),
    ("ds4_gpu_router_select_batch_tensor", "FAULT_TIES", "tie-rule"),
    # numerical robustness (the mutants router-batch-softplus-no-cutoff, hc-sinkhorn-softmax-no-max):
    # caught only by the specs' edge cases (tests/test_spec_edges.py shows the rest pass them)
    ("ds4_gpu_router_select_batch_tensor", "FAULT_SOFTPLUS_NO_CUTOFF", "values"),
    ("ds4_gpu_hc_split_sinkhorn_tensor", "FAULT_SINKHORN_NO_MAX", "values"),
])
def test_hc_specs_in_host_mode_accept_a_right_stand_in_and_name_the_fault(target, tmp_path, unit, fault, check):
    from porter.gates.parity.gate import run_spec
    from porter.spec import load_spec

    lib = _stand_in(tmp_path, *([fault] if fault else []))
    res = run_spec(target, load_spec(target, unit), lib, workspace=tmp_path, mode="host", timing_reps=0)
    assert res.word == check, res.summary
