"""Runtime units checked by behaviour: the scenario spec kind (porter/gates/parity/scenario.py).

Without a GPU the scenarios run in the parity child's "host" mode against C
stand-ins written for this test (host memory plays device memory; copies and
fills are queued and run only when something orders them -- synchronize, end,
cleanup, read, write, free -- so a synchronize that does nothing is visible as
it is on a GPU).  Each stand-in has switchable faults, one per plausible
broken implementation (the CUDA versions of the minimoe ones are in
targets/minimoe/adversarial/), and each fault must be rejected by the check
named for it, while the right stand-in passes every scenario.

The GPU side of the same claims: `porter calibrate --target minimoe` (the
scripted good answers pass, the adversarial runtime candidates fail by their
manifest check) and `porter calibrate --target ds4 --known-good upstream
--unit ds4_gpu_<runtime>` against upstream ds4_cuda.cu.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import NO_DS4

REPO = Path(__file__).resolve().parents[1]

MINI_RUNTIME = ["mini_gpu_init", "mini_gpu_cleanup", "mini_gpu_tensor_alloc", "mini_gpu_tensor_view",
                "mini_gpu_tensor_free", "mini_gpu_tensor_bytes", "mini_gpu_tensor_write", "mini_gpu_tensor_read",
                "mini_gpu_tensor_copy", "mini_gpu_synchronize"]

# ---------------------------------------------------------------------------
# minimoe: a plain-C runtime with a deferred work queue and fault switches
# ---------------------------------------------------------------------------

MINI_C = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
typedef struct { void *data; uint64_t bytes; int32_t owner; } T;

/* Deferred device work: a copy is only queued; synchronize/read/write/free/cleanup run the queue
   (as a stream orders them on a GPU), so a synchronize that skips it leaves the bytes stale. */
typedef struct { char *dst; const char *src; uint64_t n; } Op;
static Op q[4096]; static int nq;
static void drain(void) { for (int i = 0; i < nq; i++) memmove(q[i].dst, q[i].src, q[i].n); nq = 0; }

int mini_gpu_init(void) {
#ifdef FAULT_INIT_RETURNS_ONE
  return 1;
#else
  return 0;
#endif
}
void mini_gpu_cleanup(void) {
#ifndef FAULT_CLEANUP_NO_DRAIN
  drain();
#endif
}
int mini_gpu_synchronize(void) {
#ifndef FAULT_SYNC_NOOP
  drain();
#endif
  return 0;
}
/* Allocations carry PAD bytes on each side, as a GPU allocation's granularity does: a small
   overrun is silent (and shows only in the bytes), never a heap abort of the stand-in. */
#define PAD 256
T *mini_gpu_tensor_alloc(uint64_t bytes) {
  T *t = calloc(1, sizeof(T)); if (!t) return NULL;
  char *p = bytes < (1ull << 60) ? malloc(bytes + 2 * PAD) : NULL;
#ifndef FAULT_ALLOC_IGNORES_FAILURE
  if (!p) { free(t); return NULL; }
#endif
  t->data = p ? p + PAD : NULL;
  t->bytes = bytes; t->owner = 1; return t;
}
T *mini_gpu_tensor_view(const T *base, uint64_t offset, uint64_t bytes) {
  if (!base || offset > base->bytes || bytes > base->bytes - offset) return NULL;
  T *t = calloc(1, sizeof(T)); if (!t) return NULL;
#ifdef FAULT_VIEW_IGNORES_OFFSET
  t->data = base->data;
#else
  t->data = (char *)base->data + offset;
#endif
  t->bytes = bytes; t->owner = 0; return t;
}
void mini_gpu_tensor_free(T *t) {
  if (!t) return;
  drain();
#ifdef FAULT_FREE_IGNORES_OWNER
  if (t->data) free((char *)t->data - PAD);
#elif defined(FAULT_FREE_LEAKS)
  (void)0;
#else
  if (t->owner && t->data) free((char *)t->data - PAD);
#endif
  free(t);
}
uint64_t mini_gpu_tensor_bytes(const T *t) {
#ifdef FAULT_BYTES_ROUNDED
  return t ? (t->bytes + 3) & ~3ull : 0;
#else
  return t ? t->bytes : 0;
#endif
}
int mini_gpu_tensor_write(T *t, uint64_t offset, const void *data, uint64_t bytes) {
  if (!t) return -1;
#ifndef FAULT_WRITE_NO_BOUNDS
  if (offset > t->bytes || bytes > t->bytes - offset) return -1;
#endif
  if (!bytes) return 0;
  if (!data) return -1;
  drain();
  memcpy((char *)t->data + offset, data, bytes); return 0;
}
int mini_gpu_tensor_read(const T *t, uint64_t offset, void *data, uint64_t bytes) {
  if (!t || offset > t->bytes || bytes > t->bytes - offset) return -1;
  if (!bytes) return 0;
  if (!data) return -1;
  drain();
#ifdef FAULT_READ_IGNORES_OFFSET
  memcpy(data, t->data, bytes);
#elif defined(FAULT_READ_NOTHING)
  (void)data;
#else
  memcpy(data, (const char *)t->data + offset, bytes);
#endif
  return 0;
}
int mini_gpu_tensor_copy(T *dst, uint64_t dst_offset, const T *src, uint64_t src_offset, uint64_t bytes) {
  if (!dst || !src || dst_offset > dst->bytes || bytes > dst->bytes - dst_offset ||
      src_offset > src->bytes || bytes > src->bytes - src_offset) return -1;
  if (!bytes) return 0;
#ifdef FAULT_COPY_SHORT
  bytes -= 1;
#endif
  if (nq == 4096) drain();
  q[nq].dst = (char *)dst->data + dst_offset; q[nq].src = (const char *)src->data + src_offset; q[nq].n = bytes; nq++;
  return 0;
}
"""


