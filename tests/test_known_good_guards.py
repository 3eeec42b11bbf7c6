"""minimoe's known-good refuses every bad-tensor case of its specs by its own guards (no GPU needed).

The op specs' bad-argument cases (targets/minimoe/parity/_shared.py: with_bad_tensors) are only worth
keeping if the known-good the specs are calibrated on returns non-zero on each of them.  On a machine
without a GPU that is checked on the known-good's host code: every op's good answer
(scripted/good/*.md) is compiled with nvcc exactly as the build gate compiles it and linked with a
stand-in for the target's glue whose mini_cuda_stream() marks that a launch was reached (every op
enqueues its work with it, after its argument guards).  Each bad-tensor case must return non-zero
without reaching it, and the ok case it was made from must reach it (so "not reached" means a guard
stopped the call, not that the stand-in never gets that far).  The calls run in a child process: a
known-good that lost a guard dereferences NULL, and that must fail this test, not end the run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# the scripted-answer builder and the fixture GGUF, as the scripted answers' tests load and write them
from tests.test_scripted_answers import bs, fixture_gguf  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "targets" / "minimoe"
HAS_NVCC = shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()
pytestmark = pytest.mark.skipif(not HAS_NVCC, reason="nvcc not found (the known-good's host code is compiled)")

# the target's glue, minus the device: a launch is recorded, a model range is the host map itself
STAND_IN_GLUE = r"""
extern "C" {
int porter_launch_reached = 0;
cudaStream_t mini_cuda_stream(void) { porter_launch_reached = 1; return 0; }
const void *mini_cuda_model_ptr(const void *map, uint64_t size, uint64_t off, uint64_t bytes) {
    if (map == nullptr || off > size || bytes > size - off) return nullptr;
    return (const unsigned char *)map + off;
}
void mini_cuda_forget_models(void) {}
int mini_cuda_check(cudaError_t err, const char *what) { (void)what; return err == cudaSuccess ? 0 : -1; }
}
"""

# runs in the child: every bad-tensor case of every op spec, and its ok base case, called on the library
CALLS = textwrap.dedent(r"""
    import ctypes, json, sys, tempfile
    from pathlib import Path
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from porter.gates.parity.gate import prepare
    from porter.gates.parity.loader import Tensor
    from porter.gates.parity.scenario import is_scenario
    from porter.spec import Context, In, InOut, Map, Null, Out, Same, header_params, load_specs
    from porter.target import load_target

    lib = ctypes.CDLL(sys.argv[2])
    reached = ctypes.c_int.in_dll(lib, "porter_launch_reached")
    ctx = Context(Path(sys.argv[3]))
    target = load_target(Path(sys.argv[1]), "minimoe")
    CT = {"u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
          "f32": ctypes.c_float, "f64": ctypes.c_double, "bool": ctypes.c_bool}
    keep = []

    def call(fn, params, c):
        structs = {}
        for name, a in c.args.items():  # a descriptor per tensor, as the parity child makes them
            if isinstance(a, (In, InOut, Out)):
                buf = np.zeros(a.nbytes, np.uint8) if isinstance(a, Out) else a.array.copy()
                keep.append(buf)
                structs[name] = Tensor(None if a.data_null else buf.ctypes.data,
                                       a.nbytes if a.claim_bytes is None else a.claim_bytes, 0)
        args = []
        for p in params:
            a = c.args[p["name"]]
            if isinstance(a, Null):
                args.append(ctypes.POINTER(Tensor)())
            elif isinstance(a, (In, InOut, Out, Same)):
                args.append(ctypes.byref(structs[a.param if isinstance(a, Same) else p["name"]]))
            elif isinstance(a, Map):
                m = np.array(a.array, np.uint8, copy=True)
                keep.append(m)
                args.append(ctypes.c_void_p(m.ctypes.data))
            else:
                args.append(CT[p["kind"]](a))
        reached.value = 0
        rc = fn(*args)
        return rc, reached.value

    for unit, spec in sorted(load_specs(target).items()):
        if is_scenario(spec) or not any("bad_tensor" in s.dims for s in spec.shapes):
            continue
        api = target.api_function(unit)
        params = header_params(api)
        fn = getattr(lib, unit)
        fn.restype = ctypes.c_int
        cases = {c.shape.label: c for c in prepare(spec, api, ctx, [3, 4])}
        bases = {}
        for c in cases.values():
            if "bad_tensor" not in c.shape.dims:
                continue
            base = next(b for b in cases.values() if "bad_tensor" not in b.shape.dims and b.shape.expect == "ok"
                        and dict(b.shape.dims) == {k: v for k, v in c.shape.dims.items() if k not in ("bad_tensor", "bad")})
            if base.shape.label not in bases:
                print(json.dumps({"unit": unit, "case": base.shape.label, "step": "call"}), flush=True)
                bases[base.shape.label] = call(fn, params, base.calls[0])
                print(json.dumps({"unit": unit, "case": base.shape.label, "base": True,
                                  "rc": bases[base.shape.label][0], "reached": bases[base.shape.label][1]}), flush=True)
            print(json.dumps({"unit": unit, "case": c.shape.label, "step": "call"}), flush=True)
            rc, hit = call(fn, params, c.calls[0])
            print(json.dumps({"unit": unit, "case": c.shape.label, "base": False, "rc": rc, "reached": hit}), flush=True)
