"""A spec's identity: the sha256 its calibration records and perf baselines are keyed on.

A verdict depends on more than the spec file: the helper modules it loads with
spec.sibling() (inputs, shapes, tolerances kept per family), the CPU reference
modules whose numbers it compares with, the target's harness settings, and the
harness code that turns outputs into a verdict (compare: metrics, tolerances;
weights: the synthetic tensors a "model:" shape reads).  The identity hashes all
of them, so an edit to any leaves every dependent spec uncalibrated (and its
perf baseline unused) until it is measured again.

Dependencies are read from the source (ast), and module files are found on the
import path without importing anything, so a reviewer's `porter report` computes
the same identity without running workspace code: a helper is named by a
literal `sibling(__file__, "_name")`, a reference module by an import of the
reference package or by the spec's literal `reference="..."`; each found file is
read for its own dependencies in turn.  A sibling() name or a `reference=` that
is not a literal cannot be followed, so the spec is refused rather than given an
identity that misses a file.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

from porter.errors import PorterError

REFERENCE_PACKAGE = "reference"  # the CPU references' package (DESIGN: reference/), beside porter
# harness code whose change moves a verdict without any spec changing
VERDICT_MODULES = ("porter.gates.parity.compare", "porter.spec.weights")
SPEC_KINDS = ("UnitSpec", "Scenario")  # the calls whose reference= names the spec's reference
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
    """(sibling helper names, reference module names) a source file names (its `reference=`
    keyword's module among them)."""
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
            called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            for kw in node.keywords if called in SPEC_KINDS else ():
                if kw.arg == "reference":
                    if not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)):
                        raise IdentityError(f"{path.name} line {node.lineno}: reference= takes a string literal "
                                            "(the spec's identity must name the reference module it calls)")
                    modules += _reference_modules(kw.value.value)
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
    """The file `import name` would load from the import path (None: not a module, e.g. a
    function's name), found without importing it or its packages."""
    top, *rest = name.split(".")
    try:
        found = importlib.util.find_spec(top)  # a top-level name: found on sys.path, nothing executed
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    if not rest:
        return Path(found.origin).resolve() if found.has_location and found.origin else None
    dirs = list(found.submodule_search_locations or [])
    for i, part in enumerate(rest):
        last = i == len(rest) - 1
        hit = None
        for d in dirs:
            pkg, mod = Path(d) / part, Path(d) / f"{part}.py"
            if (pkg / "__init__.py").is_file():
                hit = pkg / "__init__.py"
                dirs = [str(pkg)]
                break
            if last and mod.is_file():
                hit = mod
                break
        if hit is None:
            return None
    return hit.resolve()


def _reference_modules(dotted: str) -> list[str]:
    """The module part of a spec's `reference` ("reference.ds4_ops.rms_norm" -> reference.ds4_ops)."""
    parts = dotted.split(".")
    if not parts or parts[0] != REFERENCE_PACKAGE:
        return []  # a scenario's "scenario:<unit>": its checks live in its own file
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def components(spec_path: Path, reference: str = "") -> dict[str, str]:
    """{label: sha256} of every file the spec's verdict depends on.  Labels name the role and
    the file (spec:, helper:, reference:, harness:), not where the workspace lies, so a copy
    of the workspace has the same identity.  `reference`: the loaded spec's, which must be
    one its source names literally (the report, which loads nothing, reads it from there)."""
    spec_path = Path(spec_path).resolve()
    out: dict[str, str] = {f"spec:{spec_path.name}": file_sha(spec_path)}
    todo: list[Path] = [spec_path]
    seen: set[Path] = {spec_path}
    pending_modules: list[str] = []
    named = set(_scan(_stat_key(spec_path))[1])
    if reference and _reference_modules(reference) and not set(_reference_modules(reference)) <= named:
        raise IdentityError(f"{spec_path.name}: reference {reference!r} is not written as reference=\"...\" "
                            "in the spec's source")
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
