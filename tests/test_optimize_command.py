"""`porter optimize` end to end on the CPU: a unit verified by `porter run` (parity, perf and e2e are
stand-ins: no GPU here), then optimisation answers from a fake provider, judged by the real extract,
static, build and speedup gates; the speedup gate's rounds are synthetic timings keyed by the
candidate's sha256 (porter.optimize.ab.time_round replaced), the committed side built for real.

What must hold: a faster answer lands one verified step and one commit that say the speedup and its
p, with the speedup evidence; the committed code offered again (A/A) is refused as inconclusive;
an answer parity refuses is refused by parity; a refusal leaves the unit verified and its file as
committed; status shows the speedup; a unit that is not verified is left alone."""

from __future__ import annotations

import json
import random
import re

import pytest

from conftest import gates_with, needs_nvcc
from porter.records import gitops
from porter.cli import main
from porter.digest import sha256_text
from porter.gates.extract import extract_unit_source
from porter.gates.e2e import gate as e2e_gate
from porter.gates.e2e.state import E2E_UNIT
from porter.gates.result import GateResult
from porter.records.ledger import Ledger
from porter.optimize import ab, command, profile
from porter.providers.base import Completion, Provider
from porter.commands.status import derive
from porter.target import load_target

ADD = "mini_gpu_add_tensor"  # scripted: one good answer, which `porter run` verifies first
OTHER = "mini_gpu_swiglu_tensor"  # never ported in these tests


def answer(source: str) -> str:
    return f"Here it is.\n\n```cuda\n{source}```\n"


class StandInParity:
    """Passes every candidate but those in `bad`, with a timing as the real gate records one."""

    def __init__(self):
        self.bad: set[str] = set()

    def run(self, candidate, ctx):
        ok = candidate.sha256 not in self.bad
        timing = {"case": "n=2^20+5 (bandwidth)", "median_ms": 0.05, "roofline_ms": 0.005}
        return GateResult("parity", ok, "parity ok (stand-in)" if ok else "parity failed [values] (stand-in)",
                          check=None if ok else "values", evidence={"stand_in": True, "timing": timing})


class StandInPerf:
    def run(self, candidate, ctx):
        return GateResult("perf", True, "perf ok (stand-in)", evidence={"decided_by": "roofline floor",
                                                                         "floor_fraction": 0.05})


class StandInE2E:
    """Passes, with evidence shaped as the real gate's: about the whole backend (unit e2e:prefill, the
    library's sha256), naming the unit candidate it was built with (`other`: a wrong one, as if another
    run's evidence had been put in this step)."""

    def __init__(self):
        self.calls, self.other = 0, None

    def run(self, candidate, ctx):
        self.calls += 1
        facts = e2e_gate.candidate_facts(candidate, ctx)
        if self.other:
            facts["candidate_sha256"] = self.other
        return GateResult("e2e", True, "e2e ok (stand-in)", evidence={
            "unit": E2E_UNIT, "candidate_sha256": "0" * 64, "stand_in": True, "with_candidate": facts})


class FakeProvider(Provider):
    name, model = "fake", "fake-model"

    def __init__(self, texts: list[str]):
        self.texts, self.prompts = list(texts), []

    def complete(self, req):
        self.prompts.append(req)
        return Completion(self.texts.pop(0), self.name, self.model, usage={"input_tokens": 1, "output_tokens": 1})


class Rounds:
    """ab.time_round's stand-in: 0.5 ms for the sha256s in `fast`, 1 ms otherwise, with 2% noise."""

    def __init__(self):
        self.fast: set[str] = set()
        self.rng = random.Random("rounds")

    def __call__(self, target, spec, library, ctx, candidate_sha256):
        t = (0.5 if candidate_sha256 in self.fast else 1.0) * self.rng.lognormvariate(0, 0.02)
        return GateResult("parity", True, "parity ok (synthetic round)",
                          evidence={"timing": {"median_ms": t, "roofline_ms": 0.005}})