def _cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) for the host stand-in")
    return cc


def _build(tmp_path: Path, source: str, name: str, defines=()) -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    lib = tmp_path / f"lib{name}{''.join('_' + d.lower() for d in defines)}.so"
    if not lib.is_file():
        subprocess.run([_cc(), "-O1", "-shared", "-fPIC", *[f"-D{d}" for d in defines], "-o", str(lib), str(src),
                        "-lm"], check=True, capture_output=True)
    return lib


@pytest.fixture(scope="module")
def mini():
    from porter.target import load_target

    return load_target(REPO, "minimoe")


@pytest.fixture(scope="module")
def mini_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mini_stand_in")


def _run(target, unit, lib, ws):
    from porter.gates.parity.gate import run_spec
    from porter.spec import load_spec

    spec = load_spec(target, unit)
    return run_spec(target, spec, lib, workspace=ws, mode="host", timing_reps=0, timeout=120)


def _skip_without_heap_count(fault: str) -> None:
    """Host mode measures memory in use with glibc's mallinfo2; elsewhere a leak cannot be seen."""
    import ctypes

    if "LEAK" in fault and not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("no mallinfo2 in this C library: host mode cannot measure a leak")


def _check(res) -> str:
    return res.word


def test_every_minimoe_runtime_unit_has_its_own_scenario(mini):
    from porter.gates.parity.scenario import Scenario, prepare
    from porter.spec import load_specs

    specs = load_specs(mini)
    assert set(MINI_RUNTIME) <= set(specs)
    for u in MINI_RUNTIME:
        sc = specs[u]
        assert isinstance(sc, Scenario) and sc.path.name == f"{u}.py"
        runs = prepare(mini, sc, None, [1, 2])
        assert len(runs) == 2 * len(sc.cases)
        # two seeds give two different data sets (a candidate cannot answer from a remembered run)
        a, b = runs[0].script.arrays, runs[1].script.arrays
        assert not a or any(not np.array_equal(a[k], b[k]) for k in a if k in b), u


@pytest.mark.parametrize("unit", MINI_RUNTIME)
def test_minimoe_scenarios_accept_a_right_runtime(mini, mini_dir, tmp_path, unit):
    lib = _build(mini_dir, MINI_C, "mini")
    res = _run(mini, unit, lib, tmp_path)
    assert res.ok, res.summary + "\n" + res.diagnostics
    ev = res.evidence
    assert ev["kind"] == "scenario" and ev["unit"] == unit and ev["spec"]["sha256"]
    assert ev["checks"]["failed"] == [] and len(ev["seeds"]) == 2


