"""A spec's identity (the sha256 calibration records and perf baselines are keyed on) covers the
spec file, the helpers it loads with sibling() (transitively), the reference modules it calls
(transitively), the target's harness settings and the harness's verdict code: editing any of
them leaves the spec uncalibrated and its perf baseline unused.  Each test edits one such file in
a temporary copy of the repository."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from porter.spec import identity
from porter.spec import SpecError, load_spec
from porter.records.history import History
from porter.records.ledger import Ledger
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
UNIT = "mini_gpu_matmul_q8_0_tensor"  # loads the helper _shared.py, which imports reference.quant


@pytest.fixture
def ws(tmp_path):
    """A workspace holding a copy of minimoe's target folder."""
    shutil.copytree(REPO / "targets" / "minimoe", tmp_path / "targets" / "minimoe",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _spec(ws):
    return load_spec(load_target(ws, "minimoe"), UNIT)


def _calibrated(ws, spec) -> bool:
    return History.read(ws, "minimoe").calibration_status(spec.unit, spec.sha256)["calibrated"]


def _record_calibration(ws, spec) -> None:
    from porter.records.evidence import store_evidence

    ev = store_evidence(ws, {"target": "minimoe", "unit": spec.unit, "gate": "parity", "ok": True,
                             "candidate_sha256": None, "toolchain": {},
                             "timing": {"case": "c", "median_ms": 0.5}})
    Ledger(ws).append("calibration", target="minimoe", unit=spec.unit, ok=True, spec_sha256=spec.sha256,
                      known_good="scripted", mutants=1, mutants_rejected=1, evidence=ev, summary="")


def test_identity_names_the_spec_its_helpers_references_and_harness(ws):
    parts = _spec(ws).identity_components
    assert {"spec:mini_gpu_matmul_q8_0_tensor.py", "helper:_shared.py", "reference:reference.minimoe_ops",
            "reference:reference.quant", "harness:harness.toml", "harness:porter.gates.parity.compare",
            "harness:porter.spec.weights"} <= set(parts)
    # the same files elsewhere have the same identity: labels hold names, never where the workspace lies
    assert _spec(ws).sha256 == load_spec(load_target(REPO, "minimoe"), UNIT).sha256


def test_editing_a_helper_uncalibrates_the_spec_and_drops_its_perf_baseline(ws):
    from porter.gates import perf

    spec = _spec(ws)
    _record_calibration(ws, spec)
    assert _calibrated(ws, spec)
    assert perf.baseline(History.read(ws, "minimoe"), UNIT, spec.sha256)[0] is not None
    helper = ws / "targets" / "minimoe" / "parity" / "_shared.py"
    helper.write_text(helper.read_text() + "\n# a change to how inputs are made\n")
    edited = _spec(ws)
    assert edited.sha256 != spec.sha256
    assert not _calibrated(ws, edited)
    assert perf.baseline(History.read(ws, "minimoe"), UNIT, edited.sha256)[0] is None


def test_a_helper_loaded_by_a_helper_is_part_of_the_identity(ws):
    d = ws / "targets" / "minimoe" / "parity"
    (d / "_inner.py").write_text("SCALE = 1.0\n")
    shared = d / "_shared.py"
    shared.write_text("from porter.spec import sibling as _sib\n_inner = _sib(__file__, '_inner')\n"
                      + shared.read_text())
    before = _spec(ws)
    assert "helper:_inner.py" in before.identity_components
    (d / "_inner.py").write_text("SCALE = 2.0\n")
    assert _spec(ws).sha256 != before.sha256


def test_editing_a_reference_function_uncalibrates_the_spec(ws, monkeypatch):
    """The reference package is imported from the copy (put first on sys.path), as the gate would."""
    shutil.copytree(REPO / "reference", ws / "reference", ignore=shutil.ignore_patterns("__pycache__"))
    for name in [n for n in sys.modules if n == "reference" or n.startswith("reference.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(ws))
    spec = _spec(ws)
    assert Path(sys.modules["reference.minimoe_ops"].__file__).resolve().is_relative_to(ws.resolve())
    _record_calibration(ws, spec)
    assert _calibrated(ws, spec)
    ops = ws / "reference" / "minimoe_ops.py"
    ops.write_text(ops.read_text().replace("def matmul_q8_0(", "def matmul_q8_0(  # edited\n", 1))
    edited = _spec(ws)
    assert edited.sha256 != spec.sha256 and not _calibrated(ws, edited)
    # a module the reference imports (quant, through `from . import quant`) counts too
    before = edited.sha256
    q = ws / "reference" / "quant.py"
    q.write_text(q.read_text() + "\n# edited\n")
    assert _spec(ws).sha256 != before


def test_editing_the_harness_settings_uncalibrates_the_spec(ws):
    spec = _spec(ws)
    h = ws / "targets" / "minimoe" / "parity" / "harness.toml"
    h.write_text(h.read_text() + "\n# edited\n")
    assert _spec(ws).sha256 != spec.sha256


def test_the_verdict_code_is_part_of_the_identity(ws, monkeypatch, tmp_path):
    """compare.py (metrics, tolerances) changing moves every spec's identity."""
    spec = _spec(ws)
    fake = tmp_path / "compare_edited.py"
    fake.write_text("# another compare\n")
    real = identity._module_file
    monkeypatch.setattr(identity, "_module_file",
                        lambda name: fake if name == "porter.gates.parity.compare" else real(name))
    assert _spec(ws).sha256 != spec.sha256


def test_a_sibling_name_that_is_not_a_literal_is_refused(ws):
    p = ws / "targets" / "minimoe" / "parity" / f"{UNIT}.py"
    p.write_text(p.read_text().replace('sibling(__file__, "_shared")', 'sibling(__file__, "_sha" + "red")'))
    with pytest.raises(SpecError, match="string literal"):
        _spec(ws)


def test_the_report_reads_the_same_identity_without_loading_the_spec(ws):
    """porter report runs no workspace code: it computes the identity from the files alone, and agrees
    with the loaded spec's (calibrated), and with the edit (uncalibrated after a helper changes)."""
    from porter.report.collect import _calibration

    spec = _spec(ws)
    _record_calibration(ws, spec)
    target = load_target(ws, "minimoe")
    got, notes = _calibration(target, History.read(ws, "minimoe"))
    assert notes == [] and got[UNIT]["calibrated"] and got[UNIT]["spec_sha256"] == spec.sha256
    helper = ws / "targets" / "minimoe" / "parity" / "_shared.py"
    helper.write_text(helper.read_text() + "\n# edited\n")
    got, _ = _calibration(load_target(ws, "minimoe"), History.read(ws, "minimoe"))
    assert not got[UNIT]["calibrated"] and "changed" in got[UNIT]["reason"]


def test_a_reference_that_is_not_a_literal_is_refused(ws):
    p = ws / "targets" / "minimoe" / "parity" / f"{UNIT}.py"
    text = p.read_text()
    assert 'reference="reference.minimoe_ops.matmul_q8_0"' in text
    p.write_text(text.replace('reference="reference.minimoe_ops.matmul_q8_0"',
                              'reference="reference.minimoe_ops." + "matmul_q8_0"'))
    with pytest.raises(SpecError, match="string literal"):
        _spec(ws)