@pytest.fixture
def verified(workspace, build_cache, monkeypatch):
    """A workspace whose ADD unit `porter run` verified; the stand-ins and the fake timer in place."""
    import porter.gates.parity as parity
    from porter.gates import registry

    parity_gate, e2e = StandInParity(), StandInE2E()
    monkeypatch.setattr(parity, "available", lambda: (True, "stand-in"))
    monkeypatch.setattr(registry, "ACTIVE", gates_with(parity=parity_gate, perf=StandInPerf(), e2e=e2e))
    rounds = Rounds()
    monkeypatch.setattr(ab, "time_round", rounds)
    monkeypatch.setattr(command, "engine_proven", lambda report: True)  # as if e2e passed at HEAD
    monkeypatch.setattr(profile, "find_ncu", lambda: None)  # no profiler: the prompt says so (GPU hosts have one)
    assert main(["-C", str(workspace), "run", "--target", "minimoe", "--provider", "scripted", "--unit", ADD,
                 "--max-attempts", "1"]) == 0
    target = load_target(workspace, "minimoe")
    assert {u.unit: u.state for u in derive(workspace, target=target).units}[ADD] == "verified"
    return workspace, target, parity_gate, rounds, e2e


def optimize(ws, monkeypatch, texts: list[str], *args: str) -> tuple[int, FakeProvider]:
    provider = FakeProvider(texts)
    monkeypatch.setattr(command, "get_provider", lambda name, target, opts: provider)
    rc = main(["-C", str(ws), "optimize", "--target", "minimoe", "--provider", "fake", *args])
    return rc, provider


def faster_source(target) -> str:
    committed = target.unit_path(ADD).read_text()
    fast = committed.replace("const unsigned threads = 256;", "const unsigned threads = 512;")
    assert fast != committed
    return fast


@needs_nvcc
def test_a_faster_answer_lands_one_step_and_commit_with_its_evidence(verified, monkeypatch, capsys):
    ws, target, _, rounds, e2e = verified
    before = Ledger(ws).records()
    head = gitops.commit_of(ws)
    fast = faster_source(target)
    rounds.fast.add(sha256_text(fast))
    rc, provider = optimize(ws, monkeypatch, [answer(fast)], "--unit", ADD, "--max-attempts", "2")
    assert rc == 0
    assert len(provider.prompts) == 1  # a win ends the unit's attempts
    prompt = provider.prompts[0]
    assert "make the committed implementation faster" in prompt.prompt and "const unsigned threads = 256;" in prompt.prompt
    assert "10% of the roofline" in prompt.prompt and prompt.meta["builder"] == "porter.prompt.optimize"
    assert "profile: unavailable (ncu (Nsight Compute) not found" in prompt.prompt

    new = Ledger(ws).records()[len(before):]
    (att,) = [r for r in new if r["kind"] == "attempt"]
    assert att["purpose"] == "optimize" and att["attempt"] == 2
    (step,) = [r for r in new if r["kind"] == "step"]
    assert (step["unit"], step["state"], step["candidate_sha256"]) == (ADD, "verified", sha256_text(fast))
    gates = [r["gate"] for r in new if r["kind"] == "gate"]
    assert gates == ["extract", "static", "build", "parity", "perf", "speedup", "e2e"] and e2e.calls == 1
    assert target.unit_path(ADD).read_text() == fast

    commits = gitops.git(ws, "log", "--format=%H %s", f"{head}..HEAD").splitlines()
    step_commits = [c for c in commits if " porter: verified " in c]
    assert len(step_commits) == 1
    assert re.search(r"porter: verified mini_gpu_add_tensor \(attempt 2\): speedup: 2\.\d+x faster .*p=5\.4e-06",
                     step_commits[0]), step_commits[0]
    speedup_ev = json.loads((ws / "ledger" / "evidence" / f"{_speedup_evidence(ws, step)}.json").read_text())
    d = speedup_ev["decision"]
    assert d["verdict"] == "faster" and d["p_value"] < d["alpha"] == 1e-4
    assert speedup_ev["committed_sha256"] != speedup_ev["candidate_sha256"] == sha256_text(fast)
    assert len(speedup_ev["medians_ms"]["old"]) == 10 and speedup_ev["roofline_fraction"]["new"] > 0

    st = {u.unit: u for u in derive(ws, target=target).units}[ADD]
    assert st.state == "verified" and [round(s["x"]) for s in st.speedups] == [2] and st.speedups[0]["attempt"] == 2
    # the step carries the e2e run of the backend built with it (backend-wide evidence): not "swapped"
    e2e_ev = [json.loads((ws / "ledger" / "evidence" / f"{sha}.json").read_text()) for sha in step["evidence"]]
    (e2e_ev,) = [e for e in e2e_ev if e["gate"] == "e2e"]
    assert e2e_ev["unit"] == "e2e:prefill" and e2e_ev["with_candidate"]["candidate_sha256"] == sha256_text(fast)
    assert not derive(ws, target=target).tampered
    capsys.readouterr()
    assert main(["-C", str(ws), "status", "--json"]) in (0, 1)
    row = next(u for u in json.loads(capsys.readouterr().out)["units"] if u["unit"] == ADD)
    assert row["speedups"][0]["p_value"] == pytest.approx(d["p_value"])
    main(["-C", str(ws), "status"])
    assert re.search(r"speedups landed: mini_gpu_add_tensor 2\.\d+x \(p=5\.4e-06\)", capsys.readouterr().out)
    assert main(["-C", str(ws), "report", "--out", str(ws / "runs" / "site")]) == 0
    index = (ws / "runs" / "site" / "index.html").read_text()
    assert re.search(r"<th>speedups</th><td>speedups landed: mini_gpu_add_tensor 2\.\d+x", index)
    # the next optimize starts from the landed step (before e2e evidence named its candidate, it refused
    # to: "evidence ... is for minimoe/e2e:prefill, not this unit (swapped)", seen on an H200)
    rc, _ = optimize(ws, monkeypatch, [answer(fast)], "--unit", ADD, "--max-attempts", "1", "--target-fraction", "1")
    assert rc == 0


