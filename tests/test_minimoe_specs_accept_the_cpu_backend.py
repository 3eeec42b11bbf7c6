"""Every minimoe op spec accepts minimoe's own CPU backend (mini_cpu.c), run in host mode with no GPU.

mini_cpu.c is a second correct implementation, written apart from the specs' Python references: a case a
spec adds (an edge, a bad argument the header names) that it refuses is a spec refusing correct code,
the false reject calibration exists to rule out, caught here in CI before any GPU run.  The same run on the
backend with one flaw shows the check is not a formality.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from porter.gates.parity import gate as G
from porter.spec import load_spec, load_specs
from porter.spec.scenario import is_scenario

from tests.test_parity_compare import fixture_ctx, target  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parent.parent
CPU_BACKEND = REPO / "targets" / "minimoe" / "mini_cpu.c"
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to build mini_cpu.c")

# one flaw each: the bytes guard believes any descriptor; attention's window one key short
FLAWS = {
    "bytes_unchecked": ("    return t->bytes >= need;\n", "    return 1;\n"),
    "window_one_short": ("const uint64_t lo = (p + 1 > window) ? p + 1 - window : 0;",
                         "const uint64_t lo = (p + 1 > window) ? p + 2 - window : 0;"),
}


def _build(d: Path, name: str, src: str) -> Path:
    (d / f"{name}.c").write_text(src)
    lib = d / f"lib{name}.so"
    subprocess.run([CC, "-O1", "-shared", "-fPIC", "-I", str(CPU_BACKEND.parent), "-o", str(lib),
                    str(d / f"{name}.c"), "-lm"], check=True)
    return lib


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("mini_cpu")
    src = CPU_BACKEND.read_text()
    out = {"good": _build(d, "good", src)}
    for name, (old, new) in FLAWS.items():
        assert src.count(old) == 1, name
        out[name] = _build(d, name, src.replace(old, new))
    return out


def _op_units(target) -> list[str]:
    return sorted(u for u, s in load_specs(target).items() if not is_scenario(s))


def _run(target, ctx, lib, unit, tmp_path):
    return G.run_spec(target, load_spec(target, unit), lib, workspace=tmp_path / unit, mode="host", ctx=ctx,
                      timing_reps=0)


def test_every_op_spec_accepts_the_cpu_backend(target, fixture_ctx, libs, tmp_path):
    units = _op_units(target)
    assert len(units) == 14
    refused = {}
    for u in units:
        r = _run(target, fixture_ctx, libs["good"], u, tmp_path)
        if not r.ok:
            refused[u] = f"{r.word}: {r.summary[:300]}"
    assert not refused


def test_a_cpu_backend_that_believes_any_descriptor_is_refused_by_every_op_spec(target, fixture_ctx, libs,
                                                                                tmp_path):
    # each op spec's one-element-short cases: the flawed guard returns 0 (and writes past the claim)
    accepted = [u for u in _op_units(target) if _run(target, fixture_ctx, libs["bytes_unchecked"], u, tmp_path).ok]
    assert not accepted


def test_a_window_one_key_short_is_refused_on_its_values(target, fixture_ctx, libs, tmp_path):
    r = _run(target, fixture_ctx, libs["window_one_short"], "mini_gpu_attention_window_tensor", tmp_path)
    assert not r.ok and r.word == "values", (r.word, r.summary[:300])
