"""A target's parity specs checked on the CPU, before any GPU or answer is spent on them.

A spec whose build() crashed in numpy, or that binds an argument the API header does not have, used to go
through doctor, plan and run: without a GPU nothing called build(), and on a GPU the broken spec made the
unit "parity skipped", never an error.  This module does, for every spec of the target, what the parity
gate does before its child starts (gate.prepare / scenario.prepare), with two fixed seeds, in this process:

  - the spec file imports and agrees with the header (spec.load rules: outputs, kinds, shapes),
  - each case's build() runs for both seeds, its arguments are bound by the header's parameter names with
    an argument of the right kind (validate_call), both seeds give one layout,
  - each compared output's reference holds as many values as the buffer the unit writes (an Out's shape,
    an InOut's array), of a kind its comparison reads (Exact: integers),
  - a runtime scenario's script builds and binds to the header.

    check(target, units=None) -> Report    every problem as one line naming spec file, case and problem

A spec that passed is remembered by its identity (spec.sha256: its file, the helpers and references it
loads, the harness code) under runs/spec-check/, so a later plan or run checks only what changed.
Callers: `porter doctor --target T` (every problem, one line each), `porter plan` and `porter run`'s
preflight (the first problem, one line, exit 2, before any answer is asked for).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from porter.errors import PorterError
from porter import spec as S

SEEDS = (1, 2)  # fixed: the check is of the spec, and a spec that passed stays passed until it changes
CACHE_DIR = "runs/spec-check"


@dataclass(frozen=True)
class Problem:
    file: str  # the spec file in the workspace ("targets/minimoe/parity/mini_gpu_add_tensor.py")
    case: str  # the case's label, "" when the file as a whole is wrong
    what: str

    def line(self) -> str:
        return f"{self.file}" + (f", case {self.case!r}" if self.case else "") + f": {self.what}"


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    specs: int = 0  # spec files looked at
    cases: int = 0  # cases built now
    cached: int = 0  # specs passed before, unchanged since
    seconds: float = 0.0
    # units the parity gate cannot judge for want of a spec (runtime units need a scenario)
    without_spec: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return (f"{self.specs} parity specs built on the CPU ({self.cases} cases x {len(SEEDS)} seeds"
                + (f"; {self.cached} unchanged since they passed" if self.cached else "") + f", {self.seconds:.1f}s)")


def _rel(target, path: Path) -> str:
    try:
        return str(Path(path).relative_to(target.workspace))
    except ValueError:
        return str(path)


def _case_of(message: str) -> tuple[str, str]:
    """("label", rest) out of gate.prepare's "<unit> shape 'label': ..." / scenario's "<unit> case 'label': ..."."""
    import re

    m = re.match(r"^\S+ (?:shape|case) '((?:[^'\\]|\\.)*)': (.*)$", message)
    return (m.group(1), m.group(2)) if m else ("", message)


def _output_problems(spec: S.UnitSpec, shape: S.Shape, call: S.Call) -> list[str]:
    """Each compared output's reference against the buffer the unit writes."""
    out = []
    if not shape.judges_values:
        return out
    for name, tol in spec.outputs.items():
        arg = call.args.get(name)
        if isinstance(arg, S.Same):
            arg = call.args.get(arg.param)
        if isinstance(arg, S.Out):
            n, dtype = int(np.prod(arg.shape, dtype=np.int64)), arg.dtype
        elif isinstance(arg, (S.InOut, S.In)):
            n, dtype = int(arg.array.size), arg.dtype
        else:
            continue
        ref = np.asarray(call.expect[name])
        if ref.size != n:
            out.append(f"output {name!r}: the reference holds {ref.size} values ({ref.dtype}{list(ref.shape)}), "
                       f"the buffer the unit writes {n} ({dtype})")
        elif isinstance(tol, S.Exact) and not np.issubdtype(ref.dtype, np.integer):
            out.append(f"output {name!r} is compared exactly but its reference is {ref.dtype}, not integers")
        elif isinstance(tol, S.Exact) and dtype != "i32":
            out.append(f"output {name!r} is compared exactly but the unit writes {dtype}")
        elif isinstance(tol, S.Tol) and not np.issubdtype(ref.dtype, np.number):
            out.append(f"output {name!r}: the reference is {ref.dtype}, not numbers")
    return out


def _check_unit_spec(target, spec: S.UnitSpec, rel: str) -> tuple[list[Problem], int]:
    from porter.gates.parity.gate import prepare

    try:
        cases = prepare(spec, target.api_function(spec.unit), S.Context.for_target(target), list(SEEDS))
    except S.SpecError as exc:
        label, what = _case_of(str(exc))
        return [Problem(rel, label, what)], 0
    except Exception as exc:  # noqa: BLE001 - the fixture, the context: still the spec's to fix
        return [Problem(rel, "", f"{type(exc).__name__}: {exc}")], 0
    problems = []
    for c in cases:
        for call in c.calls:
            for what in _output_problems(spec, c.shape, call):
                problems.append(Problem(rel, c.shape.label, what))
                break
    return list(dict.fromkeys(problems)), len(cases)


