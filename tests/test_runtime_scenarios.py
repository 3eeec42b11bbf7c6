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
manifest check) and `python -m porter.known_good --target ds4 --calibrate
--unit ds4_gpu_<runtime>` against upstream ds4_cuda.cu.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from porter.errors import PorterError

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
  drain();
  memcpy((char *)t->data + offset, data, bytes); return 0;
}
int mini_gpu_tensor_read(const T *t, uint64_t offset, void *data, uint64_t bytes) {
  if (!t || offset > t->bytes || bytes > t->bytes - offset) return -1;
  if (!bytes) return 0;
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
    from porter.gates.parity.spec import load_spec

    spec = load_spec(target, unit)
    return run_spec(target, spec, lib, workspace=ws, mode="host", timing_reps=0, timeout=120)


def _check(res) -> str:
    from porter.gates.parity.compare import first_check

    return first_check(res)


def test_every_minimoe_runtime_unit_has_its_own_scenario(mini):
    from porter.gates.parity.scenario import Scenario, prepare
    from porter.gates.parity.spec import load_specs

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
    lib = _build(mini_dir, MINI_C, "mini", (fault,))
    res = _run(mini, unit, lib, tmp_path)
    assert not res.ok and not res.skipped, res.summary
    assert _check(res) == check, res.summary + "\n" + res.diagnostics
