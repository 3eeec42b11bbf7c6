"""Typed evidence (porter.gates.evidence): one model per gate's record, versioned, open to keys it does not
declare, strict about the ones it does; old records (no version, extra keys) read the same, and a
malformed one is a one-line error where a command reads it."""

from __future__ import annotations

import json

import pytest

from porter.gates import evidence as E
from porter.gates import perf, registry
from porter.records.evidence import check_evidence, store_evidence

SHA = "cd" * 32


def common(gate: str, **more) -> dict:
    return {"target": "minimoe", "unit": "mini_gpu_add_tensor", "gate": gate, "ok": True, "candidate_sha256": SHA,
            "toolchain": {"nvcc": "12.4", "gpu": "NVIDIA H200", "arch": "sm_90", "host": "h1"}, **more}


TIMING = {"case": "decode 1x4096", "median_ms": 0.012, "roofline_ms": 0.004, "times_ms": [0.011, 0.012, 0.013],
          "bytes": 65536, "gbps": 5.4}
# one record of each gate as porter wrote them before evidence was typed: no `schema`, and keys no model
# declares (each must survive a read and a re-dump unchanged)
OLD = {
    "static": common("static", summary="static checks passed", runtime_unit=False, parser_note="x"),
    "build": common("build", stage="done", object_sha256="ab" * 32, object_cached=False, compile_seconds=1.5,
                    link_seconds=0.4, library="/tmp/libminimoe.so", host_link={"kind": "pch"},
                    linked={"mini_gpu_add_tensor": {"sha256": "ef" * 32, "role": "candidate", "placeholder": False}},
                    nvcc_flags=["-O3"], glue={"glue.cu": "12" * 32}),
    "parity": common("parity", mode="cuda", sandbox="bubblewrap 0.9.0", device={"name": "NVIDIA H200", "peak_gbps": 4800},
                     library={"path": "/tmp/lib.so", "sha256": "34" * 32, "arch": ["sm_90"]},
                     regime={"name": "device", "model_hook": None, "fresh_process": False},
                     spec={"file": "targets/minimoe/parity/add.py", "sha256": "56" * 32},
                     seeds=["00000000000000ff", "0000000000000100"], cases=[{"label": "decode", "timing": TIMING}],
                     timing=TIMING, timed_cases=[TIMING], checks={"run": ["value"], "failed": []}, failures=[],
                     a_key_from_the_future={"nested": [1, 2.5]}),
    "perf": common("perf", regime="device", max_slowdown=None, decided_by="known-good", candidate=dict(TIMING, median_ms=0.018),
                   baseline=dict(TIMING, calibration_record="78" * 32, known_good="upstream", regime="device",
                                 gpu="NVIDIA H200", arch="sm_90", perf_limit={"limit": 1.5, "spread": 0.1, "basis": "b"},
                                 cases={"decode 1x4096": TIMING}),
                   ratio=1.5, limit=2.0, limit_basis="known-good spread", pct_of_roofline=22.2,
                   cases=[{"case": "decode 1x4096", "ok": True, "skipped": False, "decided_by": "known-good",
                           "ratio": 1.5, "of_limit": 0.75, "limit": 2.0, "median_ms": 0.018, "baseline_ms": 0.012,
                           "floor_ms": None}],
                   worst_case="decode 1x4096", geomean_ratio=1.5, cases_judged=1),
    "speedup": common("speedup", alpha=0.05, min_gain=0.03, rounds=6, reps=30, committed_sha256="9a" * 32,
                      order=["old", "new"], medians_ms={"old": [1.0, 1.1], "new": [0.5, 0.6]},
                      decision={"old_median_ms": 1.05, "new_median_ms": 0.55, "p_value": 0.001, "wins": True,
                                "verdict": "faster", "gain": 0.47},
                      roofline_fraction={"old": 0.1, "new": 0.2}, case="decode 1x4096"),
    "e2e": common("e2e", unit="e2e:prefill", library={"path": "/tmp/lib.so", "sha256": SHA}, tree_hash="bc" * 20,
                  commit="de" * 20, tree_matches_head=True, backend_dirs=["cuda"], driver="driver.py", setup={},
                  calibration={"file": "e2e.json", "sha256": "f0" * 32},
                  verdict={"ok": True, "reason": "within", "stage": None, "token": None, "worst_ratio": "inf",
                           "bad_tokens": None},
                  comparison=None, wall_s={}, error=None, with_candidate={"unit": "mini_gpu_add_tensor",
                                                                         "candidate_sha256": SHA}),
    "throughput": common("throughput", unit="e2e:prefill", tree_hash="bc" * 20, commit="de" * 20,
                         tree_matches_head=True, library={"path": "/tmp/lib.so"}, prefill_tokens=2048,
                         decode_tokens=128, rounds=3, setup={"engine": "ds4-bench"}, wall_s=60.5, summary="fast",
                         samples=[{"backend": "upstream", "wall_s": 9.5, "prefill_tokens": 2048, "prefill_s": 1.1,
                                   "decode_tokens": 128, "decode_s": 2.2}],
                         verdict={"ok": True, "reason": "fast", "consistency": {}, "skipped": False,
                                  "phases": [{"phase": "prefill", "ok": True, "upstream_tps": 1800.0,
                                              "candidate_tps": 1790.5, "ratio": 0.99, "margin": 0.02,
                                              "p_value": 0.4, "reason": "fast"}]}),
}
MODEL = {"static": E.StaticEvidence, "build": E.BuildEvidence, "parity": E.ParityEvidence, "perf": E.PerfEvidence,
         "speedup": E.SpeedupEvidence, "e2e": E.E2EEvidence,
         "throughput": E.ThroughputEvidence}


