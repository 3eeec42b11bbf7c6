"""Parity gate on a real GPU: calibration of every minimoe spec.

Needs cupy, an NVIDIA GPU and nvcc; skipped with the reason otherwise.  One
session-wide calibration run (the same code as `porter calibrate`) builds the
known-good library (glue + every scripted good answer) and one library per
adversarial mutant, runs every spec, and the tests below read its rows:
  - every spec accepts the known-good build,
  - every mutant is rejected, by the check its manifest entry names,
  - the slow-but-correct scripted answer (expect = "perf") passes parity and is refused by perf
    ("slowdown", against the known-good run of the same calibration), as is every perf mutant.
Set PORTER_PARITY_REPORT=FILE to keep the report (JSON) and the printed tables.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from porter.gates.parity import available

REPO = Path(__file__).resolve().parents[1]

_ok, _why = available()
if not _ok:
    pytest.skip(f"parity gate unavailable here: {_why}", allow_module_level=True)
if shutil.which("nvcc") is None:
    pytest.skip("nvcc not on PATH: cannot build the known-good library", allow_module_level=True)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="session")
def target():
    from porter.target import load_target

    return load_target(REPO, "minimoe")


@pytest.fixture(scope="session")
def report(target, tmp_path_factory):
    from porter.calibration.calibrator import CalibrateOptions, calibrate, matrix, table
    from porter.calibration.libraries import libraries_for
    from porter.gates.driver import ParityOptions

    cache = os.environ.get("PORTER_BUILD_CACHE") or str(tmp_path_factory.mktemp("build-cache"))
    libs = libraries_for(target, "scripted", Path(cache))
    rep = calibrate(target, libs, CalibrateOptions(REPO, parity=ParityOptions(timeout=60.0), ledger=False))
    text = table(rep) + "\n\n" + matrix(rep, target.symbol_prefix)
    print("\n" + text)
    out = os.environ.get("PORTER_PARITY_REPORT")
    if out:
        Path(out).write_text(json.dumps(rep, indent=1, default=str))
        Path(out).with_suffix(".txt").write_text(text + "\n")
    return rep


def _rows(report, kind):
    return [r for r in report["rows"] if r["kind"] == kind]


def _units():
    from porter.spec import load_specs
    from porter.target import load_target

    return sorted(load_specs(load_target(REPO, "minimoe")))


def _mutants():
    from porter.gates.mutants import adversarial
    from porter.target import load_target

    return [m.name for m in adversarial(load_target(REPO, "minimoe"))]


@pytest.mark.parametrize("unit", _units())
def test_known_good_passes(report, unit):
    row = next(r for r in _rows(report, "known-good") if r["unit"] == unit)
    assert row["ok"] and row["got"] == "pass", row["summary"]


@pytest.mark.parametrize("name", _mutants())
def test_mutant_rejected_by_its_check(report, name):
    row = next(r for r in report["rows"] if r["kind"] != "known-good" and r["name"] == name)
    assert row["got"] == row["expect"], f"{name}: wanted [{row['expect']}], got [{row['got']}]: {row['summary']}"


def test_correct_but_slow_scripted_answer_is_refused_by_perf(report):
    perf = [r for r in report["rows"] if r["expect"] == "slowdown" and r["kind"] == "scripted"]
    assert perf, "the scripted manifest has a correct-but-serial answer (expect = perf)"
    for r in perf:
        assert r["ok"] and r["got"] == "slowdown", r["summary"]


def test_persisting_l2_is_reset_before_each_timed_call():
    """A candidate can carve out persisting L2 and pin its inputs there (a flush by plain writes does not
    evict persisting lines): the harness puts the carve-out back to 0 before every timed call."""
    import cupy

    from porter.gates.parity import device as devmod

    dev = devmod.CudaDevice()
    rt = cupy.cuda.runtime
    try:
        rt.deviceSetLimit(devmod.LIMIT_PERSISTING_L2, 4 << 20)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"this GPU/runtime has no persisting L2 carve-out: {exc}")
    assert rt.deviceGetLimit(devmod.LIMIT_PERSISTING_L2) > 0
    assert dev.reset_persisting_l2(dev.side), "the reset was refused"
    assert rt.deviceGetLimit(devmod.LIMIT_PERSISTING_L2) == 0


def test_evidence_names_device_toolchain_and_timing(target, report):
    from porter.gates.parity.gate import run_spec
    from porter.spec import load_spec

    lib = Path(report["library"])
    r = run_spec(target, load_spec(target, "mini_gpu_matmul_q8_0_tensor"), lib, workspace=REPO)
    assert r.ok, r.summary
    ev = r.evidence
    assert ev["toolchain"]["nvcc"] and ev["toolchain"]["gpu"]
    assert ev["device"]["peak_gbps"] and ev["device"]["peak_gbps"] > 100
    assert ev["timing"]["clock"] == "cuda-events" and ev["timing"]["median_ms"] > 0 and ev["timing"]["gbps"] > 0
    probes = [p["probe"] for c in ev["cases"] for p in c["passes"]]
    assert "clean" in probes  # the stream probe really ran (async units)
    for c in ev["cases"]:  # one pass per case is watched (a second only after an inconclusive one)
        watched = [p["probe"] for p in c["passes"] if p["probe"]]
        assert watched and (len(watched) == 1 or watched[0] == "inconclusive"), (c["id"], watched)
    json.dumps(ev, allow_nan=False)


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
def test_sanitizer_run_on_known_good(target, report):
    from porter.gates.parity.gate import run_spec
    from porter.spec import load_spec

    r = run_spec(target, load_spec(target, "mini_gpu_swiglu_tensor"), Path(report["library"]), workspace=REPO,
                 sanitize=True, timing_reps=0)
    assert r.ok, r.summary + "\n" + r.diagnostics
    assert r.evidence["sanitize"]["status"] == "done"
