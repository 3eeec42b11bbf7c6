"""ds4's CUDA conventions (targets/ds4/cuda): the header compiles alone, the glue links, placeholders link.

- The IQ2_XXS grid in ds4_cuda.cuh is exactly what gen_iq2_grid.py prints from
  reference/quant.py (no checkout, no nvcc).
- The header compiles with nvcc alone, together with a unit that uses its
  device helpers, against a stand-in ds4_gpu.h (no checkout needed) and, where
  the toolkit lacks cuBLAS, a stand-in naming the two cuBLAS types the header
  uses; a unit that redefines the tensor struct or drifts from an API
  signature fails.
- With the checkout: `porter init --target ds4 --source CHECKOUT` and the build
  gate link every unit's placeholder with the glue and cuBLAS (-z defs), and
  the library exports every API symbol.
cuBLAS headers are looked for in the toolkit, $CPATH and the nvidia-cublas wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NO_DS4, needs_nvcc
from porter.gates.driver import Candidate, GateContext

REPO = Path(__file__).resolve().parents[1]
CUDA = REPO / "targets" / "ds4" / "cuda"
HEADER = CUDA / "ds4_cuda.cuh"


def cublas_include() -> Path | None:
    nvcc = shutil.which("nvcc")
    cands: list[Path] = []
    if nvcc:
        root = Path(os.path.realpath(nvcc)).parents[1]
        cands += [root / "include", *root.glob("targets/*/include")]
    cands += [Path(p) for p in os.environ.get("CPATH", "").split(":") if p]
    try:
        import nvidia  # namespace package of NVIDIA's pip wheels

        for base in nvidia.__path__:
            cands += list(Path(base).glob("*/include"))
    except ImportError:
        pass
    return next((c for c in cands if (c / "cublas_v2.h").is_file()), None)


needs_cublas = pytest.mark.skipif(cublas_include() is None,
                                  reason="cublas_v2.h not found (CUDA toolkit, $CPATH or `pip install nvidia-cublas`)")

# Enough of ds4_gpu.h's shape for the header alone: the opaque tensor type and two declarations.
STAND_IN_API = """#pragma once
#include <stdbool.h>
#include <stdint.h>
typedef struct ds4_gpu_tensor ds4_gpu_tensor;
int ds4_gpu_swiglu_tensor(ds4_gpu_tensor *out, const ds4_gpu_tensor *gate, const ds4_gpu_tensor *up, uint32_t n, float clamp, float weight);
void ds4_gpu_set_quality(bool quality);
"""

USES_HELPERS = r"""
__global__ static void probe_kernel(float *out, const float *x, const ds4_block_iq2_xxs *b, ds4_block_q8_K *q8) {
    float d = 0.0f;
    const int8_t q = ds4_quantize_q8_0_lane(x[threadIdx.x], &d);
    const uint64_t g = ds4_iq2xxs_grid[b->qs[0] & 255];
    const uint32_t s = ds4_iq2_sign_bits(threadIdx.x & 127);
    ds4_quantize_q8_K_warp(x, q8);
    out[threadIdx.x] = ds4_warp_sum_f32((float)q * d) + ds4_warp_max_f32((float)(g & 0xff)) + (float)s
                       + ds4_f16_bits(b->d);
}

