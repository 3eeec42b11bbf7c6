"""One pipeline: gates import no command module, porter's modules form no import cycle, and
run, status and prompt read the same history (the sequences that used to disagree)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from porter.gates import registry
from porter.gates.driver import Candidate, GateContext, run_gates
from porter.gates.result import GateResult
from porter.records.history import History
from porter.run.scheduler import select_units
from porter.commands.status import derive
from conftest import gates_with
from ws_builder import TARGET, make_workspace

REPO = Path(__file__).resolve().parents[1]
PORTER = REPO / "porter"
# Modules that parse a command line or print for one: nothing below them may import them.
COMMAND_MODULES = {"porter.cli", "porter.run", "porter.run.scheduler", "porter.run.attempt", "porter.commands.status",
                   "porter.commands.audit", "porter.target.plan", "porter.commands.reverify", "porter.prompt.cli", "porter.calibration.command"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def porter_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PORTER.rglob("*.py")}


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The porter modules `path` imports (at any depth in the file): `from pkg import sub` counts as an
    import of the submodule, so only real dependencies make edges (a parent package's __init__ always
    runs first in Python, and is not counted)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            out |= subs or ({node.module} & modules)
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components: each component of more than one module is a cycle."""
    index, low, stack, on, cycles, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_among_porters_modules():
    mods = porter_modules()
    graph = {m: imports_of(p, set(mods)) - {m} for m, p in mods.items()}
    assert graph["porter.commands.status"] >= {"porter.records.history", "porter.gates.driver"}  # the walk sees real edges
    assert not find_cycles(graph), f"import cycles: {find_cycles(graph)}"


