"""Timing a candidate cannot game (host stand-in backend, no GPU needed).

Each test names the hack it targets and shows the check refusing it: work
skipped once the calls are being timed ("timing"), a time below what the
device's bandwidth allows ("impossible"), and statistics the child could
dress up (they are computed here from raw times).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from porter.gates.parity import executors
from porter.gates.parity.gate import run_spec, timing_stats
from porter.spec import load_spec

from tests.test_parity_compare import FAKE_BACKEND, fixture_ctx, target  # noqa: F401  (fixtures)

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc)")

UNIT = "mini_gpu_swiglu_tensor"
HONEST_LOOP = "for (uint64_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];"
# the GPU MODE hack: behave while checked (the two parity calls), skip the work once timed
SKIP_WHEN_TIMED = r"""
    { static void *last; static uint64_t last_n; static int calls;  /* one case = same buffer, same size */
      if (out->data == last && n == last_n) calls++; else { last = out->data; last_n = n; calls = 1; }
      if (calls > 2) return 0; }
    """ + HONEST_LOOP


# The replay hack of the issue: an honest but slow kernel (3 ms) that, called again with the same buffers and
# the same few input bytes, copies its last answer instead.  Timed on unchanged inputs (the harness before
# input rotation) every timed call replayed and timed as a memcpy; rotated, none can.
SLOW_MS = 3
REPLAY_UNCHANGED = r"""
    { static void *k_o, *k_g, *k_u; static uint64_t k_n; static float k_b[2]; static float *memo;
      float b[2] = {n ? g[0] : 0.0f, n ? u[n - 1] : 0.0f};
      if (memo && k_o == out->data && k_g == gate->data && k_u == up->data && k_n == n && !memcmp(b, k_b, sizeof b)) {
          memcpy(o, memo, n * 4); return 0; }
      k_o = out->data; k_g = gate->data; k_u = up->data; k_n = n; memcpy(k_b, b, sizeof b);
      { struct timespec ts = {0, """ + str(SLOW_MS * 1000000) + r"""}; nanosleep(&ts, 0); }
      """ + HONEST_LOOP + r"""
      free(memo); memo = malloc(n * 4 + 4); memcpy(memo, o, n * 4); return 0; }
    """


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("timing")
    out = {}
    variants = {"honest": FAKE_BACKEND, "skip_timed": FAKE_BACKEND.replace(HONEST_LOOP, SKIP_WHEN_TIMED),
                "wrong": FAKE_BACKEND.replace(HONEST_LOOP, HONEST_LOOP.replace("* u[i]", "+ u[i]")),
                "replay_unchanged": "#define _POSIX_C_SOURCE 199309L\n#include <time.h>\n"
                                    + FAKE_BACKEND.replace(HONEST_LOOP, REPLAY_UNCHANGED)}
    for name, src in variants.items():
        assert src != FAKE_BACKEND or name == "honest"
        (d / f"{name}.c").write_text(src)
        subprocess.run([CC, "-O1", "-shared", "-fPIC", "-o", str(d / f"lib{name}.so"), str(d / f"{name}.c"), "-lm"],
                       check=True)
        out[name] = d / f"lib{name}.so"
    return out


@pytest.fixture
def fresh_pool():
    executors.shutdown()  # workers read the environment when they start
    yield
    executors.shutdown()


def _run(target, ctx, lib, tmp_path, reps=4):
    return run_spec(target, load_spec(target, UNIT), lib, workspace=tmp_path, mode="host", ctx=ctx, timing_reps=reps)


def test_honest_candidate_is_timed_and_rechecked(target, fixture_ctx, libs, tmp_path, fresh_pool):
    r = _run(target, fixture_ctx, libs["honest"], tmp_path)
    assert r.ok, r.summary + "\n" + r.diagnostics
    t = r.evidence["timing"]
    assert t["reps"] == 4 and t["median_ms"] > 0 and t["bytes"] > 0
    assert "timing" in r.evidence["checks"]["run"] and "impossible" in r.evidence["checks"]["run"]
    assert r.evidence["regime"]["name"] == target.spec.perf.regime == "device"  # named in the evidence
    assert t["input_sets"] == 3 and len(t["times_ms"]) == 4 and t["tail_median_ms"] is not None
    # where the run's time went, each phase once: the executor's share holds the queue and the child
    h = r.evidence["harness_s"]
    phases = ("prepare_s", "plan_s", "executor_s", "judge_s")
    assert all(h[k] >= 0 for k in phases + ("waited_s", "child_s")) and h["child_s"] > 0
    assert h["waited_s"] + h["child_s"] <= h["executor_s"] + 0.01
    assert sum(h[k] for k in phases) <= h["total_s"] + 0.01


def test_work_skipped_while_timed_is_caught(target, fixture_ctx, libs, tmp_path, fresh_pool):
    r = _run(target, fixture_ctx, libs["skip_timed"], tmp_path)
    assert not r.ok
    assert r.summary.startswith("parity failed [timing]"), r.summary
    assert "sentinel" in r.summary  # the timed call left the reset outputs unwritten


def test_faster_than_the_roofline_is_refused(target, fixture_ctx, libs, tmp_path, monkeypatch, fresh_pool):
    # a device whose bandwidth makes the honest host time impossible: the check must fire
    monkeypatch.setenv("PORTER_PARITY_HOST_PEAK_GBPS", "0.0001")
    r = _run(target, fixture_ctx, libs["honest"], tmp_path)
    assert not r.ok and r.summary.startswith("parity failed [impossible]"), r.summary
    monkeypatch.setenv("PORTER_PARITY_HOST_PEAK_GBPS", "1e9")
    executors.shutdown()
    assert _run(target, fixture_ctx, libs["honest"], tmp_path).ok


def test_statistics_come_from_the_raw_times_not_the_child():
    t = timing_stats({"reps": 3, "times_ms": [3.0, 1.0, 2.0], "median_ms": 1e-9, "p90_ms": 1e-9, "checked_reps": [2]})
    assert t["median_ms"] == 2.0 and t["p90_ms"] == 3.0 and t["min_ms"] == 1.0
    assert timing_stats({"reps": 2, "times_ms": [float("nan")], "median_ms": 0.5})["median_ms"] is None


def test_cases_prepared_during_the_build_are_the_ones_judged(target, fixture_ctx, libs, tmp_path, fresh_pool):
    """The driver prepares parity's inputs and references while nvcc compiles (parity.start_ahead):
    the run judges exactly those cases, refuses a bad candidate on them as on its own, and
    ignores a set prepared for another version of the spec."""
    from porter.gates.parity.gate import Prepared, prepare

    spec = load_spec(target, UNIT)
    seeds = [0x1234, 0x5678]
    pre = Prepared(UNIT, spec.sha256, seeds, prepare(spec, target.api_function(UNIT), fixture_ctx, seeds),
                   fixture_ctx)
    hexed = [f"{s:016x}" for s in seeds]
    r = run_spec(target, spec, libs["honest"], workspace=tmp_path, mode="host", timing_reps=2, prepared=pre)
    assert r.ok, r.summary
    assert r.evidence["seeds"] == hexed
    bad = run_spec(target, spec, libs["skip_timed"], workspace=tmp_path, mode="host", timing_reps=2, prepared=pre)
    assert not bad.ok and bad.summary.startswith("parity failed [timing]")
    stale = Prepared(UNIT, "0" * 64, seeds, pre.cases, fixture_ctx)
    r2 = run_spec(target, spec, libs["honest"], workspace=tmp_path, mode="host", timing_reps=2, ctx=fixture_ctx,
                  prepared=stale)
    assert r2.ok and r2.evidence["seeds"] != hexed  # prepared again, with fresh seeds


def test_a_spec_error_found_ahead_is_a_skip(target, fixture_ctx, libs, tmp_path, fresh_pool):
    from porter.gates.parity.gate import Prepared

    spec = load_spec(target, UNIT)
    pre = Prepared(UNIT, spec.sha256, [1, 2], [], None, error="shape 'x' has no size")
    r = run_spec(target, spec, libs["honest"], workspace=tmp_path, mode="host", prepared=pre)
    assert r.skipped and not r.ok and "spec error" in r.summary


def test_remembered_cases_keep_the_files_their_context_wrote(target, monkeypatch):
    """Calibration runs one spec on the known-good, each env-knob variant and each mutant with the
    same seeds, and prepares its cases once.  A case's weight map can be a file in the preparing
    Context's scratch folder (the sparse MoE maps): every later run must get that Context with the
    cases, or the file is deleted with it once the first run is over (the MoE specs' variants and
    mutants crashed on a missing map on the H100, 2026-11-23)."""
    import gc
    import tempfile
    from pathlib import Path

    from porter.gates.parity import gate

    def file_backed(spec, api_fn, ctx, seeds, **kw):  # what Context.weights does for a map past SPARSE_MIN
        ctx._scratch = ctx._scratch or tempfile.TemporaryDirectory(prefix="porter-weights-")
        f = Path(ctx._scratch.name) / "weights.map"
        f.write_bytes(bytes(64))
        return [f]

    monkeypatch.setattr(gate, "prepare", file_backed)
    monkeypatch.setattr(gate, "_PREPARED", {})
    spec = load_spec(target, UNIT)
    first = gate.prepare_cases(target, spec, [11, 22])  # no ctx given: a fresh Context, as calibration does
    weights = first.cases[0]
    del first
    gc.collect()
    again = gate.prepare_cases(target, spec, [11, 22])
    assert again.cases == [weights] and weights.is_file()
    fresh = gate.prepare_cases(target, spec)  # fresh seeds: nothing remembered, its own Context
    assert fresh.ctx is not again.ctx


def test_a_candidate_replaying_its_answer_on_unchanged_inputs_does_the_work_on_every_timed_call(
        target, fixture_ctx, libs, tmp_path, fresh_pool):
    """Every timed call gets another input set than the call before it (the warm call included), so the
    replay never fires while timed: the slowest-path time is what is measured, and it is right."""
    r = _run(target, fixture_ctx, libs["replay_unchanged"], tmp_path, reps=5)
    assert r.ok, r.summary
    t = r.evidence["timing"]
    assert t["min_ms"] >= 0.8 * SLOW_MS, t  # the old harness timed a memcpy here (~0.1 ms)
    assert t["input_sets"] >= 3 and t["reps"] == 5


def test_rotation_never_repeats_a_set_back_to_back_and_uses_every_set():
    import random

    from porter.gates.parity.gate import rotation_order

    for seed in range(50):
        order = rotation_order(3, 10, random.Random(seed))
        assert len(order) == 10 and set(order) == {0, 1, 2}
        assert all(a != b for a, b in zip(order, order[1:])), order
    assert rotation_order(2, 6, random.Random(3)) in ([0, 1, 0, 1, 0, 1], [1, 0, 1, 0, 1, 0])


def _timed_case(target, fixture_ctx):
    from porter.gates.parity.gate import prepare

    spec = load_spec(target, UNIT)
    cases = prepare(spec, target.api_function(UNIT), fixture_ctx, [0x1111, 0x2222])
    case = next(c for c in cases if c.shape.timed)
    return spec, case


def _answer(call):
    import numpy as np

    return np.frombuffer(np.asarray(call.expect["out"], dtype="<f4").tobytes(), dtype=np.uint8).copy()


def _judge(spec, case, timing, outputs, order):
    from porter.gates.parity.gate import evaluate

    results = {"cases": [{"id": case.id, "passes": [], "timing": timing}]}
    fails, _ = evaluate(spec, [case], results, outputs, orders={case.id: order})
    return [f for f in fails if f.check == "timing"]


def test_a_checked_repetition_is_judged_against_its_own_input_set(target, fixture_ctx):
    """A timed case has extra input sets, built here with their references; the parent knows which set each
    repetition got, so the previous repetition's answer (a replay) is refused on the next one."""
    spec, case = _timed_case(target, fixture_ctx)
    sets = case.timing_sets
    assert len(sets) == 3 and len(case.calls) == 2
    order = [2, 0, 1]
    timing = {"reps": 3, "times_ms": [1.0, 1.0, 1.0], "tail_ms": [0.0] * 3, "checked_reps": [1, 2]}
    right = {f"{case.id}.t1.out": _answer(sets[0]), f"{case.id}.t2.out": _answer(sets[1])}
    assert _judge(spec, case, timing, right, order) == []
    replayed = {f"{case.id}.t1.out": _answer(sets[2]), f"{case.id}.t2.out": _answer(sets[0])}
    fails = _judge(spec, case, timing, replayed, order)
    assert len(fails) == 2 and "input set 1 of 3" in fails[0].detail, [f.detail for f in fails]


