"""A case whose reference is too small for its tolerance proves nothing: an all-zero answer
passes it.  gate.zero_answer_passes finds such cases with the spec's own value checks, and
calibration refuses the spec (issue: 'an all-zero answer would pass' is refused)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from porter.gates.parity.gate import prepare, zero_answer_passes
from porter.spec import Call, Context, In, Out, Shape, Tol, load_spec
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
UNIT = "mini_gpu_add_tensor"


@pytest.fixture(scope="module")
def target():
    return load_target(REPO, "minimoe")


def _spec(target, scale: float, tol: Tol, shapes=None):
    def build(shape, ctx, rng):
        n = shape.dims["n"]
        a = (rng.standard_normal(n) * scale).astype(np.float32)
        b = (rng.standard_normal(n) * scale).astype(np.float32)
        return Call(args={"out": Out("f32", (n,)), "a": In(a), "b": In(b), "n": n}, expect={"out": a + b})

    base = load_spec(target, UNIT)
    return dataclasses.replace(base, build=build, outputs={"out": tol},
                               shapes=shapes or [Shape("n=64", {"n": 64}), Shape("n=7", {"n": 7})])


def _blind(target, spec):
    return zero_answer_passes(spec, prepare(spec, target.api_function(UNIT), Context.for_target(target), [1, 2]))


def test_a_reference_far_below_an_absolute_tolerance_is_blind(target):
    assert _blind(target, _spec(target, 1e-6, Tol(nmse=None, max_err_rms=None, max_abs=1e-3))) == [
        "n=64 / out", "n=7 / out"]


def test_a_relative_tolerance_sees_a_zero_answer_at_any_scale(target):
    assert _blind(target, _spec(target, 1e-6, Tol(nmse=1e-6, max_err_rms=None))) == []
    assert _blind(target, _spec(target, 1.0, Tol(nmse=None, max_err_rms=None, max_abs=1e-3))) == []


def test_a_declared_zero_case_is_allowed_but_not_a_spec_of_only_such_cases(target):
    tol = Tol(nmse=None, max_err_rms=None, max_abs=0.0)
    zero = Shape("n=0", {"n": 0}, zero_answer="nothing to add")
    assert _blind(target, _spec(target, 1.0, tol, [zero, Shape("n=7", {"n": 7})])) == []
    undeclared = Shape("n=0", {"n": 0})
    assert _blind(target, _spec(target, 1.0, tol, [undeclared, Shape("n=7", {"n": 7})])) == ["n=0 / out"]
    only = _blind(target, _spec(target, 1.0, tol, [zero]))
    assert len(only) == 1 and "every ok case declares an all-zero answer" in only[0]


def test_every_bundled_minimoe_spec_tells_a_zero_answer_from_the_right_one(target):
    from porter.spec import UnitSpec, load_specs

    ctx = Context.for_target(target)
    for unit, spec in sorted(load_specs(target).items()):
        if isinstance(spec, UnitSpec):
            assert zero_answer_passes(spec, prepare(spec, target.api_function(unit), ctx, [3, 4])) == [], unit


def test_calibration_refuses_a_spec_an_all_zero_answer_passes(target, tmp_path, monkeypatch):
    """Known-good passes and the mutant is rejected, yet the spec is not calibrated: the parity
    evidence says a zero answer would pass one of its cases."""
    import porter.calibration.calibrator as cal
    from porter.gates.mutants import Mutant
    from porter.gates.result import GateResult
    from porter.records.history import History

    mutant = Mutant(UNIT, "m", "values", "wrong", "rules", file="x")
    monkeypatch.setattr(cal, "load_mutants", lambda t: [mutant])

    def fake_parity(target, unit, lib, opts, timeout=None, env=None, seeds=None, fresh_process=False):
        if lib.name == "mutant.so":
            return GateResult("parity", False, "parity failed [values]", check="values", evidence={})
        return GateResult("parity", True, "parity ok", evidence={
            "target": "minimoe", "unit": unit, "gate": "parity", "ok": True, "candidate_sha256": "0" * 64,
            "zero_answer_passes": ["n=7 / out"]})

    monkeypatch.setattr(cal, "parity_on_library", fake_parity)

    class Libs:
        describe = "fake"

        def has(self, unit):
            return True

        def prepare(self, mutants, progress=None):
            pass

        def known_good(self):
            return tmp_path / "good.so"

        def mutant(self, m):
            return tmp_path / "mutant.so"

    (tmp_path / "good.so").write_bytes(b"x")
    ws = tmp_path / "ws"
    ws.mkdir()
    lines = []
    cal.calibrate(target, Libs(), cal.CalibrateOptions(ws, units=[UNIT]), out=lines.append)
    st = History.read(ws, "minimoe").calibration_status(UNIT, load_spec(target, UNIT).sha256)
    assert not st["calibrated"] and "all-zero answer passes 1 case" in st["reason"], st
    assert any("zero answer passes: n=7 / out" in ln for ln in lines)


def test_caller_given_seeds_prepare_a_spec_once_fresh_seeds_every_time(target, monkeypatch):
    """Calibration runs one unit on the known-good, each variant and each mutant with the same
    seeds: the inputs and references are prepared once.  A candidate's fresh seeds keep nothing."""
    from porter.gates.parity import gate

    calls = []
    real = gate.prepare
    monkeypatch.setattr(gate, "prepare", lambda *a, **kw: calls.append(a[-1]) or real(*a, **kw))
    spec, fn, ctx = load_spec(target, UNIT), target.api_function(UNIT), Context.for_target(target)
    first = gate._prepared(spec, fn, ctx, [11, 12], remember=True)
    assert gate._prepared(spec, fn, ctx, [11, 12], remember=True) is first and calls == [[11, 12]]
    gate._prepared(spec, fn, ctx, [13, 14], remember=False)
    gate._prepared(spec, fn, ctx, [13, 14], remember=False)
    assert calls == [[11, 12], [13, 14], [13, 14]]
    other = _spec(target, 1.0, Tol(nmse=1e-6, max_err_rms=None))  # same file, another build: not the same cases
    assert gate._prepared(other, fn, ctx, [11, 12], remember=True) is not first
