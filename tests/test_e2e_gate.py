"""The e2e gate's logic on recorded outputs of minimoe's engine (CPU only).

A temporary workspace holds a copy of targets/minimoe.  The calibration runs
for real on the CPU rows of targets/minimoe/e2e/variants.toml: known-good CPU
builds (other flags, float accumulation) and broken backends (one faulted
unit each, two integration faults), all through the real engine.  Their
outputs are then the recorded outputs the rule is tested on: accepted within
tolerance, a perturbed layer rejected with its layer and token named, and the
prefill state going stale once a backend unit changes.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from porter.errors import PorterError
from porter.gates.e2e import calibration as cal_mod
from porter.gates.e2e import tree
from porter.gates.e2e.compare import PrefillOutputs, compare
from porter.gates.e2e.gate import E2EOptions, run_e2e
from porter.gates.e2e.rule import decide
from porter.gates.e2e.state import e2e_due, e2e_records_from_ledger, prefill_line, prefill_state
from porter.records.history import typed
from porter.target import load_target
from porter.target.code import load_file

ROOT = Path(__file__).resolve().parents[1]


def _git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True, text=True).stdout


def _driver(target):
    """minimoe's e2e driver, the file the gate loads (target.toml [e2e] driver)."""
    return load_file(target.dir / target.spec.e2e.driver)


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    if not shutil.which("cc") and not shutil.which("gcc"):
        pytest.skip("no C compiler")
    ws = tmp_path_factory.mktemp("ws")
    shutil.copytree(ROOT / "targets" / "minimoe", ws / "targets" / "minimoe",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (ws / "targets" / "minimoe" / "ported").mkdir()
    (ws / "targets" / "minimoe" / "ported" / "mini_gpu_add_tensor.cu").write_text("// unit v1\n")
    fixture = ws / "runs" / "fixtures" / "minimoe.gguf"
    fixture.parent.mkdir(parents=True)
    subprocess.run([sys.executable, str(ROOT / "targets" / "minimoe" / "make_fixture.py"), str(fixture)],
                   check=True, capture_output=True)
    (ws / ".gitignore").write_text("runs/\n")
    _git(ws, "init", "-q")
    _git(ws, "add", "-A")
    _git(ws, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return ws


@pytest.fixture(scope="module")
def target(ws):
    return load_target(ws, "minimoe")


@pytest.fixture(scope="module")
def calibration(target, tmp_path_factory) -> cal_mod.Calibration:
    return _driver(target).calibrate(target, tmp_path_factory.mktemp("cal"), mode="cpu", log=lambda *_: None)


@pytest.fixture(scope="module")
def recorded(target, calibration, tmp_path_factory) -> dict[str, PrefillOutputs]:
    """Reference and known-good outputs, written to disk and read back (the recorded outputs)."""
    scratch = tmp_path_factory.mktemp("rec")
    drv = _driver(target)
    eng = drv.MinimoeEngine(target, scratch, n_prompt=40, n_decode=16)
    out = {}
    for name, flags in (("reference", ["-O2"]), ("float-dot", ["-O2", "-DMINI_CPU_DOT=float"])):
        o = eng.run(eng.build(drv.Backend(name, cflags=flags)), name)
        np.savez(scratch / f"{name}.npz", states=o.states, logits=o.logits, tokens=np.array(o.tokens))
        d = np.load(scratch / f"{name}.npz")
        out[name] = PrefillOutputs(d["states"], eng.stage_names, d["logits"], [int(t) for t in d["tokens"]])
    return out


# ---- calibration on real backends -----------------------------------------------

def test_cpu_calibration_accepts_known_good_and_rejects_every_fault(calibration):
    assert calibration.calibrated, calibration.table()
    goods = [r for r in calibration.rows if r.kind == "good"]
    broken = [r for r in calibration.rows if r.kind == "broken"]
    assert len(goods) >= 2 and len(broken) >= 7
    assert all(r.verdict.ok for r in goods)
    assert not any(r.verdict.ok for r in broken)
    assert {r.variant for r in broken} >= {"integration-model-map-base", "integration-kv-row-late"}


def test_window_fault_is_localised_to_tokens_past_the_window(calibration):
    row = next(r for r in calibration.rows if r.variant == "attention-window-one-short")
    # window 32: token 31 is the first whose window holds 32 keys; earlier tokens are unaffected
    assert row.verdict.stage == "layer 0"
    assert min(row.verdict.bad_tokens) == 31, row.verdict.bad_tokens


def test_calibration_fails_when_a_broken_backend_is_accepted(calibration):
    good = next(v for v in calibration.variants if v.name == "cpu-float-dot")
    fake = cal_mod.Variant("broken-but-harmless", "broken", good.comparison, "a fault with no effect")
    cal = cal_mod.calibrate(calibration.variants + [fake], tokens_exact=True)
    assert not cal.calibrated
    assert "NOT AS EXPECTED" in cal.table()


def test_calibration_fails_when_a_known_good_is_far_outside_the_others(calibration):
    bad = next(v for v in calibration.variants if v.name == "swiglu-last-element")
    mislabelled = cal_mod.Variant("mislabelled-good", "good", bad.comparison)
    rest = [v for v in calibration.variants if v.kind == "good"] + [mislabelled] + \
           [v for v in calibration.variants if v.kind == "broken" and v is not bad]
    cal = cal_mod.calibrate(rest, tokens_exact=True)
    row = next(r for r in cal.rows if r.variant == "mislabelled-good")
    assert not row.as_expected and not cal.calibrated


def test_calibration_needs_two_known_good_backends(calibration):
    one_good = [v for v in calibration.variants if v.kind == "broken"] + [calibration.variants[0]]
    with pytest.raises(PorterError, match="at least 2 known-good"):
        cal_mod.calibrate(one_good, tokens_exact=True)


def test_stored_calibration_is_derived_again_not_trusted(calibration, tmp_path):
    path = tmp_path / "calibration.json"
    cal_mod.save(calibration, path)
    rule, _, _ = cal_mod.load_rule(path)
    assert rule == calibration.rule
    d = json.loads(path.read_text())
    d["rule"]["stage_tol"] = [1e9] * len(d["rule"]["stage_tol"])  # an edited ceiling
    for r in d["rows"]:
        r["as_expected"] = True
    path.write_text(json.dumps(d))
    assert cal_mod.load_rule(path)[0] == calibration.rule
    # an edited measurement that makes a broken backend look good breaks the calibration
    for v in d["variants"]:
        if v["name"] == "norm-weight-one-late":
            v["comparison"] = next(x for x in d["variants"] if x["name"] == "cpu-O0")["comparison"]
    path.write_text(json.dumps(d))
    with pytest.raises(PorterError, match="does not hold"):
        cal_mod.load_rule(path)


# ---- the rule on recorded outputs -------------------------------------------------

def test_recorded_known_good_is_accepted_within_tolerance(recorded, calibration):
    v = decide(compare(recorded["reference"], recorded["float-dot"]), calibration.rule)
    assert v.ok, v.reason
    assert 0 < v.worst_ratio <= 1.0  # it differs (float sums), and within the ceiling


def _perturbed(o: PrefillOutputs, stage: int, token: int, rel: float) -> PrefillOutputs:
    states = o.states.copy()
    states[stage, token] *= 1 + rel
    return PrefillOutputs(states, o.stage_names, o.logits.copy(), list(o.tokens))


def test_perturbed_layer_is_rejected_naming_layer_and_token(recorded, calibration):
    cand = _perturbed(recorded["float-dot"], stage=2, token=7, rel=1e-4)
    v = decide(compare(recorded["reference"], cand), calibration.rule)
    assert not v.ok
    assert (v.stage, v.token, v.bad_tokens) == ("layer 1", 7, [7])
    assert "layer 1 diverges first, at token 7" in v.reason


def test_first_diverging_layer_is_named_when_the_error_carries_forward(recorded, calibration):
    cand = _perturbed(_perturbed(recorded["float-dot"], 1, 3, 1e-3), 2, 3, 1e-2)
    v = decide(compare(recorded["reference"], cand), calibration.rule)
    assert (v.stage, v.token) == ("layer 0", 3)


def test_logits_and_tokens_are_checked_too(recorded, calibration):
    ref, good = recorded["reference"], recorded["float-dot"]
    lg = good.logits.copy()
    lg[0] += 1e-3 * np.abs(lg[0]).max()
    v = decide(compare(ref, PrefillOutputs(good.states, good.stage_names, lg, good.tokens)), calibration.rule)
    assert not v.ok and v.stage == "logits"
    toks = list(good.tokens)
    toks[9] = (toks[9] + 1) % 512
    v = decide(compare(ref, PrefillOutputs(good.states, good.stage_names, good.logits, toks)), calibration.rule)
    assert not v.ok and (v.stage, v.token) == ("tokens", 9)


def test_non_finite_or_missing_outputs_are_rejected(recorded, calibration):
    ref, good = recorded["reference"], recorded["float-dot"]
    st = good.states.copy()
    st[1, 0, 5] = np.nan
    v = decide(compare(ref, PrefillOutputs(st, good.stage_names, good.logits, good.tokens)), calibration.rule)
    assert (v.ok, v.stage, v.token) == (False, "layer 0", 0)
    short = PrefillOutputs(good.states[:2], good.stage_names[:2], good.logits, good.tokens)
    assert not decide(compare(ref, short), calibration.rule).ok


def test_states_start_with_the_prompt_embeddings(target, recorded):
    import gguf

    r = gguf.GGUFReader(str(target.fixture_path))
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    table = np.asarray(emb.data).reshape(512, 256).astype(np.float32)
    prompt = [(1 + 37 * i) % 512 for i in range(40)]
    np.testing.assert_array_equal(recorded["reference"].states[0], table[prompt])


# ---- the gate, its evidence and the prefill state ------------------------------

@pytest.fixture(scope="module")
def cpu_library(target, tmp_path_factory):
    """libmini_cpu.so with float sums: a known-good backend library the gate can link (no GPU here)."""
    d = tmp_path_factory.mktemp("lib")

    def build(name, flags):
        out = d / f"{name}.so"
        subprocess.run(["cc", "-O2", "-fPIC", "-shared", *flags, "-o", str(out),
                        str(target.checkout / "mini_cpu.c"), "-lm"], check=True)
        return out
    return build


def test_run_e2e_writes_evidence_bound_to_the_backend_tree(ws, target, calibration, cpu_library, tmp_path):
    cal_mod.save(calibration, target.dir / target.spec.e2e.calibration)
    _git(ws, "add", "-A")
    _git(ws, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "calibration")
    head_tree = tree.tree_hash_at(ws, tree.backend_dirs(target))

    res = run_e2e(target, ws, cpu_library("good", ["-DMINI_CPU_DOT=float"]), options=E2EOptions(scratch=tmp_path))
    assert res.ok and not res.skipped, res.summary
    ev = json.loads((ws / "ledger" / "evidence" / f"{res.metrics['evidence_sha256']}.json").read_text())
    assert ev["gate"] == "e2e" and ev["tree_hash"] == head_tree and ev["tree_matches_head"] is True
    assert prefill_state([ev], head_tree)[:2] == ("verified", _git(ws, "rev-parse", "HEAD").strip())
    assert prefill_line(prefill_state([ev], head_tree)).startswith("prefill: verified at ")

    # without a scratch of the caller's, porter's own (GBs for ds4) is gone with the gate, whatever it decided
    import tempfile

    own_tmp = tmp_path / "own-tmp"
    own_tmp.mkdir()
    before, tempfile.tempdir = tempfile.tempdir, str(own_tmp)
    try:
        again = run_e2e(target, ws, cpu_library("good", ["-DMINI_CPU_DOT=float"]), options=E2EOptions(store=False))
    finally:
        tempfile.tempdir = before
    assert again.ok and list(own_tmp.iterdir()) == []

    # a backend with half-precision sums: rejected, first at a named layer and token
    bad = run_e2e(target, ws, cpu_library("half", ["-DMINI_CPU_DOT=_Float16"]), options=E2EOptions(scratch=tmp_path))
    assert not bad.ok and not bad.skipped
    assert bad.metrics["stage"].startswith("layer ") and isinstance(bad.metrics["token"], int)
    assert prefill_state([ev, bad.evidence], head_tree)[0] == "verified"  # the passing record still names this tree

    # a unit changes and is committed: the record no longer names HEAD's backend
    (target.ported_dir / "mini_gpu_add_tensor.cu").write_text("// unit v2\n")
    assert tree.tree_hash_worktree(ws, tree.backend_dirs(target)) != head_tree
    _git(ws, "add", "-A")
    _git(ws, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "unit v2")
    new_tree = tree.tree_hash_at(ws, tree.backend_dirs(target))
    state, commit, reason = prefill_state([ev], new_tree)
    assert state == "stale" and "changed" in reason
    assert e2e_due({"u": "verified"}, ["u"], [ev], new_tree)[0]
    assert not e2e_due({"u": "verified"}, ["u"], [ev], head_tree)[0]


def test_gate_is_skipped_without_a_calibration_that_holds(target, tmp_path, cpu_library):
    spec = target.spec.model_copy(update={"e2e": target.spec.e2e.model_copy(update={"calibration": "e2e/none.json"})})
    from porter.target import Target

    t = Target(spec, target.dir, target.checkout, target.workspace)
    res = run_e2e(t, target.workspace, cpu_library("good2", []), options=E2EOptions(scratch=tmp_path, store=False))
    assert res.skipped and not res.ok and "uncalibrated" in res.summary


def test_gate_refuses_a_calibration_measured_on_other_sources(target, calibration, cpu_library, tmp_path):
    """A rule whose setup names another engine source is not applied: the backend that passes under
    the current rule is skipped, naming what changed, and nothing is recorded as verified."""
    import dataclasses

    from porter.target import Target

    other = dataclasses.replace(calibration, setup=dict(calibration.setup, engine_sha256="0" * 64))
    cal_mod.save(other, target.dir / "e2e" / "other-engine.json")
    spec = target.spec.model_copy(update={"e2e": target.spec.e2e.model_copy(
        update={"calibration": "e2e/other-engine.json"})})
    t = Target(spec, target.dir, target.checkout, target.workspace)
    res = run_e2e(t, target.workspace, cpu_library("good", ["-DMINI_CPU_DOT=float"]),
                  options=E2EOptions(scratch=tmp_path, store=False))
    assert res.skipped and not res.ok
    assert "the rule was calibrated for another engine_sha256" in res.summary


# ---- pure state functions ----------------------------------------------------------

def _rec(ok, tree_hash, commit, gate="e2e"):
    return {"gate": gate, "ok": ok, "tree_hash": tree_hash, "commit": commit}


def test_prefill_state_rules():
    assert prefill_state([], "T1")[0] == "unverified"
    assert prefill_state([_rec(False, "T1", "c1")], "T1")[0] == "unverified"
    assert prefill_state([_rec(True, "T1", "c1")], "T1")[:2] == ("verified", "c1")
    assert prefill_state([_rec(True, "T1", "c1")], "T2")[:2] == ("stale", "c1")
    assert prefill_state([_rec(True, "T1", "c1"), _rec(True, "T2", "c2")], "T2")[:2] == ("verified", "c2")
    assert prefill_state([_rec(True, "T1", "c1")], None)[0] == "unverified"
    # a record of another gate, or one claiming ok without a tree hash, never verifies
    assert prefill_state([_rec(True, "T1", "c1", gate="parity")], "T1")[0] == "unverified"
    assert prefill_state([{"gate": "e2e", "ok": True, "commit": "c1"}], "T1")[0] == "unverified"


def test_an_e2e_run_before_its_commit_never_names_the_commit_it_ran_on_top_of():
    # porter optimize judges the tree its step will make; the record's commit is the step's parent, where
    # that tree was never measured: status must not say "verified at <parent>"
    from porter.gates.e2e.state import prefill_line

    ahead = dict(_rec(True, "T2", "c1"), tree_matches_head=False)
    state = prefill_state([ahead], "T2")
    assert state[:2] == ("verified", None) and "before it was committed" in state[2] and "c1" in state[2]
    assert "verified at" not in prefill_line(state) and prefill_line(state).startswith("prefill: verified (")
    assert prefill_line(prefill_state([_rec(True, "T1", "c1")], "T1")) == "prefill: verified at c1"


def test_e2e_due_waits_for_every_prefill_unit():
    units = ["a", "b"]
    assert not e2e_due({"a": "verified", "b": "built"}, units, [], "T")[0]
    assert e2e_due({"a": "verified", "b": "verified"}, units, [], "T")[0]
    assert not e2e_due({"a": "verified", "b": "verified"}, units, [_rec(False, "T", "c")], "T")[0]
    assert e2e_due({"a": "verified", "b": "verified"}, units, [_rec(False, "T0", "c")], "T")[0]


def test_records_from_ledger_drop_tampered_evidence(tmp_path):
    from porter.records.evidence import store_evidence

    ev = {"target": "minimoe", "unit": "e2e:prefill", "gate": "e2e", "ok": True, "candidate_sha256": "x",
          "tree_hash": "T", "commit": "c"}
    sha = store_evidence(tmp_path, ev)
    raw = {"kind": "gate", "gate": "e2e", "target": "minimoe", "ok": True, "evidence": sha}
    recs = [typed(1, raw)]
    assert e2e_records_from_ledger(tmp_path, "minimoe", recs) == [ev]
    p = tmp_path / "ledger" / "evidence" / f"{sha}.json"
    p.write_text(p.read_text().replace('"T"', '"U"'))
    assert e2e_records_from_ledger(tmp_path, "minimoe", recs) == []
    # a ledger record saying ok over failing evidence does not count either
    sha2 = store_evidence(tmp_path, dict(ev, ok=False))
    assert e2e_records_from_ledger(tmp_path, "minimoe", [typed(1, dict(raw, evidence=sha2))]) == []


def test_tree_hash_sees_untracked_and_uncommitted_files(tmp_path):
    ws = tmp_path
    (ws / "a").mkdir()
    (ws / "a" / "x.cu").write_text("1")
    _git(ws, "init", "-q")
    _git(ws, "add", "-A")
    _git(ws, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "i")
    assert tree.tree_hash_worktree(ws, ["a"]) == tree.tree_hash_at(ws, ["a"])
    (ws / "a" / "y.cu").write_text("2")
    assert tree.tree_hash_worktree(ws, ["a"]) != tree.tree_hash_at(ws, ["a"])
    (ws / "a" / "y.cu").unlink()
    (ws / "a" / "x.cu").write_text("changed")
    assert tree.tree_hash_worktree(ws, ["a"]) != tree.tree_hash_at(ws, ["a"])


# ---- the wiring the lead calls ---------------------------------------------------------

def test_wiring_runs_e2e_once_per_backend_tree_and_status_follows(tmp_path):
    from porter.records.evidence import store_evidence
    from porter.gates.e2e.state import prefill_status, run_e2e_if_due
    from porter.gates.result import GateResult
    from porter.target import Target

    ws = tmp_path
    shutil.copytree(ROOT / "targets" / "minimoe", ws / "targets" / "minimoe", ignore=shutil.ignore_patterns("__pycache__"))
    (ws / "targets" / "minimoe" / "ported").mkdir()
    unit = ws / "targets" / "minimoe" / "ported" / "mini_gpu_add_tensor.cu"
    unit.write_text("// v1\n")
    _git(ws, "init", "-q")
    _git(ws, "add", "-A")
    _git(ws, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1")
    t = load_target(ws, "minimoe")
    ledger: list = []  # porter.records.history's typed records
    calls = []

    def fake_run():
        calls.append(False)
        target = t
        head = _git(ws, "rev-parse", "HEAD").strip()
        ev = {"target": "minimoe", "unit": "e2e:prefill", "gate": "e2e", "ok": True, "candidate_sha256": "x",
              "tree_hash": tree.tree_hash_worktree(ws, tree.backend_dirs(target)), "commit": head}
        return GateResult("e2e", True, "e2e ok", evidence=ev)

    def record(res):
        sha = store_evidence(ws, res.evidence)
        ledger.append(typed(len(ledger) + 1, {"kind": "gate", "gate": "e2e", "target": "minimoe", "ok": res.ok,
                                              "evidence": sha}))

    states = {"a": "verified", "b": "verified"}
    assert prefill_status(ws, t, ledger)[0] == "unverified"
    assert run_e2e_if_due(t, ws, {"a": "verified", "b": "failing"}, ["a", "b"], ledger,
                          record=record, run=fake_run) is None
    assert run_e2e_if_due(t, ws, states, ["a", "b"], ledger, record=record, run=fake_run).ok
    assert calls == [False] and prefill_status(ws, t, ledger)[0] == "verified"
    # nothing changed: not due again
    assert run_e2e_if_due(t, ws, states, ["a", "b"], ledger, record=record, run=fake_run) is None
    # a unit changes and is committed: stale until e2e runs again, then verified at the new commit
    unit.write_text("// v2\n")
    _git(ws, "add", "-A")
    _git(ws, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v2")
    assert prefill_status(ws, t, ledger)[0] == "stale"
    assert run_e2e_if_due(t, ws, states, ["a", "b"], ledger, record=record, run=fake_run).ok
    state, commit, _ = prefill_status(ws, t, ledger)
    assert (state, commit) == ("verified", _git(ws, "rev-parse", "HEAD").strip())
    # a ledger record whose evidence was edited no longer counts
    ev_path = ws / "ledger" / "evidence" / f"{ledger[-1].evidence}.json"
    ev_path.write_text(ev_path.read_text().replace('"ok":true', '"ok":true '))
    assert prefill_status(ws, t, ledger)[0] == "stale"


def test_a_mutant_the_prefill_never_reaches_is_reported_not_counted(calibration):
    good = next(v for v in calibration.variants if v.name == "cpu-float-dot")
    unreached = cal_mod.Variant("decode-only-mutant", "broken", good.comparison, "mutates a decode-only kernel",
                                unreached=True)
    cal = cal_mod.calibrate(calibration.variants + [unreached], tokens_exact=True)
    row = next(r for r in cal.rows if r.variant == "decode-only-mutant")
    assert cal.calibrated and row.unreached and "unreached" in cal.table()
    assert cal.reached_broken == calibration.reached_broken
    # a calibration whose every broken backend went unreached proves nothing
    only = [v for v in calibration.variants if v.kind == "good"] + [unreached]
    assert not cal_mod.calibrate(only, tokens_exact=True).calibrated


def test_a_race_that_passes_some_runs_is_judged_by_its_worst_run():
    """Several prefills of one backend: one clean run and one with a bad layer is the bad one."""
    from porter.gates.e2e.compare import Comparison, worst

    clean = Comparison(["l0", "l1"], np.array([[1e-9, 1e-9], [1e-9, 1e-9]]), 1e-9, [1, 2], [1, 2])
    raced = Comparison(["l0", "l1"], np.array([[1e-9, 1e-9], [1e-9, 0.3]]), 1e-2, [1, 2], [1, 5])
    w = worst([clean, raced, clean])
    assert w.stage_nmse[1, 1] == 0.3 and w.logits_nmse == 1e-2 and w.first_token_mismatch == 1
    assert worst([clean]) is clean


def _probed(rng, base, head, drift, head_scale=1.0):
    """One backend's outputs: stages near `base`, the head probe `head` scaled by head_scale."""
    states = base * (1 + drift * rng.standard_normal(base.shape)).astype(np.float32)
    probe = head * head_scale * (1 + drift * rng.standard_normal(head.shape)).astype(np.float32)
    return PrefillOutputs(states, ["l0", "l1", "l2"], base[-1, -1:, :8], [0], probes={"head": probe})


def test_a_fault_only_the_head_probe_sees_is_rejected_there():
    """ds4's output head: four streams collapsed to one row, then RMS-normalised.  A head that
    drops a stream changes that row by a scale the norm removes, so every stage and the logits
    stay within their ceilings; the head probe is where it must be rejected (by name)."""
    rng = np.random.default_rng(1)
    base = rng.standard_normal((3, 6, 64)).astype(np.float32)
    head = rng.standard_normal(64).astype(np.float32)
    ref = PrefillOutputs(base, ["l0", "l1", "l2"], base[-1, -1:, :8], [0], probes={"head": head})
    goods = [cal_mod.Variant(f"good{i}", "good", compare(ref, _probed(rng, base, head, 1e-3))) for i in range(3)]
    dropped = cal_mod.Variant("head-drops-a-stream", "broken", compare(ref, _probed(rng, base, head, 1e-3, 0.75)))
    cal = cal_mod.calibrate(goods + [dropped], tokens_exact=False)
    assert cal.calibrated, cal.table()
    assert cal.rule.probe_names == ("head",)
    row = next(r for r in cal.rows if r.variant == "head-drops-a-stream")
    assert row.verdict.stage == "head" and "head diverges" in row.verdict.reason
    assert decide(dropped.comparison, cal.rule).worst_ratio > 1
    # without the probe the same fault passes: the stages and logits alone cannot see it
    blind = [cal_mod.Variant(v.name, v.kind, cal_mod.Comparison(v.comparison.stage_names, v.comparison.stage_nmse,
                                                                v.comparison.logits_nmse, [0], [0]))
             for v in goods + [dropped]]
    assert not cal_mod.calibrate(blind, tokens_exact=False).calibrated
    # a candidate that does not expose the probe at all is not accepted
    missing = compare(ref, PrefillOutputs(ref.states, ref.stage_names, ref.logits, [0]))
    assert missing.probe_nmse == {"head": float("inf")} and not decide(missing, cal.rule).ok


def test_probes_survive_the_calibration_file(tmp_path):
    rng = np.random.default_rng(2)
    base = rng.standard_normal((3, 4, 32)).astype(np.float32)
    head = rng.standard_normal(32).astype(np.float32)
    ref = PrefillOutputs(base, ["l0", "l1", "l2"], base[-1, -1:, :8], [0], probes={"head": head})
    variants = [cal_mod.Variant(f"good{i}", "good", compare(ref, _probed(rng, base, head, 1e-3))) for i in range(2)]
    variants.append(cal_mod.Variant("bad", "broken", compare(ref, _probed(rng, base, head, 1e-3, 0.5))))
    cal = cal_mod.calibrate(variants, tokens_exact=False)
    cal_mod.save(cal, tmp_path / "c.json")
    again, _ = cal_mod.load(tmp_path / "c.json")
    assert again.rule == cal.rule and again.calibrated and again.rule.probe_tol == cal.rule.probe_tol


def test_a_known_good_that_failed_to_run_is_a_row_not_a_crash():
    """A known-good backend whose run failed breaks the calibration and says so in the table;
    the rule comes from the ones that ran."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((3, 4, 32)).astype(np.float32)
    head = rng.standard_normal(32).astype(np.float32)
    ref = PrefillOutputs(base, ["l0", "l1", "l2"], base[-1, -1:, :8], [0], probes={"head": head})
    variants = [cal_mod.Variant(f"good{i}", "good", compare(ref, _probed(rng, base, head, 1e-3))) for i in range(2)]
    failed = cal_mod.Comparison(ref.stage_names, np.full((3, 4), np.inf), float("inf"), [0], [],
                                problem="run failed: ds4 exited 1")
    variants += [cal_mod.Variant("good-that-crashed", "good", failed),
                 cal_mod.Variant("bad", "broken", compare(ref, _probed(rng, base, head, 1e-3, 0.5)))]
    cal = cal_mod.calibrate(variants, tokens_exact=False)
    row = next(r for r in cal.rows if r.variant == "good-that-crashed")
    assert not cal.calibrated and not row.as_expected and "run failed" in row.verdict.reason
    assert "NOT AS EXPECTED" in cal.table()
    with pytest.raises(PorterError, match="at least 2"):
        cal_mod.calibrate(variants[1:], tokens_exact=False)
