"""No target's name in porter/'s code: a new target adds files under targets/<t>/ and edits nothing in porter/.

Identifiers and string literals count; comments and docstrings (which may cite a measurement on a
target) do not, and neither do porter/cli.py's help texts and examples (help=, epilog=, description=,
EPILOG).  Target names: the folders under targets/ and the test targets under tests/data/.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP_KEYWORDS = {"help", "epilog", "description", "usage"}


def target_names() -> set[str]:
    names = {p.parent.name for p in (ROOT / "targets").glob("*/target.toml")}
    names |= {tomllib.loads(p.read_text())["name"] for p in (ROOT / "tests" / "data").rglob("target.toml")}
    return names


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _help_texts(tree: ast.AST) -> set[int]:
    """ids of the constants inside help=/epilog=/... arguments and EPILOG-named assignments (cli.py only)."""
    roots = [kw.value for node in ast.walk(tree) if isinstance(node, ast.Call)
             for kw in node.keywords if kw.arg in HELP_KEYWORDS]
    roots += [node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id.endswith("EPILOG") for t in node.targets)]
    return {id(n) for r in roots for n in ast.walk(r)}


def _words(tree: ast.AST, skip: set[int]):
    """(line, kind, text) of every identifier and string literal outside `skip`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, "string", node.value
        elif isinstance(node, ast.Name):
            yield node.lineno, "identifier", node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, "identifier", node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.lineno, "identifier", node.name
        elif isinstance(node, ast.arg):
            yield node.lineno, "identifier", node.arg
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.value.lineno, "identifier", node.arg
        elif isinstance(node, ast.alias):
            yield getattr(node, "lineno", 0), "identifier", node.asname or node.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, "identifier", node.module


def target_names_in(path: Path, names: set[str], rel: str) -> list[str]:
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree) | (_help_texts(tree) if rel == "porter/cli.py" else set())
    return [f"{rel}:{line}: {kind} {text[:60]!r} names {n}" for line, kind, text in _words(tree, skip)
            for n in names if n.lower() in text.lower()]


def offences(root: Path, names: set[str]) -> list[str]:
    return [o for p in sorted((root / "porter").rglob("*.py"))
            for o in target_names_in(p, names, p.relative_to(root).as_posix())]


def test_no_target_name_in_porters_code():
    names = target_names()
    assert {"ds4", "minimoe"} <= names and len(names) >= 3, names  # the bundled targets and a test target
    found = offences(ROOT, names)
    assert not found, "a target's name in porter/ (move the code to targets/<t>/ or a target.toml field):\n" \
        + "\n".join(found)


def test_the_walk_finds_names_in_identifiers_and_strings_but_not_docstrings_or_cli_help(tmp_path):
    pkg = tmp_path / "porter"
    pkg.mkdir()
    (pkg / "mod.py").write_text(
        '"""Measured on an H100 with the widget target."""\n'
        "# the widget target's comment\n"
        "def run_widget(x):\n"
        '    """widget: a docstring"""\n'
        '    return x.widget_path or f"{x}/widget.gguf"\n')
    (pkg / "cli.py").write_text(
        'EPILOG = "porter init --target widget"\n'
        'p.add_argument("--target", default="widget", help="e.g. widget")\n')
    found = offences(tmp_path, {"widget"})
    assert sorted(f.split(": ")[1].split(" ")[0] + " " + f.split(":")[0] for f in found) == [
        "identifier porter/mod.py", "identifier porter/mod.py", "string porter/cli.py", "string porter/mod.py"], found