# (unit, fault switch, the check that must name it) -- each a plausible broken implementation;
# targets/minimoe/adversarial/ holds the CUDA versions with the check they get on a GPU.
MINI_FAULTS = [
    ("mini_gpu_tensor_read", "FAULT_READ_IGNORES_OFFSET", "exact"),
    ("mini_gpu_tensor_read", "FAULT_READ_NOTHING", "sentinel"),
    ("mini_gpu_tensor_copy", "FAULT_COPY_SHORT", "exact"),
    ("mini_gpu_tensor_view", "FAULT_VIEW_IGNORES_OFFSET", "guard"),
    ("mini_gpu_synchronize", "FAULT_SYNC_NOOP", "stream"),
    ("mini_gpu_cleanup", "FAULT_CLEANUP_NO_DRAIN", "stream"),
    ("mini_gpu_tensor_free", "FAULT_FREE_LEAKS", "leak"),
    ("mini_gpu_tensor_free", "FAULT_FREE_IGNORES_OWNER", "crash"),  # glibc aborts on free(base + offset)
    ("mini_gpu_tensor_write", "FAULT_WRITE_NO_BOUNDS", "guard"),
    ("mini_gpu_tensor_bytes", "FAULT_BYTES_ROUNDED", "exact"),
    ("mini_gpu_tensor_alloc", "FAULT_ALLOC_IGNORES_FAILURE", "error-return"),
    ("mini_gpu_init", "FAULT_INIT_RETURNS_ONE", "rc"),
]


@pytest.mark.parametrize("unit,fault,check", MINI_FAULTS, ids=[f[1].lower() for f in MINI_FAULTS])
def test_minimoe_scenarios_name_each_broken_runtime(mini, mini_dir, tmp_path, unit, fault, check):
    _skip_without_heap_count(fault)
    lib = _build(mini_dir, MINI_C, "mini", (fault,))
    res = _run(mini, unit, lib, tmp_path)
    assert not res.ok and not res.skipped, res.summary
    assert _check(res) == check, res.summary + "\n" + res.diagnostics


# ---------------------------------------------------------------------------
# ds4: the 24 runtime units of ds4_gpu.h, against a plain-C stand-in of the runtime and
# of the two ops the model-map scenarios read through (embed_token_hc, matmul_q8_0)
# ---------------------------------------------------------------------------

def _ds4_checkout() -> Path | None:
    env = os.environ.get("PORTER_DS4_SOURCE")
    for p in ([Path(env)] if env else []) + [REPO / "external" / "ds4"]:
        if (p / "ds4_gpu.h").is_file():
            return p.resolve()
    return None


DS4 = _ds4_checkout()
needs_ds4 = pytest.mark.skipif(DS4 is None, reason=NO_DS4 + " (the ds4 scenarios are bound to its ds4_gpu.h)")