def test_every_registered_gate_that_writes_evidence_has_its_model():
    assert set(OLD) == set(registry.names()) - {"extract"}  # a new gate: add its old-shaped record above
    for gate, model in MODEL.items():
        assert E.model_for(gate) is model, gate
    assert E.model_for("extract") is E.Evidence and E.model_for("a gate of long ago") is E.Evidence


@pytest.mark.parametrize("gate", sorted(OLD))
def test_an_old_record_reads_as_version_0_with_every_key_kept(gate):
    old = OLD[gate]
    ev = E.evidence_of(old)
    assert type(ev) is MODEL[gate] and ev.version == 0 and ev.gate == gate and ev.ok is True
    assert ev.candidate_sha256 == SHA and ev.toolchain.arch == "sm_90" and ev.arch == "sm_90"
    assert ev.dump() == old  # nothing added (no version stamped on a read), nothing dropped, nothing coerced
    assert json.dumps(ev.dump(), sort_keys=True) == json.dumps(old, sort_keys=True)


@pytest.mark.parametrize("gate", sorted(OLD))
def test_a_written_record_round_trips(gate, tmp_path):
    rec = MODEL[gate].record(OLD[gate])
    assert rec == {**OLD[gate], "schema": E.SCHEMA}  # the writer's keys, and the version
    sha = store_evidence(tmp_path, rec)
    back, problem = check_evidence(tmp_path, sha)
    assert problem is None
    ev = E.evidence_of(back)
    assert type(ev) is MODEL[gate] and ev.version == E.SCHEMA and ev.dump() == rec
    assert MODEL[gate].record(ev.dump()) == rec  # writing what was read changes nothing