@needs_nvcc
def test_e2e_evidence_of_another_candidate_in_a_speedup_step_is_tampering(verified, monkeypatch):
    # a step may carry backend-wide e2e evidence only for the backend built with its own candidate
    ws, target, _, rounds, e2e = verified
    fast = faster_source(target)
    rounds.fast.add(sha256_text(fast))
    e2e.other = sha256_text("some other candidate")
    rc, _ = optimize(ws, monkeypatch, [answer(fast)], "--unit", ADD, "--max-attempts", "1")
    assert rc == 0
    st = {u.unit: u for u in derive(ws, target=target).units}[ADD]
    assert st.state == "tampered" and "(swapped)" in st.reason and "e2e evidence" in st.reason
    rc, _ = optimize(ws, monkeypatch, [answer(fast)], "--unit", ADD, "--max-attempts", "1")
    assert rc == 3  # optimize does not start on a tampered workspace


def _speedup_evidence(ws, step) -> str:
    for sha in step["evidence"]:
        if json.loads((ws / "ledger" / "evidence" / f"{sha}.json").read_text())["gate"] == "speedup":
            return sha
    raise AssertionError("the step has no speedup evidence")


@needs_nvcc
def test_the_committed_code_again_and_a_wrong_answer_are_refused(verified, monkeypatch, capsys):
    ws, target, parity_gate, rounds, _ = verified
    committed = target.unit_path(ADD).read_text()
    wrong = faster_source(target).replace("out[i] = a[i] + b[i];", "out[i] = a[i];")
    parity_gate.bad.add(sha256_text(wrong))
    rounds.fast.add(sha256_text(wrong))  # "faster because wrong": parity must refuse it before any timing
    head, n = gitops.commit_of(ws), len(Ledger(ws).records())
    capsys.readouterr()
    rc, provider = optimize(ws, monkeypatch, [answer(committed), answer(wrong)], "--unit", ADD, "--max-attempts", "2",
                            "--json")
    assert rc == 0 and not provider.texts
    # --json names the gate and the check of that gate that refused each answer
    (entry,) = json.loads(capsys.readouterr().out)["units"]
    assert [(r["gate"], r["check"]) for r in entry["refused"]] == [("speedup", "inconclusive"), ("parity", "values")]
    new = Ledger(ws).records()[n:]
    assert not [r for r in new if r["kind"] == "step"]
    fails = [(r["attempt"], r["gate"], r["summary"]) for r in new if r["kind"] == "failure"]
    assert [f[:2] for f in fails] == [(2, "speedup"), (3, "parity")]
    assert fails[0][2].startswith("speedup inconclusive: ")
    assert [r["purpose"] for r in new if r["kind"] == "attempt"] == ["optimize", "optimize"]
    # refusals change nothing the unit stands on
    assert target.unit_path(ADD).read_text() == committed
    st = {u.unit: u for u in derive(ws, target=target).units}[ADD]
    assert st.state == "verified" and st.speedups == []
    (only,) = gitops.git(ws, "log", "--format=%s", f"{head}..HEAD").splitlines()
    assert only.startswith("porter: ledger of optimize run ")  # the failures, and no step
    # the second prompt lists the first refusal
    assert "attempt 2: speedup: speedup inconclusive" in provider.prompts[1].prompt


