"""One registry of gates: a gate only a test knows (one module, one registry entry, no other file
changed) is run by run_gates, `porter run`, `porter optimize`, calibration and `status --reverify`,
ordered by `porter report` and listed among a unit's evidence there, and, declared as counting toward
verified, is what a verified step must stand on.  And one route for a candidate: the answer becomes a
typed Candidate (extract) before any of those gates judges it."""

from __future__ import annotations

import json
import re
import subprocess
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

    # lint in its place, the backend gates last, less the engine's throughput (the next run measures it)
    assert command.gates(engine=True) == tuple(g for g in registry.names()
                                               if g not in registry.names(registry.BACKEND, role=registry.SPEED))
    assert registry.names(registry.BACKEND, role=registry.SPEED), "a backend speed gate exists to leave out"
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


# ---- a gate judging output, registered by a test: porter run, calibration, status and the report ----

VET_MODULE = "porter_test_vet_gate"
VET_MARK = "// vet: refuse me\n"


@pytest.fixture
def vet(lint, tmp_path, monkeypatch):
    """The lint fixture's registry plus 'vet': a gate judging output (it uses the library, counts toward
    verified) that reads the candidate's source, or the library file where the candidate is a prebuilt
    library (calibration), and refuses what carries its mark; on the CPU, after parity's stand-in."""
    (tmp_path / "mods" / f"{VET_MODULE}.py").write_text(textwrap.dedent(f'''
        from pathlib import Path

        from porter.gates.result import GateResult

        seen = []

        def run(candidate, ctx):
            judged = candidate.source or Path(ctx.library).read_text(errors="replace")
            seen.append((candidate.unit, "source" if candidate.source else "library"))
            ok = {VET_MARK!r} not in judged
            return GateResult("vet", ok, "vet ok" if ok else "vet: refused", check=None if ok else "vet")
    '''))
    vet_gate = registry.Gate("vet", VET_MODULE, role=registry.OUTPUT, uses=(registry.LIBRARY_FILE,), verifies=True)
    gates = list(registry.ACTIVE)
    gates.insert(registry.names().index("parity") + 1, vet_gate)
    monkeypatch.setattr(registry, "ACTIVE", tuple(gates))
    assert registry.problems() == []
    mod = registry.get("vet").load()
    mod.seen.clear()
    return mod


def _scripted(target, unit: str, answers: list[tuple[str, str]]) -> None:
    """The workspace's scripted manifest: `answers` (text, the gate expected to refuse it or 'pass')."""
    scripted = target.scripted_dir
    entries = []
    for n, (text, expect) in enumerate(answers, 1):
        (scripted / "route").mkdir(parents=True, exist_ok=True)
        (scripted / "route" / f"{n}.md").write_text(text)
        entries.append(f'[[answer]]\nunit = "{unit}"\nfile = "route/{n}.md"\nexpect = "{expect}"\nwhy = "answer {n}"\n')
    (scripted / "manifest.toml").write_text("\n".join(entries))
    subprocess.run(["git", "-C", str(target.workspace), "add", "-A"], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(target.workspace), "commit", "-qm", "the route's answers"], check=True,
                   capture_output=True)


def test_porter_run_runs_the_registered_gate_and_the_report_shows_its_evidence(vet, tmp_path, monkeypatch, capsys):
    """`porter run` (scripted provider on minimoe): the answer is extracted first (prose refused there,
    recorded as an attempt with no candidate), then vet judges each candidate in its registry place: its
    refusal is the attempt's, its pass is evidence of the step, and the report lists that evidence."""
    import porter.run as run_command
    from porter.gates import parity
    from porter.records.ledger import Ledger

    monkeypatch.setattr(parity, "available", lambda: (True, "stand-in"))  # parity's stand-in runs
    monkeypatch.setattr(run_command, "preflight", lambda *a, **k: None)
    monkeypatch.setattr(run_command, "check_environment", lambda *a, **k: None)  # build is a stand-in
    monkeypatch.setattr(run_command, "take_baselines", lambda *a, **k: None)
    from porter.target import load_target
    from porter.workspace import init_workspace

    root = init_workspace(tmp_path / "ws", [TARGET])
    good = f"```cuda\n{SOURCES[UNIT]}```\n"
    _scripted(load_target(root, TARGET), UNIT, [("I would write a kernel here.\n", "extract"),
                                               (f"```cuda\n{VET_MARK}{SOURCES[UNIT]}```\n", "vet"), (good, "pass")])
    assert main(["-C", str(root), "run", "--target", TARGET, "--provider", "scripted", "--unit", UNIT,
                 "--max-attempts", "3"]) == 0, capsys.readouterr()
    assert vet.seen == [(UNIT, "source"), (UNIT, "source")]  # the prose never became a candidate
    records = [r for r in Ledger(root).records() if r.get("unit") == UNIT]
    attempts = [r for r in records if r["kind"] == "attempt"]
    assert [a["candidate_sha256"] is None for a in attempts] == [True, False, False]
    assert [r["gate"] for r in records if r["kind"] == "failure"] == ["extract", "vet"]
    gates = [(r["attempt"], r["gate"]) for r in records if r["kind"] == "gate"]
    assert gates == [(1, "extract"), (2, "extract"), (2, "lint"), (2, "static"), (2, "build"), (2, "parity"),
                     (2, "vet"), (3, "extract"), (3, "lint"), (3, "static"), (3, "build"), (3, "parity"),
                     (3, "vet"), (3, "perf")]
    # every attempt record comes before the gate records of its attempt (the route writes it)
    kinds = [(r["kind"], r.get("attempt")) for r in records if r["kind"] in ("attempt", "gate")]
    assert all(kinds.index(("attempt", n)) < kinds.index(("gate", n)) for n in (1, 2, 3))
    (step,) = [r for r in records if r["kind"] == "step"]
    assert step["attempt"] == 3 and step["state"] == registry.VERIFIED  # vet and parity's stand-in passed

    page = (build(root, TARGET, tmp_path / "site").parent / "units" / f"{UNIT}.html").read_text()
    evidence = page[page.index('id="evidence"'):]
    assert re.search(r"<h3>vet <code>", evidence), evidence[:2000]  # the step's vet evidence, listed


