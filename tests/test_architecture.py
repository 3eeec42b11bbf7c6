"""Architecture rules, checked by walking porter's code (ast), each beside a test that shows the walk
catching the thing it forbids:
- git is reached through porter.records.gitops only (one client, the command line);
- the ledger's records are read through porter.records.history only (the rules of what the past means live
  there once); import cycles and command modules are test_pipeline.py's."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PORTER = REPO / "porter"


def porter_sources() -> dict[str, ast.AST]:
    out = {}
    for p in sorted(PORTER.rglob("*.py")):
        parts = p.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = ast.parse(p.read_text())
    return out


def _allowed(module: str, allowed: dict[str, str]) -> bool:
    return any(module == m or module.startswith(m + ".") for m in allowed)


# ---- git through gitops -----------------------------------------------------------------

GIT_MODULE = "porter.records.gitops"
PROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output", "system", "popen"}


def git_reaches(tree: ast.AST) -> list[str]:
    """Each place `tree` reaches git by itself: an import of gitpython (`git`), an argv list starting
    with "git", or a shell command string starting with "git " handed to a process call."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] == "git"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "git":
            out.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, (ast.List, ast.Tuple)) and node.elts and isinstance(node.elts[0], ast.Constant) \
                and node.elts[0].value == "git":
            out.append(f"line {node.lineno}: a git argv {ast.unparse(node)[:60]}")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and node.args[0].value.split(" ")[0] == "git" \
                and getattr(node.func, "attr", getattr(node.func, "id", None)) in PROCESS_CALLS:
            out.append(f"line {node.lineno}: a git shell command {node.args[0].value[:60]!r}")
    return out


def test_only_gitops_reaches_git():
    sources = porter_sources()
    assert git_reaches(sources[GIT_MODULE]), "the walk sees gitops' own git calls"
    found = {m: r for m, t in sources.items() if m != GIT_MODULE and (r := git_reaches(t))}
    assert not found, f"git reached outside porter.records.gitops (add a gitops function instead): {found}"


def test_the_git_walk_catches_each_way_in():
    for code in ("import git\n", "import git.exc\n", "from git import Repo\n",
                 "import subprocess\nsubprocess.run(['git', 'log'], cwd=ws)\n",
                 "from subprocess import check_output\ncheck_output(('git', 'show', 'HEAD:x'))\n",
                 "import os\nos.system('git status')\n", "argv = ['git', '-C', ws, 'ls-tree']\n"):
        assert git_reaches(ast.parse(code)), code
    for code in ("from porter.records import gitops\ngitops.read(ws, 'log')\n", "print('git log failed')\n",
                 "import gitops\n", "subprocess.run(['nvcc', '--version'])\n"):
        assert not git_reaches(ast.parse(code)), code


# ---- ledger records through history -------------------------------------------------------

# porter.records.ledger writes and verifies the file; porter.records.history types its records (History.read,
# History.from_scan).  Everything else asks history, and may use the ledger only to append, to
# repair it, or for its integrity verdict (Ledger.verify(): counts and problems, no records).
LEDGER_READERS = {"porter.records.ledger", "porter.records.history"}
# Modules that still read raw records, each with why:
RAW_READERS_ALLOWED = {
    # derive() makes the one pass (Ledger.scan()) that gives History.from_scan its records, the
    # integrity verdict, the bytes compared with HEAD's ledger and the raw hash chain the witness
    # checks: integrity is judged on the lines as written, which typed history records drop.
    "porter.commands.status": "integrity of the raw lines (chain, witness, committed prefix)",
}
RAW_METHODS = {"records", "scan"}  # Ledger.records(), Ledger.scan() (Scan.entries are raw dicts)
RAW_NAMES = {"scan_bytes", "Scan", "_complete_lines"}  # porter.records.ledger's raw parsing, by name


