"""The checker's verdict on a GPU: the same runner-patching candidates as test_checker_verdict.py, judged
in CUDA mode, where the checker owns the unit's buffers as device memory (cuMemCreate, exported to the
runner as a file descriptor) and reads them through its own CUDA context.

The candidate is a small C backend linked with the CUDA runtime: its swiglu stages the operands through
host memory with cudaMemcpy (an honest, slow backend the parity gate must judge like any other), and its
constructor patches the runner from inside (PyRun_SimpleString).  Built with cc against the toolkit, not
through the build gate, whose static and object checks would refuse the constructor before any GPU
is involved.  Needs cupy, an NVIDIA GPU and the CUDA toolkit: skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from porter.gates.parity import available
from porter.gates.parity.gate import run_spec
from porter.spec import load_spec

from tests.test_checker_verdict import CONSTRUCTOR, PATCHES, _c_string
from tests.test_parity_compare import fixture_ctx, target  # noqa: F401  (fixtures)

_ok, _why = available()
CC = shutil.which("cc") or shutil.which("gcc")
CUDA = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _ok, reason=f"parity gate unavailable here: {_why}"),
              pytest.mark.skipif(CC is None or not (CUDA / "include" / "cuda_runtime_api.h").exists(),
                                 reason="no C compiler or CUDA toolkit headers")]
UNIT = "mini_gpu_swiglu_tensor"

BACKEND = r"""
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
typedef struct { void *data; uint64_t bytes; int32_t owner; } tensor;
void *mini_cuda_stream(void) { return 0; }
const void *mini_cuda_model_ptr(const void *map, uint64_t size, uint64_t off, uint64_t bytes) { return 0; }
void mini_cuda_forget_models(void) {}
int mini_gpu_swiglu_tensor(tensor *out, const tensor *gate, const tensor *up, uint64_t n) {
    /* the spec's error cases pass NULL tensors and NULL data: an honest backend refuses them */
    if (!out || !gate || !up || !out->data || !gate->data || !up->data) return -1;
    if (out->bytes < n * 4 || gate->bytes < n * 4 || up->bytes < n * 4) return -1;
    float *g = malloc(n * 4 + 4), *u = malloc(n * 4 + 4), *o = malloc(n * 4 + 4);
    cudaMemcpy(g, gate->data, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(u, up->data, n * 4, cudaMemcpyDeviceToHost);
#if defined(HACK_SLOW)
    { struct timespec ts = {0, 20000000}; nanosleep(&ts, 0); }
#endif
    for (uint64_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    o[n] = 0.0f;
#if !defined(HACK_UNTOUCHED)
    cudaMemcpy(out->data, o, n * 4
#if defined(HACK_OVERRUN)
               + 4
#endif
               , cudaMemcpyHostToDevice);
#endif
    free(g); free(u); free(o);
    return 0;
}
"""

CANDIDATES = {
    "honest": (None, None, None),
    "overrun_hiding_guards": ("OVERRUN", "hide_guards", "guard"),
    "slow_with_forged_timer": ("SLOW", "forge_time", "timing"),
    "noop_with_junk_outputs": ("UNTOUCHED", "junk_outputs", "sentinel"),
}


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu-attacks")
    out = {}
    for name, (hack, patch, _) in CANDIDATES.items():
        src = (f"#define PORTER_PATCH {_c_string(PATCHES[patch])}\n" + CONSTRUCTOR if patch else "") + BACKEND
        (d / f"{name}.c").write_text(src)
        flags = [f"-DHACK_{hack}"] if hack else []
        subprocess.run([CC, "-O1", "-shared", "-fPIC", *flags, f"-I{CUDA / 'include'}", "-o", str(d / f"lib{name}.so"),
                        str(d / f"{name}.c"), f"-L{CUDA / 'lib64'}", "-lcudart", "-lm", "-ldl"], check=True)
        out[name] = d / f"lib{name}.so"
    return out


@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_a_patched_runner_does_not_change_the_verdict_on_the_gpu(target, fixture_ctx, libs, tmp_path, name):
    check = CANDIDATES[name][2]
    r = run_spec(target, load_spec(target, UNIT), libs[name], workspace=tmp_path, mode="cuda", ctx=fixture_ctx,
                 timing_reps=4)
    assert not r.skipped, r.summary
    if check is None:
        assert r.ok, r.summary + "\n" + r.diagnostics
        t = r.evidence["cases"]
        walls = [c["timing"]["wall_median_ms"] for c in t if c.get("timing")]
        assert walls and all(w > 0 for w in walls)
    else:
        assert not r.ok and check in r.metrics["failed_checks"], (check, r.summary)
