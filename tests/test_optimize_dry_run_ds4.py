"""The ds4 optimize dry run's CPU side (tests/gpu_optimize_dry_run_ds4.py; the run itself needs a GPU):
the answers it scripts from upstream's slices (the slow start differs from upstream only by the delay
kernel and its one launch, the wrong one only by its early return; all pass the static gate), the
manifest's order per unit (what each `porter run` / `porter optimize` step consumes), the starting
port's loosened perf limit set and reverted exactly, the delay kernel compiling for the H100, and the
run's verdict failing when a refusal or a speedup did not hold."""

from __future__ import annotations

import subprocess

import pytest

import gpu_optimize_dry_run_ds4 as dry
from conftest import NO_DS4, ds4_checkout, needs_nvcc
from porter.cli import main
from porter.gates.extract import extract_unit_source
from porter.gates import static
from porter.gates.driver import Candidate, GateContext
from porter.providers.scripted import load_manifest
from porter.target import load_target

needs_ds4 = pytest.mark.skipif(ds4_checkout() is None, reason=NO_DS4 + " (the answers are slices of its ds4_cuda.cu)")


@pytest.fixture(scope="module")
def answered(tmp_path_factory):
    """A fresh ds4 workspace with the dry run's answers written (as the GPU script writes them)."""
    ws = tmp_path_factory.mktemp("dry") / "ws"
    assert main(["init", str(ws), "--target", "ds4", "--source", str(ds4_checkout())]) == 0
    manifest = dry.write_answers(ws, dry.DEFAULT_UNITS, set(dry.DEFAULT_AA_UNITS))
    return ws, load_target(ws, "ds4", None), manifest


def answer_text(target, entry) -> str:
    return (target.scripted_dir / entry["file"]).read_text()


@needs_ds4
def test_the_slow_and_wrong_answers_are_upstream_but_for_the_slowdown_or_the_skip(answered):
    ws, target, manifest = answered
    for unit, delay_us in dry.DEFAULT_UNITS.items():
        mine = {e["role"]: answer_text(target, e) for e in manifest if e["unit"] == unit}
        upstream, slow, wrong = mine["speedup"], mine["slow start"], mine["wrong"]
        launch = dry.slow_launch(delay_us)
        assert slow.count(launch) == 1 and slow.count(dry.DELAY_KERNEL) == 1
        assert slow.replace(launch, "").replace(dry.DELAY_KERNEL, "") == upstream
        # the launch is the body's first statement: the delay runs before any of upstream's work
        start, body = dry.api_definition(slow, unit)
        assert slow[body:].startswith(launch) and slow.index(dry.DELAY_KERNEL) < start
        skip = [ln for ln in wrong.splitlines(keepends=True) if ln not in upstream.splitlines(keepends=True)]
        assert len(skip) == 1 and "return 1;" in skip[0]
        assert wrong.replace(skip[0], "") == upstream
        for role, text in mine.items():
            src = extract_unit_source(text, unit, target)
            res = static.run(Candidate.of(unit, src), GateContext(target))
            assert res.ok, (unit, role, res.summary)


@needs_ds4
def test_the_manifest_gives_each_unit_its_answers_in_the_order_the_steps_use_them(answered):
    ws, target, manifest = answered
    loaded = load_manifest(target)  # the scripted provider's own reading (validates every entry)
    assert [(a.unit, a.file) for a in loaded] == [(e["unit"], e["file"]) for e in manifest]
    for unit in dry.DEFAULT_UNITS:
        roles = [e["role"] for e in manifest if e["unit"] == unit]
        mutants = [f"perf mutant {m.name}" for m in dry.perf_mutants(target, unit)]
        aa = ["A/A"] if unit in dry.DEFAULT_AA_UNITS else []
        # porter run takes the first, the accept step the second, the refuse step every later one
        assert roles == ["slow start", "speedup", *aa, "wrong", *mutants]
        mine = [e for e in manifest if e["unit"] == unit]
        assert [e["must"] for e in mine[2:]] == (["inconclusive"] if aa else []) + ["parity"] + \
            [m.must_fail_check for m in dry.perf_mutants(target, unit)]
        if aa:  # A/A is the committed code itself: the very file the accept step landed
            assert mine[2]["file"] == mine[1]["file"]
    # the replay hack the issue names is among them, refused by the check its mutant names
    replay = [e for e in manifest if "replays-unchanged-inputs" in e["file"]]
    assert [(e["unit"], e["must"], e["expect"]) for e in replay] == [("ds4_gpu_matmul_q8_0_tensor", "slowdown", "perf")]