def raw_ledger_reads(tree: ast.AST) -> list[str]:
    """Each place `tree` reads ledger records itself: a call `x.records()` or `x.scan(...)` on
    something other than a module called scan, or porter.records.ledger's raw parsers imported or named."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RAW_METHODS \
                and not node.args[1:] and not node.keywords \
                and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "scan"):
            out.append(f"line {node.lineno}: {ast.unparse(node)[:60]}")
        elif isinstance(node, ast.ImportFrom) and node.module == "porter.records.ledger":
            out += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in RAW_NAMES]
        elif isinstance(node, ast.Attribute) and node.attr in RAW_NAMES and isinstance(node.value, ast.Name) \
                and node.value.id == "ledger":
            out.append(f"line {node.lineno}: {ast.unparse(node)}")
    return out


def test_only_history_reads_ledger_records():
    sources = porter_sources()
    assert raw_ledger_reads(sources["porter.records.history"]), "the walk sees history's own read"
    found = {m: r for m, t in sources.items()
             if m not in LEDGER_READERS and not _allowed(m, RAW_READERS_ALLOWED) and (r := raw_ledger_reads(t))}
    assert not found, f"ledger records read outside porter.records.history (use History.read / UnitHistory): {found}"


def test_the_ledger_walk_catches_each_way_in():
    for code in ("recs = Ledger(ws).records()\n", "for line, rec in ledger.scan().entries: pass\n",
                 "from porter.records.ledger import scan_bytes\n", "from porter.records import ledger\nledger.scan_bytes(b'', None)\n",
                 "entries = Ledger(ws, key).scan(data).entries\n"):
        assert raw_ledger_reads(ast.parse(code)), code
    for code in ("from porter.records.history import History\nHistory.read(ws, t).unit(u).attempts\n",
                 "Ledger(ws).verify().records\n", "ledger.append('gate', ok=True)\n",
                 "from porter.target.scan import scan\nscan.scan(target)\n", "result = scan(target)\n"):
        assert not raw_ledger_reads(ast.parse(code)), code


# ---- the failure-mode table names tests that exist --------------------------------------------

DESIGN = REPO / "docs" / "DESIGN.md"


def named_tests(text: str) -> set[tuple[str, str]]:
    """(file, test function) for each `test_x.py::test_y[id]` in `text` (ids dropped)."""
    import re

    return {(m[0], m[1]) for m in re.findall(r"`(test_\w+\.py)::(test_\w+)(?:\[[^\]`]*\])?`", text)}


def missing_tests(named: set[tuple[str, str]]) -> list[str]:
    out = []
    for file, name in sorted(named):
        path = REPO / "tests" / file
        defined = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)} \
            if path.is_file() else set()
        if name not in defined:
            out.append(f"{file}::{name}")
    return out


def test_each_failure_mode_names_tests_that_exist():
    text = DESIGN.read_text()
    table = text[text.index("## Failure modes we exist to prevent"):text.index("## Vocabulary")]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| ---")][1:]
    assert len(rows) >= 13, "seven failures of the port and six reward hacks"
    assert all("`test_" in row for row in rows if not row.startswith("| reward hack")), "a row covered by no test"
    named = named_tests(table)
    assert not missing_tests(named), missing_tests(named)


def test_a_renamed_test_is_caught():
    assert missing_tests({("test_architecture.py", "test_no_such_test"), ("test_no_such_file.py", "test_x")}) == [
        "test_architecture.py::test_no_such_test", "test_no_such_file.py::test_x"]
    assert named_tests("`test_a.py::test_b[x-Y]`, `test_c.py::test_d`") == {("test_a.py", "test_b"), ("test_c.py", "test_d")}


# ---- gate names mean something in the registry only -------------------------------------------

# porter.gates.registry declares every gate (its role, what it needs and makes, whether it counts toward
# verified); every other module asks it.  A gate's own module (the module the registry names, what is
# under it, and a package named for the gate, e.g. porter.gates.e2e) may name gates: it is the gate.
REGISTRY_MODULE = "porter.gates.registry"
# (module, gate name) still written out elsewhere, each with why:
GATE_NAMES_ALLOWED = {
    # not a gate's meaning: the same word as a name of something else
    ("porter.cli", "e2e"): "the `porter e2e` command's name",
    ("porter.workspace", "build"): "a folder name (build outputs are not copied into a new workspace)",
    ("porter.calibration.trace", "parity"): "runs/parity, the folder the parity gate's runs are kept in",
    ("porter.calibration.command", "static"): "the --no-static option's dest",
    ("porter.calibration.perf_table", "perf"): "a column of the perf table and its rows' key",
    ("porter.spec", "parity"): "targets/<t>/parity/, the folder a target's specs live in",
    ("porter.commands.status", "throughput"): "status --json's key for the engine's tokens/s lines",
    # a benchmark that times the chain stage by stage: its stages' names are its table's labels
    ("porter.bench.parity", "extract"): "the parity bench's stage label",
    ("porter.bench.parity", "static"): "the parity bench's stage label",
    ("porter.bench.parity", "build"): "the parity bench's stage label",
    ("porter.bench.parity", "parity"): "the parity bench's stage label",
}


def gate_modules() -> dict[str, str]:
    """{module prefix: gate name} of each registered gate's own modules."""
    from porter.gates import registry

    out = {}
    for g in registry.ACTIVE:
        if isinstance(g.module, str):
            out[g.module] = g.name
            package = g.module.rpartition(".")[0]
            if package.rpartition(".")[2] == g.name:
                out[package] = g.name
    return out