""")


@pytest.fixture(scope="module")
def guarded_library(tmp_path_factory):
    d = tmp_path_factory.mktemp("known_good_guards")
    from porter.spec import load_specs
    from porter.target import load_target

    target = load_target(ROOT, "minimoe")
    units = sorted(u for u, s in load_specs(target).items() if any("bad_tensor" in sh.dims for sh in getattr(s, "shapes", ())))
    items = [("stand_in_glue", STAND_IN_GLUE)] + [(u, bs.good_source(u)) for u in units]
    res = bs.compile_many(items, d / "obj", jobs=2)
    failed = [r for r in res.values() if not r.ok]
    assert not failed, "\n".join(f"{r.name}: {r.log}" for r in failed)
    lib = d / "libguards.so"
    arch = [f for f in bs.nvcc_flags() if f.startswith(("-arch", "-gencode", "arch="))]
    proc = subprocess.run([bs.nvcc(), *arch, "-o", str(lib), *(str(res[n].obj) for n, _ in items),
                           *bs.target_config()["cuda"]["link_flags"]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return lib, units


def _run(lib: Path, gguf: Path) -> tuple[list[dict], subprocess.CompletedProcess]:
    proc = subprocess.run([sys.executable, "-c", CALLS, str(ROOT), str(lib), str(gguf)], capture_output=True,
                          text=True, timeout=600)
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    return lines, proc


def test_the_known_good_refuses_every_bad_tensor_case_before_it_launches(guarded_library, fixture_gguf):
    lib, units = guarded_library
    assert len(units) == 14  # every op unit of mini_gpu.h (the runtime units' scenarios are out of scope)
    lines, proc = _run(lib, fixture_gguf)
    done = [x for x in lines if "rc" in x]
    assert proc.returncode == 0, f"the calls died ({proc.returncode}) at {lines[-1] if lines else None}:\n{proc.stderr[-3000:]}"
    bases = [x for x in done if x["base"]]
    bad = [x for x in done if not x["base"]]
    assert {x["unit"] for x in bases} == set(units) and len(bad) == 108
    # the ok case each bad case was made from gets as far as its launch: the stand-in sees it
    assert all(x["reached"] for x in bases), [x for x in bases if not x["reached"]]
    # ... and every bad case is refused by a guard before it
    wrong = [x for x in bad if x["rc"] == 0 or x["reached"]]
    assert not wrong, wrong


def test_the_check_sees_a_known_good_without_its_bytes_guard(tmp_path, fixture_gguf):
    """The control: the add known-good with its bytes guard dropped (the mutant that survived on the
    GPU) reaches its launch on the claimed-bytes cases, and this test's check says so."""
    good = bs.good_source("mini_gpu_add_tensor")
    guard = "    if (out->bytes < need || a->bytes < need || b->bytes < need) return -1;\n"
    assert guard in good
    items = [("stand_in_glue", STAND_IN_GLUE), ("mini_gpu_add_tensor", good.replace(guard, ""))]
    others = [u for u in _units_with_bad_cases() if u != "mini_gpu_add_tensor"]
    items += [(u, bs.good_source(u)) for u in others]
    res = bs.compile_many(items, tmp_path / "obj", jobs=2)
    assert all(r.ok for r in res.values())
    lib = tmp_path / "libdropped.so"
    arch = [f for f in bs.nvcc_flags() if f.startswith(("-arch", "-gencode", "arch="))]
    subprocess.run([bs.nvcc(), *arch, "-o", str(lib), *(str(res[n].obj) for n, _ in items),
                    *bs.target_config()["cuda"]["link_flags"]], check=True, capture_output=True)
    lines, proc = _run(lib, fixture_gguf)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reached = sorted(x["case"] for x in lines if "rc" in x and not x["base"] and (x["rc"] == 0 or x["reached"]))
    assert reached == ["error: a->bytes one element short", "error: b->bytes one element short",
                       "error: out->bytes one element short"], reached


def _units_with_bad_cases() -> list[str]:
    from porter.spec import load_specs
    from porter.target import load_target

    return sorted(u for u, s in load_specs(load_target(ROOT, "minimoe")).items()
                  if any("bad_tensor" in sh.dims for sh in getattr(s, "shapes", ())))