extern "C" int ds4_gpu_swiglu_tensor(ds4_gpu_tensor *out, const ds4_gpu_tensor *gate, const ds4_gpu_tensor *up,
                                     uint32_t n, float clamp, float weight) {
    (void)up; (void)clamp; (void)weight;
    probe_kernel<<<1, 32>>>((float *)out->ptr, (const float *)gate->ptr, (const ds4_block_iq2_xxs *)gate->ptr,
                            (ds4_block_q8_K *)out->ptr);
    void *scratch = ds4_cuda_tmp_alloc(n, "probe");
    return ds4_cuda_ok(cudaGetLastError(), "probe") && scratch != NULL && ds4_cuda_cublas_ready >= 0
           && ds4_cuda_model_range_ptr(NULL, 0, 0, "probe") == NULL;
}
"""


def test_iq2_grid_in_the_header_is_the_generators_output():
    out = subprocess.run([sys.executable, str(CUDA / "gen_iq2_grid.py")], capture_output=True, text=True, check=True).stdout
    text = HEADER.read_text()
    assert out in text
    assert out.count("ull") == 256
    # the check can fail: one changed grid word is no longer the generator's output
    assert out.replace("0x2b2b2b1908081908ull", "0x2b2b2b1908081909ull") not in text


# Where the toolkit has no cuBLAS (CI installs nvcc alone), the header is checked against the two
# cuBLAS types it names; the glue and real units need the real cublas_v2.h (needs_cublas).
STAND_IN_CUBLAS = """#pragma once
typedef struct cublasContext *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;
"""


def _compile(tmp_path: Path, unit: str, api: str = STAND_IN_API) -> subprocess.CompletedProcess:
    (tmp_path / "ds4_gpu.h").write_text(api)
    inc = cublas_include()
    if inc is None:
        inc = tmp_path / "cublas-stand-in"
        inc.mkdir(exist_ok=True)
        (inc / "cublas_v2.h").write_text(STAND_IN_CUBLAS)
    cu = tmp_path / "unit.cu"
    cu.write_text(unit)
    cmd = ["nvcc", "-c", "-std=c++17", "-arch=sm_90", "-I", str(tmp_path), "-I", str(CUDA), "-I", str(inc),
           "-include", str(HEADER), "-o", str(tmp_path / "unit.o"), str(cu)]
    return subprocess.run(cmd, capture_output=True, text=True)


@needs_nvcc
def test_header_compiles_alone_with_a_unit_using_its_helpers(tmp_path):
    r = _compile(tmp_path, '#include "ds4_cuda.cuh"\n' + USES_HELPERS)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_nvcc
def test_header_refuses_a_drifted_signature_and_a_second_tensor_struct(tmp_path):
    drifted = USES_HELPERS.replace("uint32_t n, float clamp, float weight)", "uint64_t n, float clamp, float weight)")
    r = _compile(tmp_path, drifted)
    assert r.returncode != 0 and "ds4_gpu_swiglu_tensor" in r.stderr + r.stdout
    r = _compile(tmp_path, "struct ds4_gpu_tensor { void *data; };\n" + USES_HELPERS)
    assert r.returncode != 0 and "ds4_gpu_tensor" in r.stderr + r.stdout


def _ds4_checkout() -> Path | None:
    for c in (os.environ.get("PORTER_DS4_SOURCE"), REPO / "external" / "ds4"):
        if c and (Path(c) / "ds4_gpu.h").is_file():
            return Path(c).resolve()
    return None


@needs_nvcc
@needs_cublas
@pytest.mark.skipif(_ds4_checkout() is None, reason=NO_DS4)
def test_placeholders_of_every_unit_link_with_the_glue_and_cublas(tmp_path, build_cache, monkeypatch):
    from porter.gates import build
    from porter.target.placeholder import is_placeholder
    from porter.target import load_target
    from porter.workspace import init_workspace

    inc = cublas_include()
    monkeypatch.setenv("CPATH", os.pathsep.join(filter(None, [str(inc), os.environ.get("CPATH", "")])))
    lib = inc.parent / "lib"
    if not (lib / "libcublas.so").exists() and list(lib.glob("libcublas.so.*")):
        # the pip wheel ships only the versioned library; -lcublas needs the plain name
        (tmp_path / "lib").mkdir()
        (tmp_path / "lib" / "libcublas.so").symlink_to(sorted(lib.glob("libcublas.so.*"))[0])
        lib = tmp_path / "lib"
    monkeypatch.setenv("LIBRARY_PATH", os.pathsep.join(filter(None, [str(lib), os.environ.get("LIBRARY_PATH", "")])))
    ws = init_workspace(tmp_path / "ws", ["ds4"], source=_ds4_checkout())
    t = load_target(ws, "ds4", _ds4_checkout())
    assert len(t.units) == 81
    unit = "ds4_gpu_swiglu_tensor"
    res = build.run(Candidate.of(unit, t.unit_path(unit).read_text()), GateContext(t, build_cache=build_cache))
    assert res.ok, res.diagnostics
    assert all(v["placeholder"] for v in res.evidence["linked"].values())
    assert "-lcublas" in res.evidence["link_flags"]
    assert is_placeholder(t.unit_path(unit).read_text())