@needs_ds4
def test_the_starting_limit_is_the_documented_override_and_is_reverted_exactly(tmp_path):
    ws = tmp_path / "ws"
    assert main(["init", str(ws), "--target", "ds4", "--source", str(ds4_checkout())]) == 0
    path = ws / "targets" / "ds4" / "target.toml"
    before = path.read_text()
    assert load_target(ws, "ds4", None).spec.perf.max_slowdown is None  # the calibrated limits decide
    dry.set_starting_limit(ws, True)
    assert load_target(ws, "ds4", None).spec.perf.max_slowdown == dry.STARTING_LIMIT
    dry.set_starting_limit(ws, False)
    assert path.read_text() == before


@needs_nvcc
def test_the_delay_kernel_compiles_for_the_h100(tmp_path):
    cu = tmp_path / "delay.cu"
    cu.write_text(dry.DELAY_KERNEL + "void launch(void) { porter_dry_run_delay<<<1, 1, 0, 0>>>(30000ull); }\n")
    r = subprocess.run(["nvcc", "-c", "-arch=sm_90", "-o", str(tmp_path / "delay.o"), str(cu)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_verdict_fails_when_a_refusal_or_a_speedup_did_not_hold():
    unit = "ds4_gpu_add_tensor"
    good = {"before": {unit: {"state": "verified"}},
            "units": {unit: {"outcome": "faster", "proof": {"p_value": 5.4e-6}, "answer": f"dryrun/{unit}/upstream.md",
                             "still_verified_after_refusals": True,
                             "perf": {"ok": True, "limit": 2.31, "basis": "known-good spread 65.5% over 30 calls"}}},
            "manifest": [{"unit": unit, "file": "u.md", "role": "speedup", "must": None},
                         {"unit": unit, "file": "u.md", "role": "A/A", "must": "inconclusive"},
                         {"unit": unit, "file": "w.md", "role": "wrong", "must": "parity"}],
            "refusals": [{"unit": unit, "offered": "A/A", "file": "u.md", "must_be_refused_by": "inconclusive", "ok": True},
                         {"unit": unit, "offered": "wrong", "file": "w.md", "must_be_refused_by": "parity", "ok": True}],
            "geomean_x_known_good_before": 1.8, "geomean_x_known_good_after": 1.0}
    assert all(dry.checks(good, {unit: 30}).values())
    aa_won = dict(good, refusals=[dict(good["refusals"][0], ok=False), good["refusals"][1]])
    assert not dry.checks(aa_won, {unit: 30})[f"{unit}: A/A refused by inconclusive"]
    never_offered = dict(good, refusals=good["refusals"][:1])  # e.g. the run stopped before the wrong answer
    assert not dry.checks(never_offered, {unit: 30})[f"{unit}: wrong refused by parity"]
    no_gain = dict(good, geomean_x_known_good_after=1.8)
    assert not dry.checks(no_gain, {unit: 30})["geomean x known-good improved"]
    slow_kept = dict(good, units={unit: dict(good["units"][unit], outcome="not faster")})
    assert not dry.checks(slow_kept, {unit: 30})[f"{unit}: upstream accepted with proof"]
    loose = dict(good, units={unit: dict(good["units"][unit], perf={"ok": True, "limit": 4.0,
                                                                    "basis": "[perf] max_slowdown = 4"})})
    assert not dry.checks(loose, {unit: 30})[f"{unit}: optimize judged by the calibrated limit"]
