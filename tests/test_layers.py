"""porter's packages are layers, and every import points down (or stays in its layer): the package layout
is the map of what may depend on what (docs/DESIGN.md, "The package map")."""

from __future__ import annotations

from pathlib import Path

from test_pipeline import REPO, imports_of, porter_modules

# low to high: a module imports its own layer's modules and those below, never one above
LAYERS: list[tuple[str, set[str]]] = [
    # leaves every layer may read: errors, hashing, terminal output, diagnostics trimming, and the gate
    # registry (it names modules and imports none of them)
    ("base", {"porter", "porter.errors", "porter.digest", "porter.term", "porter.diagnostics", "porter.tomlfile",
              "porter.gates.registry"}),
    ("host", {"porter.host"}),  # the machine: sandbox, cgroups, toolchain, GPU architecture, locks
    ("records", {"porter.records", "porter.target"}),  # the ledger and its history; the target's definition
    ("spec", {"porter.spec"}),  # the language a target's parity specs are written in
    ("gates", {"porter.gates"}),  # the verdicts, and the machinery that reaches them
    ("top", {"porter.calibration", "porter.commands", "porter.run", "porter.optimize", "porter.report",
             "porter.prompt", "porter.providers", "porter.bench", "porter.cli", "porter.workspace",
             "porter.__main__"}),
]
TOP_LEVEL_MAX = 12  # modules directly in porter/ (packages aside)


def layer_of(module: str) -> int:
    best, rank = -1, None
    for i, (_name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank is not None, f"{module} is in no layer: add its package to LAYERS"
    return rank


def upward_imports(modules: dict[str, Path]) -> list[str]:
    names = set(modules)
    out = []
    for m, p in sorted(modules.items()):
        for d in sorted(imports_of(p, names) - {m}):
            if layer_of(d) > layer_of(m):
                out.append(f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})")
    return out


def test_every_import_points_down_a_layer_or_stays_in_its_own():
    mods = porter_modules()
    assert {"porter.gates.build", "porter.records.ledger", "porter.spec"} <= set(mods)  # the walk sees the tree
    bad = upward_imports(mods)
    assert not bad, "imports running back up a layer:\n" + "\n".join(bad)


def test_the_layer_walk_catches_an_upward_import(tmp_path):
    """A gate importing calibration, even inside a function (how they once hid), and a record importing a gate."""
    gate = tmp_path / "g.py"
    gate.write_text("def f():\n    from porter.calibration import mutants\n")
    record = tmp_path / "r.py"
    record.write_text("from porter.gates import build\n")
    mods = {"porter.gates.g": gate, "porter.records.r": record, "porter.calibration.mutants": tmp_path / "m.py",
            "porter.gates.build": tmp_path / "b.py"}
    for p in (tmp_path / "m.py", tmp_path / "b.py"):
        p.write_text("")
    assert upward_imports(mods) == [
        "porter.gates.g (gates) imports porter.calibration.mutants (top)",
        "porter.records.r (records) imports porter.gates.build (gates)"]


def test_the_top_of_porter_is_a_dozen_modules_at_most():
    top = sorted(p.name for p in (REPO / "porter").glob("*.py"))
    assert len(top) <= TOP_LEVEL_MAX, top
    for d in (REPO / "porter").iterdir():
        if d.is_dir() and d.name != "__pycache__":
            assert (d / "__init__.py").is_file(), f"porter/{d.name} is a folder without a package docstring"
