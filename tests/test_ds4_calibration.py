"""ds4 parity specs calibrated against the upstream CUDA backend of a ds4 checkout.

Needs the checkout ($PORTER_DS4_SOURCE, or external/ds4 in the repository --
never committed); the GPU part also needs cupy, an NVIDIA GPU and nvcc with
cuBLAS.  Each part skips with its reason otherwise.

Without a GPU: the mutant manifest applies to the checkout (every anchor
exactly once), a manifest rule that matches zero or two times is refused with
one line, every ds4 spec validates against ds4_gpu.h and builds its inputs and
references for two seeds with identical layouts.

With a GPU (one session-wide run of porter.known_good.calibrate): every spec
passes against the upstream library, and every mutant of targets/ds4/mutants.toml
fails its unit's spec by the check the manifest names -- among them the routed
experts' IQ2_XXS blocks decoded as Q8_0.  PORTER_DS4_REPORT=FILE keeps the report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import pytest

from porter.errors import PorterError
from porter.known_good import Mutation, Rule, apply_mutation, build_library, load_mutations

REPO = Path(__file__).resolve().parents[1]
REQUIRED_UNITS = {"ds4_gpu_rms_norm_plain_rows_tensor", "ds4_gpu_matmul_q8_0_tensor", "ds4_gpu_rope_tail_tensor",
                  "ds4_gpu_swiglu_tensor", "ds4_gpu_indexer_topk_tensor", "ds4_gpu_routed_moe_one_tensor"}


def _checkout() -> Path | None:
    env = os.environ.get("PORTER_DS4_SOURCE")
    for p in ([Path(env)] if env else []) + [REPO / "external" / "ds4"]:
        if (p / "ds4_gpu.h").is_file() and (p / "ds4_cuda.cu").is_file():
            return p.resolve()
    return None


CHECKOUT = _checkout()
needs_checkout = pytest.mark.skipif(CHECKOUT is None, reason="no ds4 checkout (set PORTER_DS4_SOURCE or put it at "
                                    "external/ds4): the ds4 specs and mutants are checked against it")


@pytest.fixture(scope="module")
def target():
    from porter.target import load_target

    return load_target(REPO, "ds4", CHECKOUT)


# ---------------------------------------------------------------------------
# mutations (no GPU)
# ---------------------------------------------------------------------------

def _mut(*rules):
    return Mutation("m", "u", "f.cu", "values", "why", tuple(Rule(s, r) for s, r in rules))


def test_apply_mutation_needs_exactly_one_match():
    assert apply_mutation("a x b", _mut(("x", "y"))) == "a y b"
    with pytest.raises(PorterError, match="occurs 0 times"):
        apply_mutation("a b", _mut(("x", "y")))
    with pytest.raises(PorterError, match="occurs 2 times"):
        apply_mutation("x x", _mut(("x", "y")))
    # rules apply in order, each to the text the previous one left
    assert apply_mutation("ab", _mut(("a", "c"), ("cb", "d"))) == "d"


def test_load_mutations_refuses_bad_manifests(tmp_path):
    class T:
        dir = tmp_path

    (tmp_path / "mutants.toml").write_text('[[mutant]]\nname="a"\nunit="u"\nfile="f"\nmust_fail_check="nope"\n'
                                           'why="w"\n[[mutant.rule]]\nsearch="x"\nreplace="y"\n')
    with pytest.raises(PorterError, match="unknown check"):
        load_mutations(T)
    (tmp_path / "mutants.toml").write_text('[[mutant]]\nname="a"\nunit="u"\nfile="f"\nmust_fail_check="values"\n'
                                           'why="w"\n[[mutant.rule]]\nsearch="x"\nreplace="x"\n')
    with pytest.raises(PorterError, match="replace equals search"):
        load_mutations(T)
    (tmp_path / "mutants.toml").write_text('[[mutant]]\nname="a"\nunit="u"\n')
    with pytest.raises(PorterError, match="lacks"):
        load_mutations(T)


@needs_checkout
def test_every_manifest_mutant_applies_once_to_the_checkout(target):
    muts = load_mutations(target)
    assert any(m.unit == "ds4_gpu_routed_moe_one_tensor" and "q8_0" in m.name for m in muts)
    src = (target.checkout / "ds4_cuda.cu").read_text()
    for m in muts:
        out = apply_mutation(src, m)
        assert out != src and "porter mutant" in out
        assert m.unit in {f.name for f in target.api}


@needs_checkout
def test_build_refuses_a_checkout_without_the_backend(target, tmp_path):
    import copy

    t = copy.copy(target)
    t.checkout = tmp_path
    with pytest.raises(PorterError, match="lacks ds4_cuda.cu"):
        build_library(t, None, tmp_path / "out")


# ---------------------------------------------------------------------------
# specs (no GPU)
# ---------------------------------------------------------------------------

@needs_checkout
def test_ds4_specs_validate_and_build_both_seeds(target):
    from porter.gates.parity.gate import prepare
    from porter.gates.parity.spec import Context, load_specs
    from porter.known_good import bool_params_as_u32

    bool_params_as_u32()  # no-op once the harness binds C bool itself
    specs = load_specs(target)
    assert REQUIRED_UNITS <= set(specs)
    for unit, spec in specs.items():
        cases = prepare(spec, target.api_function(unit), Context(None), [12345, 67890])
        ok = [c for c in cases if c.shape.expect == "ok"]
        assert ok and all(len(c.calls) == 2 for c in ok)
        assert any(c.shape.timed for c in cases), unit
        for c in ok:  # two seeds, two different inputs (the second call must not be answerable from the first)
            a, b = (c.calls[p].expect for p in (0, 1))
            assert any(not (a[k] == b[k]).all() for k in a), (unit, c.shape.label)


# ---------------------------------------------------------------------------
# calibration on the GPU
# ---------------------------------------------------------------------------

def _gpu_skip_reason() -> str | None:
    if CHECKOUT is None:
        return "no ds4 checkout (set PORTER_DS4_SOURCE or put it at external/ds4)"
    from porter.gates.parity import available

    ok, why = available()
    if not ok:
        return f"parity gate unavailable here: {why}"
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "nvcc not on PATH: cannot build the upstream backend"
    inc = Path(nvcc).resolve().parent.parent / "include" / "cublas_v2.h"
    if not inc.is_file() and not Path("/usr/include/cublas_v2.h").is_file():
        return f"no cuBLAS headers ({inc}): the upstream backend needs cuBLAS"
    return None


@pytest.fixture(scope="module")
def report(target):
    why = _gpu_skip_reason()
    if why:
        pytest.skip(why)
    from porter.calibrate import table
    from porter.known_good import calibrate

    args = argparse.Namespace(workspace=REPO, unit=None, mutant=None, all_mutants=True, timeout=180.0,
                              timing_reps=10, mode="cuda", out_dir=os.environ.get("PORTER_KNOWN_GOOD_DIR"))
    rep = calibrate(target, args)
    print("\n" + table(rep))
    if os.environ.get("PORTER_DS4_REPORT"):
        Path(os.environ["PORTER_DS4_REPORT"]).write_text(json.dumps(rep, indent=1, default=str))
    return rep


@pytest.mark.gpu
def test_upstream_passes_every_ds4_spec(report):
    good = {r["unit"]: r for r in report["rows"] if r["kind"] == "known-good"}
    assert REQUIRED_UNITS <= set(good)
    bad = {u: r["summary"] for u, r in good.items() if not r["ok"]}
    assert not bad, bad


@pytest.mark.gpu
def test_every_mutant_is_rejected_by_its_check(report):
    muts = [r for r in report["rows"] if r["kind"] == "mutant"]
    assert any(r["name"] == "iq2_xxs-as-q8_0" for r in muts)
    wrong = {r["name"]: f"want {r['expect']}, got {r['got']}: {r['summary']}" for r in muts if not r["ok"]}
    assert not wrong, wrong