DS4_C = r"""
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
typedef struct { void *ptr; uint64_t bytes; int owner; char *alloc_base; } T;  /* ds4's {ptr, bytes, owner} first */
#define PAD 256

/* Deferred device work: fills and copies are queued; synchronize, end, flush, cleanup, reads,
   writes, contents and ops run the queue first, as a device queue orders them. */
typedef struct { int fill; char *dst; const char *src; uint64_t n; float v; } Op;
static Op q[4096]; static int nq;
static void drain(void) {
  for (int i = 0; i < nq; i++) {
    if (q[i].fill) { float *f = (float *)q[i].dst; for (uint64_t k = 0; k < q[i].n; k++) f[k] = q[i].v; }
    else memmove(q[i].dst, q[i].src, q[i].n);
  }
  nq = 0;
}
static void push(Op o) { if (nq == 4096) drain(); q[nq++] = o; }

static const void *g_map; static uint64_t g_map_size; static int g_fd = -1, g_quality;
typedef struct { const void *map; uint64_t off, in, out; _Float16 *w; } Q8;
static Q8 g_q8[64]; static int n_q8;
static float h2f(const unsigned char *p) { _Float16 h; memcpy(&h, p, 2); return (float)h; }

int ds4_gpu_init(void) {
#ifdef FAULT_INIT_RETURNS_ZERO
  return 0;
#else
  return 1;
#endif
}
void ds4_gpu_cleanup(void) {
#ifndef FAULT_CLEANUP_NO_DRAIN
  drain();
#endif
  for (int i = 0; i < n_q8; i++) free(g_q8[i].w);
  n_q8 = 0; g_map = NULL; g_map_size = 0; g_fd = -1;
}
static T *alloc_(uint64_t bytes, int ignore_failure) {
  T *t = calloc(1, sizeof(T)); if (!t) return NULL;
  char *p = bytes < (1ull << 60) ? malloc(bytes + 2 * PAD) : NULL;
  if (!p && !ignore_failure) { free(t); return NULL; }
  t->alloc_base = p ? p + PAD : NULL; t->ptr = t->alloc_base; t->bytes = bytes; t->owner = 1; return t;
}
T *ds4_gpu_tensor_alloc(uint64_t bytes) {
#ifdef FAULT_ALLOC_IGNORES_FAILURE
  return alloc_(bytes, 1);
#else
  return alloc_(bytes, 0);
#endif
}
static void *g_managed_live; static uint64_t g_managed_live_bytes;  /* FAULT_MANAGED_SHARES_ONE_BUFFER */
T *ds4_gpu_tensor_alloc_managed(uint64_t bytes) {
#ifdef FAULT_MANAGED_IGNORES_FAILURE
  return alloc_(bytes, 1);
#elif defined(FAULT_MANAGED_SHARES_ONE_BUFFER)
  /* a managed tensor allocated while another lives gets that one's memory (its own is only freed) */
  T *t = alloc_(bytes, 0);
  if (t && g_managed_live && g_managed_live_bytes >= bytes) t->ptr = g_managed_live;
  else if (t) { g_managed_live = t->ptr; g_managed_live_bytes = bytes; }
  return t;
#else
  return alloc_(bytes, 0);
#endif
}
T *ds4_gpu_tensor_view(const T *base, uint64_t offset, uint64_t bytes) {
  if (!base || offset > base->bytes || bytes > base->bytes - offset) return NULL;
  T *t = calloc(1, sizeof(T)); if (!t) return NULL;
#ifdef FAULT_VIEW_IGNORES_OFFSET
  t->ptr = base->ptr;
#else
  t->ptr = (char *)base->ptr + offset;
#endif
  t->alloc_base = base->alloc_base; t->bytes = bytes; t->owner = 0; return t;
}
void ds4_gpu_tensor_free(T *t) {
  if (!t) return;
  drain();
  if (t->owner && t->alloc_base == g_managed_live) g_managed_live = NULL;
#ifndef FAULT_FREE_LEAKS
  if (t->owner && t->alloc_base) free(t->alloc_base - PAD);
#endif
  free(t);
}
uint64_t ds4_gpu_tensor_bytes(const T *t) {
#ifdef FAULT_BYTES_ROUNDED
  return t ? (t->bytes + 3) & ~3ull : 0;
#else
  return t ? t->bytes : 0;
#endif
}
void *ds4_gpu_tensor_contents(T *t) {
  if (!t) return NULL;
  drain();
#ifdef FAULT_CONTENTS_IGNORES_VIEW
  return t->alloc_base;
#else
  return t->ptr;
#endif
}
int ds4_gpu_tensor_fill_f32(T *t, float value, uint64_t count) {
  if (!t || count > t->bytes / 4) return 0;
  if (!count) return 1;
#ifdef FAULT_FILL_SHORT
  count -= 1;
#endif
  Op o = {1, (char *)t->ptr, NULL, count, value}; push(o); return 1;
}
int ds4_gpu_tensor_write(T *t, uint64_t offset, const void *data, uint64_t bytes) {
  if (!t || !data) return 0;
#ifndef FAULT_WRITE_NO_BOUNDS
  if (offset > t->bytes || bytes > t->bytes - offset) return 0;
#endif
  drain(); memcpy((char *)t->ptr + offset, data, bytes); return 1;
}
int ds4_gpu_tensor_read(const T *t, uint64_t offset, void *data, uint64_t bytes) {
  if (!t || !data || offset > t->bytes || bytes > t->bytes - offset) return 0;
  drain();
#ifdef FAULT_READ_IGNORES_OFFSET
  memcpy(data, t->ptr, bytes);
#else
  memcpy(data, (const char *)t->ptr + offset, bytes);
#endif
  return 1;
}
int ds4_gpu_tensor_copy(T *dst, uint64_t dst_offset, const T *src, uint64_t src_offset, uint64_t bytes) {
  if (!dst || !src || dst_offset > dst->bytes || src_offset > src->bytes ||
      bytes > dst->bytes - dst_offset || bytes > src->bytes - src_offset) return 0;
  if (!bytes) return 1;
#ifdef FAULT_COPY_SHORT
  bytes -= 1;
#endif
  Op o = {0, (char *)dst->ptr + dst_offset, (const char *)src->ptr + src_offset, bytes, 0}; push(o); return 1;
}
int ds4_gpu_begin_commands(void) {
#ifdef FAULT_BEGIN_RETURNS_ZERO
  return 0;
#else
  return 1;
#endif
}
int ds4_gpu_flush_commands(void) {
#ifdef FAULT_FLUSH_DROPS_WORK
  nq = 0;
#else
  drain();
#endif
  return 1;
}
int ds4_gpu_end_commands(void) {
#ifndef FAULT_END_NO_WAIT
  drain();
#endif
  return 1;
}
int ds4_gpu_synchronize(void) {
#ifndef FAULT_SYNC_NOOP
  drain();
#endif
  return 1;
}
int ds4_gpu_set_model_map(const void *map, uint64_t size) {
#ifndef FAULT_SET_MAP_ACCEPTS_NULL
  if (!map || !size) return 0;
#endif
  g_map = map; g_map_size = size; return 1;
}
int ds4_gpu_set_model_fd(int fd) {
#ifdef FAULT_FD_REJECTS_MINUS_ONE
  if (fd < 0) return 0;
#endif
  g_fd = fd; return 1;
}
int ds4_gpu_set_model_map_range(const void *map, uint64_t size, uint64_t off, uint64_t len) {
  if (!ds4_gpu_set_model_map(map, size)) return 0;
#ifdef FAULT_MAP_RANGE_REJECTS_OFFSET
  if (off > 0) return 0;
#endif
  (void)off; (void)len; return 1;
}
int ds4_gpu_cache_model_range(const void *map, uint64_t size, uint64_t off, uint64_t bytes, const char *label) {
  (void)label;
  if (!map || !bytes) return 1;
#ifndef FAULT_CACHE_RANGE_NO_BOUNDS
  if (off > size || bytes > size - off) return 0;
#endif
  return 1;
}
int ds4_gpu_cache_q8_f16_range(const void *map, uint64_t size, uint64_t off, uint64_t bytes, uint64_t in,
                               uint64_t out, const char *label) {
  (void)label;
  if (!map || !bytes) return 1;
  if (off > size || bytes > size - off) return 0;
#ifdef FAULT_QUALITY_FAILS_PRELOAD
  if (g_quality) return 0;
#endif
  if (g_quality || n_q8 == 64) return 1;  /* an optional preload: skipping it is not a failure */
  uint64_t blocks = (in + 31) / 32;
  if (out * blocks * 34 > bytes) return 0;
  _Float16 *w = malloc(in * out * sizeof(_Float16)); if (!w) return 1;
  for (uint64_t r = 0; r < out; r++) for (uint64_t i = 0; i < in; i++) {
    const unsigned char *blk = (const unsigned char *)map + off + (r * blocks + i / 32) * 34;
#ifdef FAULT_Q8F16_NO_SCALE
    w[r * in + i] = (_Float16)(float)(int8_t)blk[2 + i % 32];
#else
    w[r * in + i] = (_Float16)(h2f(blk) * (float)(int8_t)blk[2 + i % 32]);
#endif
  }
  Q8 c = {map, off, in, out, w}; g_q8[n_q8++] = c; return 1;
}
int ds4_gpu_should_use_managed_kv_cache(uint64_t kv, uint64_t ctx) {
  (void)ctx;
#ifdef FAULT_KV_ALWAYS_MANAGED
  return 1;
#else
  return kv >= (8ull << 30);
#endif
}
void ds4_gpu_set_quality(bool quality) { g_quality = quality; }
void ds4_gpu_print_memory_report(const char *label) {
#ifdef FAULT_REPORT_NEEDS_MODEL
  fprintf(stderr, "stand-in memory report %s: model %llu\n", label, (unsigned long long)*(const uint64_t *)g_map);
#elif defined(FAULT_REPORT_SILENT)
  (void)label;
#else
  fprintf(stderr, "stand-in memory report %s: %d queued\n", label ? label : "", nq);
#endif
}
int ds4_gpu_embed_token_hc_tensor(T *out, const void *map, uint64_t size, uint64_t woff, uint32_t n_vocab,
                                  uint32_t token, uint32_t n_embd, uint32_t n_hc) {
#ifndef FAULT_NO_NULL_CHECK
  if (!out) return 0;
#endif
  if (!out || !map || woff >= size) return 0;
  uint64_t wb = (uint64_t)n_vocab * n_embd * 2;
  if (wb > size - woff || out->bytes < 4ull * n_embd * n_hc) return 0;
  drain();
  const unsigned char *row = (const unsigned char *)map + woff + 2ull * token * n_embd;
  float *o = out->ptr;
  for (uint32_t h = 0; h < n_hc; h++) for (uint32_t e = 0; e < n_embd; e++) o[h * n_embd + e] = h2f(row + 2 * e);
  return 1;
}
int ds4_gpu_matmul_q8_0_tensor(T *out, const void *map, uint64_t size, uint64_t woff, uint64_t in, uint64_t outd,
                               const T *x, uint64_t n_tok) {
#ifndef FAULT_NO_NULL_CHECK
  if (!out || !x) return 0;
#endif
  if (!out || !x || !map) return 0;
  uint64_t blocks = (in + 31) / 32, wb = outd * blocks * 34;
  if (woff > size || wb > size - woff) return 0;
  if (x->bytes < n_tok * in * 4 || out->bytes < n_tok * outd * 4) return 0;
  drain();
  const Q8 *c = NULL;
  for (int i = 0; i < n_q8 && n_tok > 1; i++)
    if (g_q8[i].map == map && g_q8[i].off == woff && g_q8[i].in == in && g_q8[i].out == outd) c = &g_q8[i];
  const float *xv = x->ptr; float *o = out->ptr;
  for (uint64_t t = 0; t < n_tok; t++) for (uint64_t r = 0; r < outd; r++) {
    double acc = 0;
    for (uint64_t i = 0; i < in; i++) {
      double w, xi = xv[t * in + i];
      if (c) { w = (float)c->w[r * in + i]; xi = (float)(_Float16)xv[t * in + i]; }
      else { const unsigned char *blk = (const unsigned char *)map + woff + (r * blocks + i / 32) * 34;
             w = h2f(blk) * (float)(int8_t)blk[2 + i % 32]; }
      acc += w * xi;
    }
    o[t * outd + r] = (float)acc;
  }
  return 1;
}
"""


