"""A spec's identity: the sha256 its calibration records and perf baselines are keyed on.

A verdict depends on more than the spec file: the helper modules it loads with
spec.sibling() (inputs, shapes, tolerances kept per family), the CPU reference
modules whose numbers it compares with, the target's harness settings, and the
harness code that turns outputs into a verdict (compare: metrics, tolerances;
weights: the synthetic tensors a "model:" shape reads).  The identity hashes all
of them, so an edit to any leaves every dependent spec uncalibrated (and its
perf baseline unused) until it is measured again.

Dependencies are read from the source (ast), not from what happens to be
imported: a helper is named by a literal `sibling(__file__, "_name")`, a
reference module by an import of the reference package; each found file is
read for its own dependencies in turn.  A sibling() whose name is not a literal
cannot be followed, so the spec is refused rather than given an identity that
misses a file.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from functools import lru_cache
from pathlib import Path

from porter.errors import PorterError

REFERENCE_PACKAGE = "reference"  # the CPU references' package (DESIGN: reference/), beside porter
# harness code whose change moves a verdict without any spec changing
VERDICT_MODULES = ("porter.gates.parity.compare", "porter.gates.parity.weights")
HARNESS_SETTINGS = "harness.toml"  # the target's parity settings, beside its specs


class IdentityError(PorterError):
    """A spec's dependencies cannot all be followed (its identity would miss a file)."""


def _stat_key(path: Path) -> tuple:
    st = path.stat()
    return (str(path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=512)
def _file_sha(key: tuple) -> str:
    return hashlib.sha256(Path(key[0]).read_bytes()).hexdigest()


def file_sha(path: Path) -> str:
    return _file_sha(_stat_key(path))


@lru_cache(maxsize=512)
def _scan(key: tuple) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(sibling helper names, reference module names) a source file names."""
    path = Path(key[0])
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError as exc:
        raise IdentityError(f"{path.name} does not parse: {exc}") from None
    helpers, modules = [], []
    in_reference = path.parent.name == REFERENCE_PACKAGE
    loaders = {"sibling"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                             for a in n.names if a.name == "sibling" and a.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in loaders:
                if len(node.args) < 2 or not (isinstance(node.args[1], ast.Constant)
                                              and isinstance(node.args[1].value, str)):
                    raise IdentityError(f"{path.name} line {node.lineno}: sibling() takes the helper's name as a "
                                        "string literal (the spec's identity must name every file it loads)")
                helpers.append(node.args[1].value)
        elif isinstance(node, ast.Import):
            modules += [a.name for a in node.names if a.name.split(".")[0] == REFERENCE_PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level and in_reference:  # `from . import quant` inside the reference package
                mod = REFERENCE_PACKAGE + (f".{mod}" if mod else "")
            if mod.split(".")[0] != REFERENCE_PACKAGE:
                continue
            modules.append(mod)
            modules += [f"{mod}.{a.name}" for a in node.names if a.name != "*"]
    return tuple(helpers), tuple(modules)


def _module_file(name: str) -> Path | None:
    """The file a module name imports from here (None: not a module, e.g. a function's name)."""
    mod = sys.modules.get(name)
    origin = getattr(mod, "__file__", None) if mod is not None else None
    if origin is None:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        origin = found.origin if found is not None and found.has_location else None
    return Path(origin).resolve() if origin else None


def _reference_modules(dotted: str) -> list[str]:
    """The module part of a spec's `reference` ("reference.ds4_ops.rms_norm" -> reference.ds4_ops)."""
    parts = dotted.split(".")
    if not parts or parts[0] != REFERENCE_PACKAGE:
        return []  # a scenario's "scenario:<unit>": its checks live in its own file
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def components(spec_path: Path, reference: str = "") -> dict[str, str]:
    """{label: sha256} of every file the spec's verdict depends on.  Labels name the role and
    the file (spec:, helper:, reference:, harness:), not where the workspace lies, so a copy
    of the workspace has the same identity."""
    spec_path = Path(spec_path).resolve()
    out: dict[str, str] = {f"spec:{spec_path.name}": file_sha(spec_path)}
    todo: list[Path] = [spec_path]
    seen: set[Path] = {spec_path}
    pending_modules = list(_reference_modules(reference))
    while todo or pending_modules:
        while todo:
            path = todo.pop()
            helpers, modules = _scan(_stat_key(path))
            for h in helpers:
                hp = (spec_path.parent / f"{h}.py").resolve()
                if not hp.is_file():
                    raise IdentityError(f"{path.name}: sibling helper {h}.py does not exist beside the specs")
                if hp not in seen:
                    seen.add(hp)
                    out[f"helper:{hp.name}"] = file_sha(hp)
                    todo.append(hp)
            pending_modules += modules
        while pending_modules:
            name = pending_modules.pop()
            mp = _module_file(name)
            if mp is None or mp in seen:
                continue
            seen.add(mp)
            out[f"reference:{name}"] = file_sha(mp)
            todo.append(mp)
    settings = spec_path.parent / HARNESS_SETTINGS
    if settings.is_file():
        out[f"harness:{HARNESS_SETTINGS}"] = file_sha(settings)
    for name in VERDICT_MODULES:
        mp = _module_file(name)
        if mp is not None:
            out[f"harness:{name}"] = file_sha(mp)
    return dict(sorted(out.items()))


def pin(spec) -> None:
    """Fix a loaded spec's components as they were when its module (and its helpers) ran: a file
    edited later changes the identity of the spec loaded next, not of this one (whose inputs
    come from the code that ran)."""
    spec._identity_pinned = (spec.path, components(spec.path, spec.reference) if spec.path else {})


def of(spec) -> dict[str, str]:
    """A spec's components: pinned at load, else read now (a spec built by hand in a test)."""
    pinned = getattr(spec, "_identity_pinned", None)
    if pinned is not None and pinned[0] == spec.path:
        return pinned[1]
    return components(spec.path, spec.reference) if spec.path else {}


def digest(parts: dict[str, str]) -> str:
    """The sha256 over components: "" for a spec that has no file (built in a test)."""
    if not parts:
        return ""
    return hashlib.sha256("".join(f"{label} {sha}\n" for label, sha in parts.items()).encode()).hexdigest()
