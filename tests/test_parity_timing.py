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

from porter.gates.parity import pool
from porter.gates.parity.gate import run_spec, timing_stats
from porter.gates.parity.spec import load_spec

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


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("timing")
    out = {}
    for name, src in {"honest": FAKE_BACKEND, "skip_timed": FAKE_BACKEND.replace(HONEST_LOOP, SKIP_WHEN_TIMED)}.items():
        assert src != FAKE_BACKEND or name == "honest"
        (d / f"{name}.c").write_text(src)
        subprocess.run([CC, "-O1", "-shared", "-fPIC", "-o", str(d / f"lib{name}.so"), str(d / f"{name}.c"), "-lm"],
                       check=True)
        out[name] = d / f"lib{name}.so"
    return out


@pytest.fixture
def fresh_pool():
    pool.shutdown()  # workers read the environment when they start
    yield
    pool.shutdown()


def _run(target, ctx, lib, tmp_path, reps=4):
    return run_spec(target, load_spec(target, UNIT), lib, workspace=tmp_path, mode="host", ctx=ctx, timing_reps=reps)


def test_honest_candidate_is_timed_and_rechecked(target, fixture_ctx, libs, tmp_path, fresh_pool):
    r = _run(target, fixture_ctx, libs["honest"], tmp_path)
    assert r.ok, r.summary + "\n" + r.diagnostics
    t = r.evidence["timing"]
    assert t["reps"] == 4 and t["median_ms"] > 0 and t["bytes"] > 0
    assert "timing" in r.evidence["checks"]["run"] and "impossible" in r.evidence["checks"]["run"]


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
    pool.shutdown()
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

    def file_backed(spec, api_fn, ctx, seeds):  # what Context.weights does for a map past SPARSE_MIN
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