@pytest.fixture(scope="module")
def ds4():
    from porter.target import load_target

    return load_target(REPO, "ds4", DS4)


@pytest.fixture(scope="module")
def ds4_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ds4_stand_in")


@needs_ds4
def test_every_ds4_runtime_unit_has_its_own_scenario_bound_to_ds4_gpu_h(ds4, tmp_path):
    from porter.gates.parity.scenario import Scenario, ScenarioContext, prepare
    from porter.spec import load_specs

    specs = load_specs(ds4)
    assert sorted(ds4.runtime_units) == sorted(DS4_RUNTIME)
    for u in ds4.runtime_units:
        sc = specs.get(u)
        assert isinstance(sc, Scenario) and sc.path.name == f"{u}.py", u
        runs = prepare(ds4, sc, ScenarioContext(ds4, tmp_path / u), [1, 2])  # every call bound to the header
        assert len(runs) == 2 * len(sc.cases)


DS4_RUNTIME = [
    "ds4_gpu_init", "ds4_gpu_cleanup", "ds4_gpu_tensor_alloc", "ds4_gpu_tensor_alloc_managed", "ds4_gpu_tensor_view",
    "ds4_gpu_tensor_free", "ds4_gpu_tensor_bytes", "ds4_gpu_tensor_contents", "ds4_gpu_tensor_fill_f32",
    "ds4_gpu_tensor_write", "ds4_gpu_tensor_read", "ds4_gpu_tensor_copy", "ds4_gpu_begin_commands",
    "ds4_gpu_flush_commands", "ds4_gpu_end_commands", "ds4_gpu_synchronize", "ds4_gpu_set_model_map",
    "ds4_gpu_set_model_fd", "ds4_gpu_set_model_map_range", "ds4_gpu_cache_model_range", "ds4_gpu_cache_q8_f16_range",
    "ds4_gpu_should_use_managed_kv_cache", "ds4_gpu_set_quality", "ds4_gpu_print_memory_report"]


