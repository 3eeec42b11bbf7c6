"""One registry of gates: a gate only a test knows (one module, one registry entry, no other file
changed) is run by run_gates, `porter optimize` and `status --reverify`, ordered by `porter report`,
and, declared as counting toward verified, is what a verified step must stand on."""

from __future__ import annotations

import json
import re
import textwrap
import types
from dataclasses import replace

import pytest

from porter.cli import main
from porter.gates import registry
from porter.gates.driver import Candidate, GateContext, run_gates, verdict_word
from porter.report import build
from porter.gates.result import GateResult
from porter.providers.base import Completion, Provider
from porter.commands.status import derive
from ws_builder import SOURCES, TARGET, make_workspace

LINT_MODULE = "porter_test_lint_gate"
UNIT = "mini_gpu_add_tensor"
OTHER = "mini_gpu_synchronize"
REFUSE = "// lint: refuse me\n"
REAL_GATES = registry.ACTIVE  # as porter has them, before a test sets its own
STAND_INS_RAN: list[str] = []  # the gates after static, in this test registry stand-ins that pass


def stand_in(name: str):
    def run(candidate, ctx):
        STAND_INS_RAN.append(name)
        return GateResult(name, True, f"{name} ok (stand-in)")
    return types.SimpleNamespace(run=run)


@pytest.fixture
def lint(tmp_path, monkeypatch):
    """The test registry: extract, then 'lint' (refuses a source that asks it to), then static, then
    porter's other gates as they are registered, with stand-ins that pass for their modules (they need
    nvcc or a GPU; the test stays cheap).  Nothing outside this file and the registry names lint."""
    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / f"{LINT_MODULE}.py").write_text(textwrap.dedent(f'''
        from porter.gates.result import GateResult

        seen = []

        def run(candidate, ctx):
            seen.append(candidate.unit)
            ok = {REFUSE!r} not in candidate.source
            return GateResult("lint", ok, "lint ok" if ok else "lint: refused", check=None if ok else "lint")
    '''))
    monkeypatch.syspath_prepend(str(mods))
    after = [replace(g, module=stand_in(g.name)) for g in REAL_GATES if g.name not in ("extract", "static")]
    gates = (registry.get("extract"), registry.Gate("lint", LINT_MODULE), registry.get("static"), *after)
    monkeypatch.setattr(registry, "ACTIVE", gates)  # the registry of this test only
    STAND_INS_RAN.clear()
    mod = registry.get("lint").load()
    mod.seen.clear()  # one module for every test of this file
    return mod


