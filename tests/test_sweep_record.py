"""targets/<t>/seed_sweep.json: the known-good's seed sweeps kept with the target, merged across runs (one
lease rarely sweeps a whole target), stale when a spec changes, never written from a one-set run."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from porter.calibration import sweep_record
from porter.errors import PorterError
from tests.test_seed_sweep import REPO, _report


def _target(tmp_path):
    return SimpleNamespace(dir=tmp_path, symbol_prefix="mini_gpu_")


SHAS = {"mini_gpu_swiglu_tensor": "s1", "mini_gpu_topk_tensor": "t1", "mini_gpu_add_tensor": "a1"}


def test_a_sweep_is_recorded_per_spec_with_its_worst_and_its_spec(tmp_path):
    t = _target(tmp_path)
    rep = dict(_report(), known_good="scripted", device="NVIDIA H200")
    path, written = sweep_record.write(t, rep, SHAS)
    assert written == ["mini_gpu_swiglu_tensor", "mini_gpu_topk_tensor"] and path == tmp_path / "seed_sweep.json"
    units = json.loads(path.read_text())["units"]
    sw = units["mini_gpu_swiglu_tensor"]
    assert sw["sets"] == 20 and sw["ok"] and sw["spec_sha256"] == "s1" and sw["device"] == "NVIDIA H200"
    assert sw["worst"]["ratio"] == pytest.approx(0.1) and "cases" not in sw  # the compact form
    assert not units["mini_gpu_topk_tensor"]["ok"] and units["mini_gpu_topk_tensor"]["failed"]["seed_set"] == 13
    s = sweep_record.standing(t, SHAS)
    assert set(s["current"]) == set(written) and s["refused"] == ["mini_gpu_topk_tensor"]
    assert s["unswept"] == ["mini_gpu_add_tensor"] and s["stale"] == []
    line = sweep_record.line(t, SHAS)
    assert "2 of 3 specs current" in line and "worst 3.5" in line and "(topk_tensor)" in line
    assert "1 refused" in line and "1 unswept" in line


def test_a_later_run_replaces_its_units_keeps_the_others_and_a_changed_spec_is_stale(tmp_path):
    t = _target(tmp_path)
    sweep_record.write(t, _report(), SHAS)
    again = _report()
    del again["seed_sweep"]["mini_gpu_topk_tensor"]
    again["seed_sweep"]["mini_gpu_swiglu_tensor"]["sets"] = 40
    sweep_record.write(t, again, dict(SHAS, mini_gpu_swiglu_tensor="s2"))
    units = sweep_record.read(t)["units"]
    assert units["mini_gpu_swiglu_tensor"]["sets"] == 40 and "mini_gpu_topk_tensor" in units
    # the topk spec changes after its sweep: its entry no longer counts
    s = sweep_record.standing(t, dict(SHAS, mini_gpu_swiglu_tensor="s2", mini_gpu_topk_tensor="t2"))
    assert s["stale"] == ["mini_gpu_topk_tensor"] and list(s["current"]) == ["mini_gpu_swiglu_tensor"]


def test_one_seed_set_is_no_sweep_and_writes_nothing(tmp_path):
    t = _target(tmp_path)
    one = {"seed_sweep": {"mini_gpu_swiglu_tensor": dict(_report()["seed_sweep"]["mini_gpu_swiglu_tensor"], sets=1)}}
    assert sweep_record.write(t, one, SHAS)[1] == [] and sweep_record.read(t) is None
    assert sweep_record.line(t, SHAS) == ""


def test_a_record_that_does_not_read_is_one_line(tmp_path):
    t = _target(tmp_path)
    (tmp_path / "seed_sweep.json").write_text("{broken")
    with pytest.raises(PorterError, match="not a seed-sweep record"):
        sweep_record.read(t)
    (tmp_path / "seed_sweep.json").write_text(json.dumps({"format": 99, "units": {}}))
    with pytest.raises(PorterError, match="of format 1"):
        sweep_record.read(t)


def test_porter_calibrate_write_records_the_sweep_and_shows_the_recorded_line(monkeypatch, capsys, tmp_path):
    from porter.calibration import command
    from porter.cli import main

    monkeypatch.setattr(command, "calibrate", lambda target, libs, opts, out=print: _report())
    monkeypatch.setattr(sweep_record, "record_path", lambda target: tmp_path / "seed_sweep.json")
    base = ["-C", str(REPO), "calibrate", "--target", "minimoe", "--mode", "host", "--no-ledger"]
    assert main(base + ["--write"]) == 0
    out = capsys.readouterr().out
    assert "2 spec(s) recorded" in out and "recorded seed sweep (seed_sweep.json): 1 of 24 specs current" in out
    units = json.loads((tmp_path / "seed_sweep.json").read_text())["units"]
    from porter.spec import load_specs
    from porter.target import load_target

    minimoe = load_specs(load_target(REPO, "minimoe"))
    assert units["mini_gpu_swiglu_tensor"]["spec_sha256"] == minimoe["mini_gpu_swiglu_tensor"].sha256
    assert units["mini_gpu_topk_tensor"]["spec_sha256"] is None  # no such minimoe spec: tied to nothing, never current