@needs_ds4
@pytest.mark.parametrize("unit", DS4_RUNTIME)
def test_ds4_scenarios_accept_a_right_runtime(ds4, ds4_dir, tmp_path, unit):
    lib = _build(ds4_dir, DS4_C, "ds4")
    res = _run(ds4, unit, lib, tmp_path)
    assert res.ok, res.summary + "\n" + res.diagnostics


DS4_FAULTS = [
    ("ds4_gpu_init", "FAULT_INIT_RETURNS_ZERO", "rc"),
    ("ds4_gpu_cleanup", "FAULT_CLEANUP_NO_DRAIN", "stream"),
    ("ds4_gpu_tensor_alloc", "FAULT_ALLOC_IGNORES_FAILURE", "error-return"),
    # FAULT_MANAGED_IGNORES_FAILURE is not caught: provoking a managed allocation failure means asking for
    # more managed memory than the card has, which can hang the GPU (ds4_gpu_tensor_alloc_managed.py)
    ("ds4_gpu_tensor_alloc_managed", "FAULT_MANAGED_SHARES_ONE_BUFFER", "guard"),
    ("ds4_gpu_tensor_view", "FAULT_VIEW_IGNORES_OFFSET", "guard"),
    ("ds4_gpu_tensor_free", "FAULT_FREE_LEAKS", "leak"),
    ("ds4_gpu_tensor_bytes", "FAULT_BYTES_ROUNDED", "exact"),
    ("ds4_gpu_tensor_contents", "FAULT_CONTENTS_IGNORES_VIEW", "exact"),
    ("ds4_gpu_tensor_fill_f32", "FAULT_FILL_SHORT", "exact"),
    ("ds4_gpu_tensor_write", "FAULT_WRITE_NO_BOUNDS", "guard"),
    ("ds4_gpu_tensor_read", "FAULT_READ_IGNORES_OFFSET", "exact"),
    ("ds4_gpu_tensor_copy", "FAULT_COPY_SHORT", "exact"),
    ("ds4_gpu_begin_commands", "FAULT_BEGIN_RETURNS_ZERO", "rc"),
    ("ds4_gpu_flush_commands", "FAULT_FLUSH_DROPS_WORK", "exact"),
    ("ds4_gpu_end_commands", "FAULT_END_NO_WAIT", "stream"),
    ("ds4_gpu_synchronize", "FAULT_SYNC_NOOP", "stream"),
    ("ds4_gpu_set_model_map", "FAULT_SET_MAP_ACCEPTS_NULL", "error-return"),
    ("ds4_gpu_set_model_fd", "FAULT_FD_REJECTS_MINUS_ONE", "rc"),
    ("ds4_gpu_set_model_map_range", "FAULT_MAP_RANGE_REJECTS_OFFSET", "rc"),
    ("ds4_gpu_cache_model_range", "FAULT_CACHE_RANGE_NO_BOUNDS", "error-return"),
    ("ds4_gpu_cache_q8_f16_range", "FAULT_Q8F16_NO_SCALE", "values"),
    ("ds4_gpu_should_use_managed_kv_cache", "FAULT_KV_ALWAYS_MANAGED", "exact"),
    ("ds4_gpu_set_quality", "FAULT_QUALITY_FAILS_PRELOAD", "rc"),
    ("ds4_gpu_print_memory_report", "FAULT_REPORT_NEEDS_MODEL", "crash"),
    ("ds4_gpu_print_memory_report", "FAULT_REPORT_SILENT", "exact"),
]


