"""`porter optimize`'s e2e: the backend with a new unit no worse than the committed backend by more than
the committed backend's run-to-run spread, where the rule does not pin greedy tokens (CPU only).

The committed backend's figures come from its passing e2e record at HEAD (porter.gates.e2e.unchanged).
Here the engine is a stand-in driver whose prefills are the reference plus noise of a chosen size, so
the NMSE per stage is known; the gate, the rule, the evidence and the baseline are the real ones.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from porter.gates.e2e import calibration as cal_mod
from porter.gates.e2e import gate as e2e_gate
from porter.gates.e2e import tree
from porter.gates.e2e.compare import PrefillOutputs
from porter.gates.e2e.rule import Rule
from porter.gates.e2e.unchanged import Baseline, committed_baseline, no_worse
from porter.target import load_target

STAGES = ["layer 0", "layer 1", "layer 2"]
SETUP = {"prompt_tokens": 64, "layers": 3, "device": "whichever GPU ran it"}
CAL_SHA = "c" * 64


def figures(*stages: float, logits: float = 1e-4) -> dict:
    return {"stages": dict(zip(STAGES, stages)), "probes": {}, "logits": logits}


# -- the rule on figures ------------------------------------------------------------------------------

def test_a_candidate_worse_by_more_than_the_committed_spread_is_refused_and_within_it_passes():
    base = Baseline.of([figures(1.00e-3, 2.0e-3, 3.0e-3), figures(1.02e-3, 2.1e-3, 3.2e-3),
                        figures(1.01e-3, 2.05e-3, 3.1e-3)], "abc123")
    assert base.worst["layer 2"] == 3.2e-3 and base.spread["layer 2"] == pytest.approx(0.2e-3)
    ok, line, where = no_worse([figures(1.01e-3, 2.08e-3, 3.35e-3)], base)  # 3.35 <= 3.2 + 0.2
    assert ok and where is None and "no worse than the committed backend" in line
    ok, line, where = no_worse([figures(1.01e-3, 2.08e-3, 3.45e-3)], base)  # 3.45 > 3.4
    assert not ok and where == "layer 2" and "worse than the committed backend's" in line and "3 run(s)" in line
    # the first quantity over, in forward order, is named; the logits count as one
    ok, _, where = no_worse([figures(1.2e-3, 2.08e-3, 9e-3)], base)
    assert not ok and where == "layer 0"
    ok, _, where = no_worse([figures(1.01e-3, 2.0e-3, 3.0e-3, logits=5e-4)], base)
    assert not ok and where == "logits"


def test_the_candidates_worst_run_is_what_is_judged():
    base = Baseline.of([figures(1e-3, 2e-3, 3e-3), figures(1e-3, 2e-3, 3.1e-3)])
    ok, _, where = no_worse([figures(1e-3, 2e-3, 3e-3), figures(1e-3, 2e-3, 3.5e-3)], base)
    assert not ok and where == "layer 2"


def test_one_committed_run_measures_no_spread_so_allows_nothing_and_says_so():
    base = Baseline.of([figures(1e-3, 2e-3, 3e-3)], "abc123")
    assert base.spread == {q: 0.0 for q in base.worst}
    ok, line, _ = no_worse([figures(1e-3, 2e-3, 3.0001e-3)], base)
    assert not ok and "no spread measured, so no allowance" in line
    assert no_worse([figures(1e-3, 2e-3, 3e-3)], base)[0]


def _record(tree_hash: str, ok: bool = True, runs=None, commit: str = "c0ffee", **over) -> dict:
    rec = {"gate": "e2e", "ok": ok, "tree_hash": tree_hash, "commit": commit, "setup": dict(SETUP),
           "calibration": {"file": "e2e/calibration.json", "sha256": CAL_SHA},
           "run_figures": runs or [figures(1e-3, 2e-3, 3e-3), figures(1e-3, 2e-3, 3.1e-3)]}
    rec.update(over)
    return rec


def test_the_baseline_is_the_newest_passing_record_on_heads_tree_of_this_setup():
    older = _record("T", runs=[figures(9e-3, 9e-3, 9e-3)], commit="old")
    newer = _record("T", commit="new")
    other_tree = _record("U", runs=[figures(1e-9, 1e-9, 1e-9)])
    failed = _record("T", ok=False, runs=[figures(1e-9, 1e-9, 1e-9)])
    base, why = committed_baseline([older, newer, other_tree, failed], "T", dict(SETUP, device="another"), CAL_SHA)
    assert why == "" and base.commit == "new" and base.runs == 2
    assert committed_baseline([other_tree], "T", SETUP, CAL_SHA) == (None, "the committed backend has no passing "
                                                                           "e2e record at HEAD")
    assert committed_baseline([newer], "T", SETUP, "d" * 64)[1].endswith("another calibration")
    assert committed_baseline([newer], "T", dict(SETUP, layers=5), CAL_SHA)[1].endswith("another setup")


def test_an_older_record_without_run_figures_is_one_run_of_its_stored_comparison():
    rec = _record("T", run_figures=None, comparison={
        "stages": STAGES, "stage_nmse": [[1e-3, 0.5e-3], [2e-3, 1e-3], [3e-3, "inf"]], "logits_nmse": 1e-4,
        "tokens_ref": [], "tokens_cand": [], "problem": None, "probe_nmse": {}})
    base, _ = committed_baseline([rec], "T", SETUP, CAL_SHA)
    assert base.runs == 1 and base.worst["layer 1"] == 2e-3 and base.worst["layer 2"] == float("inf")


# -- through the gate -----------------------------------------------------------------------------------

class NoisyEngine:
    """A target driver whose candidate prefills are the reference plus noise of relative size eps (NMSE ~
    eps^2 per stage and token); one prefill per entry of `eps`, as [e2e] runs asks."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.states = rng.standard_normal((len(STAGES), 16, 64)).astype(np.float32)
        self.logits = rng.standard_normal((1, 128)).astype(np.float32)
        self.eps: list[float] = []

    def _out(self, eps: float, seed: int) -> PrefillOutputs:
        rng = np.random.default_rng(seed)
        noise = lambda a: (a + eps * np.abs(a).mean() * rng.standard_normal(a.shape)).astype(np.float32)  # noqa: E731
        return PrefillOutputs(noise(self.states) if eps else self.states, STAGES,
                              noise(self.logits) if eps else self.logits, [1, 2, 3])

    def prefill_pair(self, target, scratch, library, model):
        return self._out(0.0, 0), [self._out(e, 1 + i) for i, e in enumerate(self.eps)], dict(SETUP)