def _check_scenario(target, sc, rel: str) -> tuple[list[Problem], int]:
    from porter.gates.parity import scenario

    with tempfile.TemporaryDirectory(prefix="porter-spec-check-") as files:
        try:
            runs = scenario.prepare(target, sc, scenario.ScenarioContext(target, Path(files)), list(SEEDS))
        except S.SpecError as exc:
            label, what = _case_of(str(exc))
            return [Problem(rel, label, what)], 0
        except Exception as exc:  # noqa: BLE001
            return [Problem(rel, "", f"{type(exc).__name__}: {exc}")], 0
    return [], len({r.index for r in runs})


def _cache_path(target) -> Path:
    return Path(target.workspace) / CACHE_DIR / f"{target.name}.json"


def _read_cache(target) -> dict[str, str]:
    try:
        data = json.loads(_cache_path(target).read_text())
        return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}
    except (OSError, ValueError, AttributeError):
        return {}


def _write_cache(target, passed: dict[str, str]) -> None:
    path = _cache_path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(passed, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only workspace checks again next time


def check(target, units: list[str] | None = None, *, cache: bool = True, progress=None) -> Report:
    """Every parity spec of `target` (or those of `units`) checked on the CPU; see the module docstring.
    progress(text): told once before a check that builds cases (it can take minutes for a large target)."""
    t0 = time.monotonic()
    rep = Report()
    d = S.spec_dir(target)
    files = sorted(p for p in d.glob("*.py") if not p.name.startswith("_")) if d.is_dir() else []
    loaded: list[tuple[object, str]] = []
    seen: dict[str, str] = {}
    for path in files:
        rel = _rel(target, path)
        try:
            mod = S._load_module(path, target.name)
            specs = getattr(mod, "SPECS", None) or ([mod.SPEC] if hasattr(mod, "SPEC") else []) \
                or ([mod.SCENARIO] if hasattr(mod, "SCENARIO") else [])
            if not specs:
                raise S.SpecError("defines no SPEC or SCENARIO")
            for s in specs:
                S._validate_any(s, path, target)
                if s.unit in seen:
                    raise S.SpecError(f"a second spec for {s.unit} (the first is {seen[s.unit]})")
                seen[s.unit] = rel
                loaded.append((s, rel))
        except PorterError as exc:  # SpecError, and an unknown unit from the header
            msg = str(exc)
            for prefix in (f"parity spec {path.name}: ", f"parity spec {path.name} "):
                msg = msg[len(prefix):] if msg.startswith(prefix) else msg
            rep.problems.append(Problem(rel, "", msg))
    if units is not None:
        loaded = [(s, rel) for s, rel in loaded if s.unit in set(units)]
    rep.specs = len(loaded) + len({p.file for p in rep.problems})
    rep.without_spec = [u for u in target.units if u not in seen and (units is None or u in units)]
    passed = _read_cache(target) if cache else {}
    todo = []
    for s, rel in loaded:
        if passed.get(s.unit) == s.sha256:
            rep.cached += 1
        else:
            todo.append((s, rel))
    if todo and progress is not None:
        progress(f"checking {len(todo)} parity spec(s) of {target.name} on the CPU (each once per version of it)")

    def one(item):
        s, rel = item
        return (_check_unit_spec if isinstance(s, S.UnitSpec) else _check_scenario)(target, s, rel)

    workers = max(1, min(len(todo), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spec-check") as pool:
        results = list(pool.map(one, todo))
    for (s, _rel_), (problems, n) in zip(todo, results):
        rep.cases += n
        if problems:
            rep.problems += problems
            passed.pop(s.unit, None)
        else:
            passed[s.unit] = s.sha256
    if cache and todo:
        _write_cache(target, passed)
    rep.seconds = time.monotonic() - t0
    return rep


def require(target, units: list[str] | None = None, *, quiet: bool = False) -> Report:
    """check(); a one-line PorterError (exit 2) naming the first broken spec, its case and its problem."""
    # progress for a person at a terminal; a log or a caller parsing stderr gets only the error line
    say = None if quiet or not sys.stderr.isatty() else (lambda text: print(f"porter: {text}", file=sys.stderr,
                                                                            flush=True))
    rep = check(target, units, progress=say)
    if rep.problems:
        more = len(rep.problems) - 1
        raise PorterError(f"broken parity spec {rep.problems[0].line()}"
                          + (f" ({more} more: `porter doctor --target {target.name}` lists them)" if more else
                             " (`porter doctor` checks every spec on the CPU)"))
    return rep