@needs_ds4
@pytest.mark.parametrize("unit,fault,check", DS4_FAULTS, ids=[f[1].lower() for f in DS4_FAULTS])
def test_ds4_scenarios_name_each_broken_runtime(ds4, ds4_dir, tmp_path, unit, fault, check):
    _skip_without_heap_count(fault)
    lib = _build(ds4_dir, DS4_C, "ds4", (fault,))
    res = _run(ds4, unit, lib, tmp_path)
    assert not res.ok and not res.skipped, res.summary
    assert _check(res) == check, res.summary + "\n" + res.diagnostics


# ---------------------------------------------------------------------------
# the gate entry point: a runtime unit runs its scenario, unless the units it calls are unported
# ---------------------------------------------------------------------------

class _InWorkspace:
    """The real target, with unit files in a folder of the test's (as a workspace has them)."""

    def __init__(self, target, folder: Path):
        self._t, self._d = target, folder

    def __getattr__(self, name):
        return getattr(self._t, name)

    def unit_path(self, unit: str) -> Path:
        return self._d / f"{unit}.cu"


def test_gate_runs_a_runtime_scenario_once_the_units_it_calls_are_ported(mini, mini_dir, tmp_path):
    from porter.gates import parity
    from porter.gates.driver import Candidate, GateContext, ParityOptions
    from porter.gates.result import GateResult
    from porter.target.placeholder import placeholder_source

    lib = _build(mini_dir, MINI_C, "mini")
    units = tmp_path / "units"
    units.mkdir()
    t = _InWorkspace(mini, units)
    for u in MINI_RUNTIME:
        (units / f"{u}.cu").write_text(placeholder_source(mini.api_function(u), "mini_cuda.cuh"))
    def gate():  # as porter run calls it: on the library the build gate linked from the workspace files
        ctx = GateContext(t, tmp_path, library=lib, parity=ParityOptions(mode="host"),
                          results={"build": GateResult("build", True, "built")})
        return parity.run(Candidate.of("mini_gpu_tensor_read", ""), ctx)

    r = gate()
    assert r.skipped and not r.ok and "unported" in r.summary and "mini_gpu_tensor_write" in r.summary
    for u in MINI_RUNTIME:
        (units / f"{u}.cu").write_text(f"// ported {u}\n")
    r = gate()
    assert r.ok and not r.skipped, r.summary
    assert r.evidence["calibration"] is not None and r.evidence["kind"] == "scenario"