def gate_name_uses(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each string literal in `tree` that is a gate's name, wherever it stands (compared
    with, indexed by, looked up, listed, mapped, passed, a default): only docstrings and other bare string
    statements are left out (text, not meaning; an f-string's pieces never equal a bare name)."""
    prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return sorted((n.lineno, n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names and id(n) not in prose)


def test_gate_names_mean_something_in_the_registry_only():
    from porter.gates import registry

    names, own, sources = set(registry.names()), gate_modules(), porter_sources()
    assert gate_name_uses(sources[REGISTRY_MODULE], names), "the walk sees the registry's own names"
    found = {}
    for m, tree in sources.items():
        if m == REGISTRY_MODULE or _allowed(m, own):
            continue
        uses = [f"line {line}: {name!r}" for line, name in gate_name_uses(tree, names) if (m, name) not in GATE_NAMES_ALLOWED]
        if uses:
            found[m] = uses
    assert not found, ("a gate named outside porter.gates.registry (ask the registry by role, judges or flag, "
                       f"e.g. registry.names(registry.UNIT, role=registry.SPEED), registry.proof_of(state)): {found}")
    stale = {(m, name) for m, name in GATE_NAMES_ALLOWED if m not in sources or not gate_name_uses(sources[m], {name})}
    assert not stale, f"allowed uses no longer there (drop them from GATE_NAMES_ALLOWED): {sorted(stale)}"


def test_the_gate_name_walk_catches_each_way_in():
    names = {"parity", "build", "lint"}
    for code in ('if res.gate == "parity": pass\n', 'x = "build" in names\n', 'r = ctx.results["parity"]\n',
                 'r = ctx.results.get("parity")\n', 'GATES = ("static", "build")\n', 'M = {"verified": "parity"}\n',
                 'run_gates(c, ctx, gates=("build",))\n', 'def f(gate="parity"): pass\n',
                 'ok = g.gate != "lint"\n'):
        assert gate_name_uses(ast.parse(code), names), code
    for code in ('"""Runs parity after build."""\n', 'def f():\n    """parity"""\n', 'x = f"{g} build"\n',
                 'print("parity skipped: no GPU")\n', 'x = registry.names(registry.UNIT, role=registry.SPEED)\n',
                 '# "parity" in a comment\nx = 1\n'):
        assert not gate_name_uses(ast.parse(code), names), code
    own = gate_modules()
    assert _allowed("porter.gates.parity.gate", own) and _allowed("porter.gates.e2e.state", own)
    assert not _allowed("porter.gates.driver", own) and not _allowed("porter.commands.status", own)
