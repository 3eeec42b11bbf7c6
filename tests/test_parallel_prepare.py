"""prepare() builds a spec's calls on several threads (gate.BUILD_THREADS): the cases must be exactly the
ones one thread makes, in order, and a Context shared by the threads makes its fixture tables and its
scratch folder once.  CPU only, on minimoe's specs."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from porter.gates.parity import gate
from porter.spec import Context, SpecError, load_spec
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]


def _arrays(cases):
    out = []
    for c in cases:
        for call in c.timing_sets:
            for k in sorted(call.args):
                v = call.args[k]
                data = getattr(v, "data", v)
                if isinstance(data, np.ndarray):
                    out.append((c.id, k, data.tobytes()))
            for k in sorted(call.expect):
                out.append((c.id, "expect:" + k, np.asarray(call.expect[k]).tobytes()))
    return out


@pytest.mark.parametrize("unit", ["mini_gpu_matmul_q8_0_tensor", "mini_gpu_swiglu_tensor"])
def test_threaded_prepare_makes_the_same_cases_as_one_thread(monkeypatch, unit):
    target = load_target(REPO, "minimoe")
    spec = load_spec(target, unit)
    api = target.api_function(unit)
    monkeypatch.setattr(gate, "BUILD_THREADS", 1)
    one = gate.prepare(spec, api, Context.for_target(target), [5, 9])
    monkeypatch.setattr(gate, "BUILD_THREADS", 4)
    many = gate.prepare(spec, api, Context.for_target(target), [5, 9])
    assert [c.id for c in one] == [c.id for c in many]
    assert _arrays(one) == _arrays(many) and _arrays(one), "same inputs and references, byte for byte"


def test_the_first_failing_case_in_order_is_the_one_reported(monkeypatch):
    target = load_target(REPO, "minimoe")
    spec = load_spec(target, "mini_gpu_swiglu_tensor")
    good = spec.build

    def build(shape, ctx, rng):
        if shape is spec.shapes[1] or shape is spec.shapes[2]:
            raise ValueError(f"bad {shape.label}")
        return good(shape, ctx, rng)

    monkeypatch.setattr(spec, "build", build)
    monkeypatch.setattr(gate, "BUILD_THREADS", 4)
    with pytest.raises(SpecError, match=f"shape {spec.shapes[1].label!r}: building inputs failed: ValueError"):
        gate.prepare(spec, target.api_function(spec.unit), Context.for_target(target), [1, 2])


def test_threads_sharing_a_context_get_one_scratch_folder_and_one_load(monkeypatch, tmp_path):
    target = load_target(REPO, "minimoe")
    ctx = Context.for_target(target)
    loads = []
    real = Context._load_locked

    def counted(self):
        loads.append(1)
        real(self)

    monkeypatch.setattr(Context, "_load_locked", counted)
    start = threading.Event()
    made = []

    def reader():
        start.wait()
        ctx._load()
        made.append(ctx.fixture_map().file)

    ts = [threading.Thread(target=reader) for _ in range(6)]
    [t.start() for t in ts]
    start.set()
    [t.join() for t in ts]
    assert len(loads) == 1 and len(set(made)) == 1
    n = []
    assert ctx.cached("k", lambda: n.append(1) or 7) == 7 and ctx.cached("k", lambda: n.append(1) or 8) == 7
    assert n == [1]