def test_calibration_runs_the_registered_gate_on_the_known_good(vet, tmp_path):
    """Calibration's known-good path runs every unit gate judging output, asked of the registry: vet
    reads the known-good library (a typed library candidate) and its refusal is the known-good's."""
    from porter.calibration.calibrator import CalibrateOptions, calibrate

    ws = make_workspace(tmp_path / "ws")
    lib = tmp_path / "libknown_good.so"

    class KnownGood:
        describe = "a stand-in known-good library"

        def prepare(self, mutants, progress):
            pass

        def known_good(self):
            return lib

        def has(self, unit):
            return True

    opts = CalibrateOptions(ws.root, units=[UNIT], with_mutants=False, ledger=False, variants=False, jobs=1)
    lib.write_text("a library\n")
    (row,) = calibrate(ws.target, KnownGood(), opts, out=lambda line: None)["rows"]
    assert (row["kind"], row["got"], row["ok"]) == ("known-good", "pass", True)
    lib.write_text(f"a library\n{VET_MARK}")
    (row,) = calibrate(ws.target, KnownGood(), opts, out=lambda line: None)["rows"]
    assert (row["kind"], row["got"], row["ok"]) == ("known-good", "vet", False)
    assert vet.seen == [(UNIT, "library"), (UNIT, "library")]


def test_status_wants_the_registered_gates_passing_evidence_for_verified(vet, tmp_path):
    """vet counts toward verified: a step recorded verified without a passing vet record behind it is not
    verified; with one it is."""
    ws = make_workspace(tmp_path / "ws")
    ws.port(UNIT, 1, state="verified")  # static, build, parity and perf records: no vet
    source = SOURCES[OTHER]
    cand = ws.write_unit(OTHER, source)
    ws.attempt(OTHER, 1, source)
    evidence = [ws.gate(OTHER, 1, g, True, cand)[1] for g in ("lint", "static", "build", "parity", "vet", "perf")]
    ws.commit_step(ws.ledger.append("step", target=TARGET, unit=OTHER, attempt=1, state="verified",
                                    candidate_sha256=cand, unit_file=ws.rel(ws.unit_path(OTHER)), evidence=evidence))
    rows = {u.unit: u for u in derive(ws.root, target=ws.target).units}
    assert rows[UNIT].state != "verified" and "vet" in rows[UNIT].reason, rows[UNIT].reason
    assert rows[OTHER].state == "verified", rows[OTHER].reason


def test_the_answer_becomes_a_typed_candidate_before_any_unit_gate(lint, tmp_path):
    """The route's first step: extract_candidate runs the answer gates on the answer and returns the typed
    candidate (its provenance the answer's); run_gates judges candidates only."""
    from porter.gates.driver import Answer, Provenance, extract_candidate

    ws = make_workspace(tmp_path / "ws")
    prov = Provenance("scripted", "scripted:good.md", "p" * 64, "r" * 64, 4)
    ctx = GateContext(ws.target, ws.root)
    made = extract_candidate(Answer(UNIT, f"Here:\n```cuda\n{SOURCES[UNIT]}```\n", prov), ctx)
    assert [verdict_word(r) for r in made.results] == ["extract ok"] and lint.seen == []  # no unit gate yet
    assert made.candidate == Candidate.of(UNIT, SOURCES[UNIT], prov)
    refused = extract_candidate(Answer(UNIT, "prose only", prov), GateContext(ws.target, ws.root))
    assert refused.candidate is None and [verdict_word(r) for r in refused.results] == ["extract REFUSED"]
    with pytest.raises(ValueError, match="judge"):
        run_gates(made.candidate, ctx, gates=registry.names())