def test_the_cycle_walk_finds_a_cycle(tmp_path):
    """The same walk over two files that import each other (through a function-level import, as the
    calibrate <-> parity circle once hid) reports them."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from porter.b import x\n")
    b.write_text("def f():\n    from porter import a\n")
    mods = {"porter.a", "porter.b", "porter.c"}
    graph = {"porter.a": imports_of(a, mods), "porter.b": imports_of(b, mods), "porter.c": {"porter.a"}}
    assert find_cycles(graph) == [["porter.a", "porter.b"]]


def test_importing_the_parity_gate_imports_no_command_module():
    code = ("import sys, porter.gates.parity, porter.gates.driver, porter.records.history; "
            "print('\\n'.join(m for m in sys.modules if m.startswith('porter')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    loaded = set(r.stdout.split())
    assert "porter.gates.parity" in loaded
    assert not loaded & COMMAND_MODULES, sorted(loaded & COMMAND_MODULES)


def test_each_gate_has_the_one_shape():
    for gate in registry.ACTIVE:
        name, mod = gate.name, gate.load()
        assert callable(getattr(mod, "run", None)), name
        assert not hasattr(mod, "check"), f"{name}: a second entry point beside run()"


# ---- the driver ----------------------------------------------------------------------


class Recorder:
    def __init__(self, verdicts):
        self.verdicts, self.calls = verdicts, []

    def gate(self, name):
        def run(candidate, ctx):
            self.calls.append(name)
            ok, skipped = self.verdicts.get(name, (True, False))
            return GateResult(name, ok, f"{name} says {ok}", skipped=skipped, check=None if ok or skipped else name)
        return types.SimpleNamespace(run=run)


@pytest.mark.parametrize("verdicts,ran", [
    ({}, ["static", "build", "parity", "perf"]),
    ({"static": (False, False)}, ["static"]),  # a refusal stops the chain: no build of a stub
    ({"build": (False, False)}, ["static", "build"]),
    ({"parity": (False, True)}, ["static", "build", "parity"]),  # skipped parity: perf has nothing to time
    ({"parity": (False, False)}, ["static", "build", "parity"]),
])
def test_run_gates_order_and_stops(monkeypatch, tmp_path, verdicts, ran):
    rec = Recorder(verdicts)
    monkeypatch.setattr(registry, "ACTIVE", gates_with(**{n: rec.gate(n) for n in registry.names(registry.UNIT)}))
    target = types.SimpleNamespace(workspace=tmp_path, name="t")
    seen = []
    # asked in the wrong order on purpose: the order lives in the driver
    results = run_gates(Candidate.of("u", "x"), GateContext(target, build_cache=tmp_path),
                        gates=("perf", "parity", "build", "static"), on_result=lambda r: seen.append(r.gate))
    assert rec.calls == ran == seen == [r.gate for r in results]
    assert all(r.evidence["candidate_sha256"] == Candidate.of("u", "x").sha256 for r in results)


# ---- run, status and prompt agree ---------------------------------------------------


@pytest.fixture
def ws(tmp_path, monkeypatch):
    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return make_workspace(tmp_path / "ws")


def _run_would(ws, unit, explicit=False):
    """What `porter run` would do with the unit: 'port' or why it skips it."""
    r = types.SimpleNamespace(can_verify=lambda u: False)
    todo, _, skipped = select_units(ws.target, History.read(ws.root, TARGET), [unit], explicit, r)
    return "port" if todo else skipped[0]


UNIT = "mini_gpu_add_tensor"


def test_exhausted_then_a_retry_stopped_by_the_time_budget_is_failing_for_both(ws):
    """`run --unit X` after exhaustion, stopped by --time-budget before its attempts ran out: status
    called this failing while run skipped the unit as exhausted; both say failing now."""
    ws.fail(UNIT, 1)
    ws.exhaust(UNIT, 1)
    assert derive(ws.root, TARGET).unit(UNIT).state == "exhausted"
    assert "exhausted earlier" in _run_would(ws, UNIT)
    ws.fail(UNIT, 2)  # the retry: one attempt, then the budget ran out (no "exhausted" record)
    assert derive(ws.root, TARGET).unit(UNIT).state == "failing"
    assert _run_would(ws, UNIT) == "port"


def test_exhausted_after_a_step_agrees(ws):
    ws.port(UNIT, 1, state="built")
    ws.fail(UNIT, 2)
    ws.exhaust(UNIT, 1)
    uh = History.read(ws.root, TARGET).unit(UNIT)
    assert uh.exhausted and derive(ws.root, TARGET).unit(UNIT).state == "built"  # the built file still stands
    assert "built" in _run_would(ws, UNIT)


def test_prompt_shows_the_failures_run_would_send(ws, capsys):
    """An abandoned step does not clear the failures before it (prompt used to clear at any step)."""
    from porter.cli import main

    ws.fail(UNIT, 1, summary="first: nvcc: error: expected ';'")
    step, _ = ws.port(UNIT, 2, state="built", commit=False)
    ws.ledger.append("reconcile", target=TARGET, unit=UNIT, attempt=2, action="abandon-step", step=step["hash"],
                     reason="unit file is not the step's candidate")
    ws.fail(UNIT, 3, summary="third: link error")
    uh = History.read(ws.root, TARGET).unit(UNIT)
    assert [f.attempt for f in uh.failures_since_step] == [1, 3] and uh.next_attempt == 4
    assert main(["-C", str(ws.root), "prompt", UNIT, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["attempt"] == 4
    assert "first: nvcc: error" in out["prompt"] and "third: link error" in out["prompt"]


@pytest.mark.parametrize("build_ok", [True, False])
def test_parity_inputs_are_started_before_the_build_and_dropped_when_it_refuses(monkeypatch, tmp_path, build_ok):
    """run_gates starts parity's inputs and references (start_ahead) before the build gate runs, hands
    them to parity, and cancels them when the build refuses (parity never comes)."""
    from concurrent.futures import Future

    order, fut = [], Future()

    def build_run(candidate, ctx):
        order.append(("build", ctx.ahead.get("parity") is fut))
        return GateResult("build", build_ok, "built" if build_ok else "no", check=None if build_ok else "build")

    def parity_run(candidate, ctx):
        order.append(("parity", ctx.ahead.get("parity") is fut))
        return GateResult("parity", True, "ok")

    rec = Recorder({})
    stand_ins = {n: rec.gate(n) for n in registry.names(registry.UNIT)}
    stand_ins["build"] = types.SimpleNamespace(run=build_run)
    stand_ins["parity"] = types.SimpleNamespace(run=parity_run,
                                                start_ahead=lambda c, ctx: order.append(("ahead", None)) or fut)
    monkeypatch.setattr(registry, "ACTIVE", gates_with(**stand_ins))
    target = types.SimpleNamespace(workspace=tmp_path, name="t")
    run_gates(Candidate.of("u", "x"), GateContext(target, build_cache=tmp_path), gates=("static", "build", "parity"))
    if build_ok:
        assert order == [("ahead", None), ("build", True), ("parity", True)] and not fut.cancelled()
    else:
        assert order == [("ahead", None), ("build", True)] and fut.cancelled()