def test_work_left_past_the_end_event_is_refused(target, fixture_ctx):
    spec, case = _timed_case(target, fixture_ctx)
    sets = case.timing_sets
    outputs = {f"{case.id}.t0.out": _answer(sets[0])}
    quiet = {"reps": 3, "times_ms": [0.4] * 3, "tail_ms": [0.01, 0.02, 0.01], "checked_reps": [0]}
    assert _judge(spec, case, quiet, outputs, [0, 1, 2]) == []
    busy = dict(quiet, tail_ms=[0.9, 1.1, 1.0])  # the device still busy a millisecond after each end event
    fails = _judge(spec, case, busy, outputs, [0, 1, 2])
    assert fails and "still busy" in fails[0].detail
    settled = dict(quiet, settle_changed_reps=[0])  # outputs changed between the end event and the device sync
    fails = _judge(spec, case, settled, outputs, [0, 1, 2])
    assert fails and "past the end event" in fails[0].detail


def test_a_screen_runs_the_untimed_cases_only_and_decides_nothing_the_timed_ones_would(target, fixture_ctx, libs,
                                                                                     tmp_path, fresh_pool):
    """ParityOptions.screen (mutation testing's first pass): the cases the spec does not time, no timed call.
    It refuses a wrong answer as the whole spec would; a candidate that misbehaves only while timed passes
    it, which is why a pass there is never a verdict (the mutation runner then runs the whole spec)."""
    spec = load_spec(target, UNIT)
    untimed = sum(not s.timed for s in spec.shapes)
    assert 0 < untimed < len(spec.shapes)
    run = lambda lib: run_spec(target, spec, lib, workspace=tmp_path, mode="host", ctx=fixture_ctx,  # noqa: E731
                               timing_reps=4, screen=True)
    ok = run(libs["honest"])
    assert ok.ok and ok.evidence["screen"] == {"cases": untimed} and ok.evidence["timing"] is None
    assert len(ok.evidence["cases"]) == untimed
    wrong = run(libs["wrong"])
    assert not wrong.ok and wrong.evidence["screen"] == {"cases": untimed}
    assert run(libs["skip_timed"]).ok  # only the whole spec's timed calls show it (test above)
    whole = run_spec(target, spec, libs["honest"], workspace=tmp_path, mode="host", ctx=fixture_ctx, timing_reps=4)
    assert "screen" not in whole.evidence and whole.evidence["timing"] is not None
    assert len(whole.evidence["cases"]) == len(spec.shapes)