def test_typed_fields_read_what_the_dict_keys_held():
    p = E.evidence_of(OLD["parity"])
    assert p.timing.median_ms == OLD["parity"]["timing"]["median_ms"] and p.timing.get("gbps") == 5.4
    assert p.regime_name == "device" and p.gpu == "NVIDIA H200" and p.spec.sha256 == "56" * 32
    assert list(p.timed()) == ["decode 1x4096"] and p.get("a_key_from_the_future") == {"nested": [1, 2.5]}
    f = E.evidence_of(OLD["perf"])
    assert (f.ratio, f.limit, f.decided_by, f.worst_case, f.geomean_ratio) == (1.5, 2.0, "known-good", "decode 1x4096", 1.5)
    assert f.baseline.median_ms == 0.012 and f.baseline.perf_limit.limit == 1.5
    assert f.baseline.cases["decode 1x4096"].median_ms == 0.012
    assert f.cases[0].baseline_ms == 0.012 and f.cases[0].get("of_limit") == 0.75
    b = E.evidence_of(OLD["build"])
    assert b.linked["mini_gpu_add_tensor"].role == "candidate" and b.linked["mini_gpu_add_tensor"].placeholder is False
    assert b.library == "/tmp/libminimoe.so"
    assert b.object_sha256 == "ab" * 32
    e = E.evidence_of(OLD["e2e"])
    assert e.verdict.ok is True and e.verdict.get("worst_ratio") == "inf" and e.tree_matches_head is True
    assert e.with_candidate.candidate_sha256 == SHA
    s = E.evidence_of(OLD["speedup"])
    assert s.decision.new_median_ms == 0.55 and s.decision.get("gain") == 0.47


def test_a_regime_recorded_as_a_bare_word_still_reads():
    p = E.evidence_of(dict(OLD["parity"], regime="host"))
    assert p.regime_name == "host"


def test_numbers_keep_their_type_and_nothing_is_coerced():
    p = E.evidence_of(dict(OLD["parity"], timing=dict(TIMING, median_ms=3)))
    assert p.timing.median_ms == 3 and type(p.timing.median_ms) is int
    for bad, where in ((dict(OLD["parity"], ok="yes"), "ok"), (dict(OLD["perf"], ratio="1.5"), "ratio"),
                       (dict(OLD["parity"], timing="fast"), "timing"),
                       (dict(OLD["perf"], cases=[{"case": 3}]), "cases.0.case"),
                       (dict(OLD["e2e"], verdict={"ok": 1}), "verdict.ok")):
        with pytest.raises(E.EvidenceError) as err:
            E.evidence_of(bad)
        msg = str(err.value)
        assert "\n" not in msg and f": {where}: " in msg and msg.startswith("malformed"), msg
        assert err.value.exit_code == 3


def test_a_record_that_is_not_an_object_is_refused():
    for bad in ([1, 2], "parity", 3):
        with pytest.raises(E.EvidenceError):
            E.evidence_of(bad)
    assert E.problem(OLD["perf"]) is None and "ratio" in E.problem(dict(OLD["perf"], ratio=[1]))


def test_speed_reads_the_same_values_the_dict_keys_held():
    """status's and report's speed column (perf.speed), computed from typed records, equals the figures the
    records hold under their keys."""
    s = perf.speed([OLD["parity"], OLD["perf"]])
    assert s["time_ms"] == OLD["perf"]["candidate"]["median_ms"] and s["case"] == OLD["perf"]["candidate"]["case"]
    assert s["x_known_good"] == OLD["perf"]["ratio"] and s["limit"] == OLD["perf"]["limit"]
    assert s["known_good_ms"] == OLD["perf"]["baseline"]["median_ms"] and s["regime"] == "device"
    assert s["geomean_x_known_good"] == OLD["perf"]["geomean_ratio"] and s["cases_judged"] == 1
    assert s["pct_roofline"] == pytest.approx(100 * 0.004 / 0.018)
    assert perf.speed([OLD["parity"]])["time_ms"] == TIMING["median_ms"]
    with pytest.raises(E.EvidenceError):
        perf.speed([dict(OLD["perf"], ratio="fast")])


def test_cases_of_reads_through_the_model():
    assert perf.cases_of(OLD["parity"]) == {TIMING["case"]: TIMING}
    assert perf.cases_of(E.evidence_of(OLD["parity"])) == {TIMING["case"]: TIMING}


# ---- where commands read evidence: status, report, perf's baseline -----------------------------------