def test_a_scenario_calling_a_function_the_header_lacks_is_a_spec_error(mini):
    from porter.gates.parity.scenario import Case, Scenario, Script, prepare
    from porter.spec import SpecError

    def build(case, ctx, rng):
        s = Script(rng)
        s.call("mini_gpu_init")
        s.call("mini_gpu_tensor_resize", 3)
        return s

    with pytest.raises(SpecError, match="does not declare"):
        prepare(mini, Scenario("mini_gpu_init", [Case("x")], build), None, [1, 2])

    def wrong_kind(case, ctx, rng):
        s = Script(rng)
        s.call("mini_gpu_tensor_alloc", 1.5)
        return s

    with pytest.raises(SpecError, match="bytes"):
        prepare(mini, Scenario("mini_gpu_tensor_alloc", [Case("x")], wrong_kind), None, [1, 2])


@needs_ds4
def test_calibration_driver_records_scenarios_in_the_ledger(ds4, ds4_dir, tmp_path, monkeypatch):
    """The calibrator in host mode with the stand-in as known-good and a faulty stand-in per mutant:
    scenario evidence is stored like an op spec's, and the parity gate then calls these exact
    scenarios calibrated (each has its mutant rejected by the named check)."""
    import porter.calibration.calibrator as cal
    from porter.gates.mutants import Mutant
    from porter.gates.driver import ParityOptions
    from porter.spec import load_spec
    from porter.records.history import History

    faults = {u: (f, c) for u, f, c in DS4_FAULTS}
    units = ["ds4_gpu_tensor_copy", "ds4_gpu_cache_q8_f16_range"]
    mutants = [Mutant(u, faults[u][0], faults[u][1], "host fault", "rules", file=faults[u][0]) for u in units]
    monkeypatch.setattr(cal, "load_mutants", lambda t: mutants)

    class StandIns:
        describe = "host stand-in"
        has = staticmethod(lambda unit: True)
        prepare = staticmethod(lambda ms, progress=None: None)
        known_good = staticmethod(lambda: _build(ds4_dir, DS4_C, "ds4"))
        mutant = staticmethod(lambda m: _build(ds4_dir, DS4_C, "ds4", (m.file,)))

    ws = tmp_path / "ws"
    ws.mkdir()
    opts = cal.CalibrateOptions(ws, units=units, parity=ParityOptions(mode="host", timeout=120.0, timing_reps=0))
    rep = cal.calibrate(ds4, StandIns(), opts, out=lambda *a: None)
    assert [(r["unit"], r["got"], r["ok"]) for r in rep["rows"]] == [
        (u, got, True) for u in units for got in ("pass", faults[u][1])]
    history = History.read(ws, "ds4")
    for u in units:
        st = history.calibration_status(u, load_spec(ds4, u).sha256)
        assert st["calibrated"], st
    assert not history.calibration_status("ds4_gpu_synchronize", load_spec(ds4, "ds4_gpu_synchronize").sha256)[
        "calibrated"]


def test_every_runtime_unit_has_a_broken_version_that_must_fail(mini):
    """Each scenario is shown failing: a host fault per unit here, a CUDA candidate per minimoe unit in
    targets/minimoe/adversarial/ (run by porter calibrate on a GPU)."""
    from porter.gates.mutants import adversarial

    assert {u for u, _, _ in MINI_FAULTS} == set(MINI_RUNTIME)
    assert {u for u, _, _ in DS4_FAULTS} == set(DS4_RUNTIME)
    cuda = {m.unit: m for m in adversarial(mini) if m.unit in MINI_RUNTIME}
    assert set(cuda) == set(MINI_RUNTIME)
    assert all("extern \"C\"" in m.source and m.unit in m.source for m in cuda.values())