def test_run_gates_runs_the_registered_gate_in_its_place(lint, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    ctx = GateContext(ws.target, ws.root)
    results = run_gates(Candidate.of(UNIT, SOURCES[UNIT]), ctx)
    assert [verdict_word(r) for r in results] == ["lint ok", "static ok", "build ok", "parity ok", "perf ok"]
    refused = run_gates(Candidate.of(UNIT, REFUSE + SOURCES[UNIT]), GateContext(ws.target, ws.root))
    assert [verdict_word(r) for r in refused] == ["lint REFUSED"]  # its refusal ends the chain
    assert lint.seen == [UNIT, UNIT]


def test_status_reverify_runs_the_registered_gate(lint, tmp_path, capsys):
    ws = make_workspace(tmp_path / "ws")
    ws.port(UNIT, 1, state="built")
    ws.port(OTHER, 1, state="built", source=REFUSE + SOURCES[OTHER])  # recorded built; lint refuses it now
    assert main(["-C", str(ws.root), "status", "--reverify", "--json"]) == 1  # a recorded state contradicted
    fresh = json.loads(capsys.readouterr().out)["reverify"]
    units = {u["unit"]: u for u in fresh["units"]}
    assert units[UNIT]["verdicts"] == ["lint ok", "static ok", "build ok", "parity ok"]  # those rechecked
    assert units[OTHER]["verdicts"] == ["lint REFUSED"] and fresh["contradicted"] == [OTHER]


def test_report_orders_refusals_by_the_registry(lint, tmp_path):
    """lint comes before static in this registry, so the overview counts its refusals first (a list of
    gate names kept in the report would put an unknown gate last)."""
    ws = make_workspace(tmp_path / "ws")
    ws.fail(UNIT, 1, gate="static", summary="stub body")
    ws.fail(UNIT, 2, gate="lint", summary="lint: refused")
    index = build(ws.root, TARGET, tmp_path / "site")
    text = " ".join(re.sub(r"<[^>]+>", " ", index.read_text()).split())
    assert "2 answers refused (1 by lint, 1 by static)" in text


def test_the_registry_declares_a_consistent_chain():
    """Every gate's needs come before it and what it uses is produced before it; a registry that breaks
    that is named gate by gate."""
    assert registry.problems() == []
    broken = (registry.Gate("a", None, needs=("b",)), registry.Gate("b", None, uses=("thing",), ahead=True),
              registry.Gate("b", None))
    assert registry.problems(broken) == ["a needs b, which does not come before it",
                                         "b uses thing, which no gate before it produces", "b: registered twice"]
    assert registry.with_producers(registry.names(registry.UNIT, runs_candidate=True)) == registry.ordered(
        registry.names(role=registry.LIBRARY) + registry.names(registry.UNIT, runs_candidate=True))


class Answers(Provider):
    name, model = "fake", "fake-model"

    def __init__(self, texts):
        self.texts = list(texts)

    def complete(self, req):
        return Completion(self.texts.pop(0), self.name, self.model, usage={})


def test_optimize_runs_the_registered_gate(lint, tmp_path, monkeypatch, capsys):
    """`porter optimize` asks the registry for its gates: lint, registered after extract, judges each
    optimisation answer, and its refusal is the answer's (nothing in porter/optimize names lint, or any
    gate: tests/test_architecture.py)."""
    from porter.gates import parity
    from porter.optimize import command, profile

    assert command.gates(engine=True) == registry.names()  # lint in its place, the backend gates last
    chain = command.gates(engine=False)  # no proven engine: the backend gates left out
    assert "lint" in chain and chain == tuple(g for g in registry.names() if g not in registry.names(registry.BACKEND))

    ws = make_workspace(tmp_path / "ws")
    ws.port(UNIT, 1, state="verified", timing={"case": "n=2^20", "median_ms": 0.5, "roofline_ms": 0.1})
    monkeypatch.setattr(parity, "available", lambda: (True, "stand-in"))
    monkeypatch.setattr(command, "preflight", lambda *a, **k: None)
    monkeypatch.setattr(command, "engine_proven", lambda report: False)
    monkeypatch.setattr(profile, "find_ncu", lambda: None)
    answers = Answers([f"```cuda\n{REFUSE}{SOURCES[UNIT]}```\n", f"```cuda\n// faster\n{SOURCES[UNIT]}```\n"])
    monkeypatch.setattr(command, "get_provider", lambda name, target, opts: answers)
    assert main(["-C", str(ws.root), "optimize", "--target", TARGET, "--provider", "fake", "--unit", UNIT,
                 "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{"):])["units"][0]
    assert [r["gate"] for r in result["refused"]] == ["lint"]  # the first answer: lint's refusal is the answer's
    assert result["outcome"] == "faster"  # the second passed every gate, lint too
    assert lint.seen == [UNIT, UNIT]
    assert STAND_INS_RAN == [g for g in chain if g not in ("extract", "lint", "static")]  # the second answer's


def test_a_gate_that_counts_toward_verified_is_what_a_verified_step_stands_on(lint, tmp_path, monkeypatch):
    """Declared `verifies` in the registry, lint is part of 'verified': a step lands verified only where it
    passed, and status calls a verified step without a passing lint record behind it tampered."""
    monkeypatch.setattr(registry, "ACTIVE", tuple(replace(g, verifies=True) if g.name == "lint" else g
                                                  for g in registry.ACTIVE))
    assert registry.step_state(lambda gate: gate != "lint") == registry.BUILT
    assert registry.step_state(lambda gate: True) == registry.VERIFIED
    ws = make_workspace(tmp_path / "ws")
    ws.port(UNIT, 1, state="verified")  # static, build, parity and perf records: no lint
    source = SOURCES[OTHER]
    cand = ws.write_unit(OTHER, source)
    ws.attempt(OTHER, 1, source)
    evidence = [ws.gate(OTHER, 1, g, True, cand)[1] for g in ("lint", "static", "build", "parity", "perf")]
    ws.commit_step(ws.ledger.append("step", target=TARGET, unit=OTHER, attempt=1, state="verified",
                                    candidate_sha256=cand, unit_file=ws.rel(ws.unit_path(OTHER)), evidence=evidence))
    rows = {u.unit: u for u in derive(ws.root, target=ws.target).units}
    assert rows[UNIT].state == "tampered" and "lint" in rows[UNIT].reason, rows[UNIT].reason
    assert rows[OTHER].state == "verified", rows[OTHER].reason
    assert rows[OTHER].reason.startswith("parity evidence")  # the GPU gate's evidence is the one quoted