def test_status_speed_read_through_the_models_is_what_the_records_hold(tmp_path):
    from porter.commands.status import derive
    from ws_builder import TARGET, make_workspace

    ws = make_workspace(tmp_path / "ws")
    timing = {"case": "rows 4096", "median_ms": 0.02, "roofline_ms": 0.005, "regime": "device"}
    perf_facts = {"decided_by": "known-good", "ratio": 1.25, "limit": 2.0, "cases_judged": 2, "geomean_ratio": 1.1,
                  "baseline": {"case": "rows 4096", "median_ms": 0.016}}  # the time: parity's timed case
    ws.port("mini_gpu_swiglu_tensor", timing=timing, perf_facts=perf_facts)
    u = derive(ws.root, TARGET).unit("mini_gpu_swiglu_tensor")
    assert u.state == "verified", u.reason
    assert (u.speed["time_ms"], u.speed["x_known_good"], u.speed["limit"], u.speed["known_good_ms"]) == (0.02, 1.25, 2.0, 0.016)
    assert (u.speed["case"], u.speed["regime"], u.speed["cases_judged"], u.speed["geomean_x_known_good"]) == \
        ("rows 4096", "device", 2, 1.1)
    assert u.speed["pct_roofline"] == pytest.approx(25.0)


def test_a_malformed_record_is_one_line_where_status_and_report_read_it(tmp_path, capsys):
    """Intact (it hashes to its name, the signed step names it) but not what porter writes: status says so in
    one line (the unit is tampered), the report shows it beside the evidence, the command does not crash."""
    from porter import cli
    from porter.commands.status import derive
    from porter.report.collect import _evidence
    from ws_builder import TARGET, make_workspace

    ws = make_workspace(tmp_path / "ws")
    step, _ = ws.port("mini_gpu_swiglu_tensor", perf_facts={"decided_by": "known-good", "ratio": "1.2x"})
    u = derive(ws.root, TARGET).unit("mini_gpu_swiglu_tensor")
    assert u.state == "tampered" and "not what porter writes" in u.reason and "ratio" in u.reason, u.reason
    assert "\n" not in u.reason
    bad = [e for e in _evidence(ws.root, step["evidence"]) if e["problem"]]
    assert len(bad) == 1 and "malformed perf evidence" in bad[0]["problem"] and bad[0]["data"]["ratio"] == "1.2x"
    capsys.readouterr()
    assert cli.main(["-C", str(ws.root), "status"]) == 3
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and "not what porter writes" in out.out + out.err


def test_a_malformed_calibration_record_is_one_line_where_perf_reads_its_baseline(tmp_path):
    from porter.records.history import History
    from porter.records.ledger import Ledger

    ws = tmp_path
    ev = store_evidence(ws, {"target": "minimoe", "unit": "u", "gate": "parity", "ok": True, "candidate_sha256": None,
                             "toolchain": {}, "timing": {"case": "c", "median_ms": "fast"}})
    Ledger(ws).append("calibration", target="minimoe", unit="u", ok=True, spec_sha256=SHA, known_good="k",
                      evidence=ev, summary="")
    with pytest.raises(E.EvidenceError) as err:
        perf.baseline(History.read(ws, "minimoe"), "u", SHA)
    assert "\n" not in str(err.value) and "timing.median_ms" in str(err.value)


def test_a_writer_s_numpy_figures_are_written_as_the_numbers_they_hold():
    """A GPU run's figures come through numpy: the strict model refused a numpy bool and kept a numpy int,
    which no CPU test reached; record() writes them as Python values."""
    import numpy as np

    from porter.gates.evidence import ParityEvidence

    rec = ParityEvidence.record({"target": "t", "unit": "u", "gate": "parity", "ok": np.bool_(True),
                                 "timing": {"case": "c", "median_ms": np.float32(0.25), "bytes": np.int64(7),
                                            "times_ms": [np.float64(0.25), np.float32(0.5)]}})
    t = rec["timing"]
    assert type(t["median_ms"]) is float and t["median_ms"] == 0.25 and type(t["bytes"]) is int
    assert [type(x) for x in t["times_ms"]] == [float, float] and rec["ok"] is True