@pytest.fixture
def engine(workspace, monkeypatch, tmp_path):
    """minimoe's target in a fresh workspace, its driver and rule replaced: ceilings of 1e-2, tokens free."""
    from porter.host import sandbox

    ok, why = sandbox.available()
    if not ok and not sandbox.unsafe():
        pytest.skip(f"no sandbox here: {why}")
    eng = NoisyEngine()
    rule = Rule(tuple(STAGES), (1e-2,) * 3, 1e-2, tokens_exact=False)
    monkeypatch.setattr(e2e_gate, "load_driver", lambda target: eng)
    monkeypatch.setattr(cal_mod, "load_rule", lambda path: (eng.rule, {k: v for k, v in SETUP.items()}, CAL_SHA))
    eng.rule = rule
    lib = tmp_path / "libbackend.so"
    lib.write_bytes(b"\x7fELF stand-in")
    return load_target(workspace, "minimoe"), workspace, eng, lib


def _run(target, ws, lib, tmp_path, committed=None):
    return e2e_gate.run_e2e(target, ws, lib, options=e2e_gate.E2EOptions(scratch=tmp_path, store=False,
                                                                          committed=committed))


def test_the_gate_refuses_a_backend_worse_than_the_committed_one_by_more_than_its_spread(engine, tmp_path):
    target, ws, eng, lib = engine
    eng.eps = [0.010, 0.011, 0.012]  # the committed backend, as porter run's e2e recorded it at HEAD
    committed = _run(target, ws, lib, tmp_path)
    assert committed.ok and len(committed.evidence["run_figures"]) == 3
    head = tree.tree_hash_at(ws, tree.backend_dirs(target))
    assert committed.evidence["tree_hash"] == head

    eng.eps = [0.020, 0.020, 0.020]  # NMSE ~4e-4: inside the 1e-2 ceilings, 3x worse than committed
    alone = _run(target, ws, lib, tmp_path)
    assert alone.ok  # the ceilings alone accept it: the precision loss hides under MARGIN
    res = _run(target, ws, lib, tmp_path, committed=[committed.evidence])
    assert not res.ok and "worse than the committed backend's" in res.summary and "3 run(s)" in res.summary
    assert res.evidence["against_committed"]["judged"] and not res.evidence["against_committed"]["ok"]

    eng.eps = [0.0105, 0.0115, 0.0112]  # within the committed runs' own spread
    res = _run(target, ws, lib, tmp_path, committed=[committed.evidence])
    assert res.ok and "no worse than the committed backend" in res.summary, res.summary


def test_where_the_rule_pins_greedy_tokens_identical_tokens_are_the_test(engine, tmp_path):
    target, ws, eng, lib = engine
    eng.eps = [0.010, 0.011]
    committed = _run(target, ws, lib, tmp_path)
    eng.rule = Rule(tuple(STAGES), (1e-2,) * 3, 1e-2, tokens_exact=True)
    eng.eps = [0.02, 0.02]
    res = _run(target, ws, lib, tmp_path, committed=[committed.evidence])
    assert res.ok and "greedy tokens identical" in res.summary and res.evidence["against_committed"] is None


def test_without_a_record_at_head_the_summary_says_not_judged(engine, tmp_path):
    target, ws, eng, lib = engine
    eng.eps = [0.02]
    res = _run(target, ws, lib, tmp_path, committed=[])
    assert res.ok and "against the committed backend: not judged (the committed backend has no passing e2e " \
                      "record at HEAD)" in res.summary


def test_a_candidate_units_evidence_names_the_tree_it_will_make(workspace, tmp_path):
    target = load_target(workspace, "minimoe")
    dirs = tree.backend_dirs(target)
    path = target.unit_path("mini_gpu_add_tensor")
    rel = path.relative_to(workspace).as_posix()
    new = b"// the candidate\n"
    predicted = tree.tree_hash_worktree(workspace, dirs, {rel: new})
    assert predicted != tree.tree_hash_worktree(workspace, dirs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(new)
    subprocess.run(["git", "-C", str(workspace), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(workspace), "commit", "-qm", "land it"], check=True)
    assert tree.tree_hash_at(workspace, dirs) == predicted