@needs_nvcc
def test_a_unit_that_is_not_verified_is_left_alone(verified, monkeypatch, capsys):
    ws, _, _, _, _ = verified
    n = len(Ledger(ws).records())
    capsys.readouterr()
    rc, provider = optimize(ws, monkeypatch, [], "--unit", OTHER, "--json")
    assert rc == 0 and provider.prompts == []
    out = json.loads(capsys.readouterr().out)
    assert out["units"] == [{"unit": OTHER, "outcome": "skipped", "why": "unported, not verified: nothing to optimise"}]
    assert not [r for r in Ledger(ws).records()[n:] if r.get("unit") == OTHER]


@needs_nvcc
def test_a_speedup_no_round_could_measure_is_no_speedup(verified, monkeypatch):
    """Every gate passes or is skipped, but the speedup gate measured nothing: no step lands."""
    ws, target, _, _, _ = verified
    monkeypatch.setattr(ab, "time_round", lambda *a: GateResult("parity", False, "parity skipped: no GPU",
                                                                skipped=True))
    n = len(Ledger(ws).records())
    rc, _ = optimize(ws, monkeypatch, [answer(faster_source(target))], "--unit", ADD, "--max-attempts", "1")
    assert rc == 0
    new = Ledger(ws).records()[n:]
    assert not [r for r in new if r["kind"] == "step"]
    (fail,) = [r for r in new if r["kind"] == "failure"]
    assert fail["gate"] == "speedup" and fail["summary"].startswith("speedup not established: speedup skipped: ")


def test_units_are_chosen_prefill_first_then_furthest_from_the_roofline():
    from types import SimpleNamespace as U

    def row(unit, tier, pct=None, x=None, state="verified"):
        return U(unit=unit, tier=tier, state=state, speed={"time_ms": 1.0, "pct_roofline": pct, "x_known_good": x})

    report = U(units=[row("d_slow", "decode", 5), row("p_fast", "prefill", 60), row("p_slow", "prefill", 10),
                      row("p_done", "prefill", 95), row("p_kg", "prefill", None, 4.0), row("failing", "prefill",
                                                                                           state="failing")])
    picked, over = command.choose(report, [], 0.8)
    assert [u.unit for u in picked] == ["p_slow", "p_kg", "p_fast", "d_slow"]
    assert dict(over) == {"p_done": "already at 95% of its roofline (--target-fraction 0.8)"}
    _, over = command.choose(report, ["failing"], 0.8)
    assert dict(over) == {"failing": "failing, not verified: nothing to optimise"}


def test_e2e_judges_a_speedup_only_where_the_engine_was_proven():
    from types import SimpleNamespace as R

    assert command.engine_proven(R(prefill={"state": "verified"}))
    assert not command.engine_proven(R(prefill={"state": "unverified"}))

