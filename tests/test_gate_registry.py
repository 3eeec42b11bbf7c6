"""One registry of gates: a gate only a test knows (one module, one registry entry, no other file
changed) is run by run_gates and `status --reverify`, and ordered by `porter report`."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from porter.cli import main
from porter.gates import registry
from porter.gates.driver import Candidate, GateContext, run_gates, verdict_word
from porter.report import build
from ws_builder import SOURCES, TARGET, make_workspace

LINT_MODULE = "porter_test_lint_gate"
UNIT = "mini_gpu_add_tensor"
OTHER = "mini_gpu_synchronize"
REFUSE = "// lint: refuse me\n"


@pytest.fixture
def lint(tmp_path, monkeypatch):
    """The test registry: extract, then 'lint' (refuses a source that asks it to), then static; the
    gates that need nvcc or a GPU are left out so the test stays cheap."""
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
    gates = (registry.get("extract"), registry.Gate("lint", LINT_MODULE), registry.get("static"))
    monkeypatch.setattr(registry, "ACTIVE", gates)  # the registry of this test only
    return registry.get("lint").load()


def test_run_gates_runs_the_registered_gate_in_its_place(lint, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    ctx = GateContext(ws.target, ws.root)
    results = run_gates(Candidate.of(UNIT, SOURCES[UNIT]), ctx)
    assert [verdict_word(r) for r in results] == ["lint ok", "static ok"]
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
    assert units[UNIT]["verdicts"] == ["lint ok", "static ok"]
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
