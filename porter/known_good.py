"""Known-good and mutated backend libraries built from a target's source checkout.

Calibration (DESIGN.md) needs a known-good implementation of every parity spec
and code that is known to be wrong.  For ds4 the known-good code is the
upstream CUDA backend in the user's checkout (ds4_cuda.cu, never copied into
this repository); the wrong code is that same source with one named textual
mutation applied at build time (targets/<t>/mutants.toml).

    python -m porter.known_good --target ds4 --source DIR                # build runs/known-good/ds4/upstream/...
    python -m porter.known_good --target ds4 --calibrate --all-mutants   # build all, run every spec and mutant

`build_library` writes libraries under runs/known-good/<target>/<name>/<key>/
(content-addressed by source, flags and compiler, so a rebuild costs nothing);
the printed path can be given to `porter calibrate --known-good PATH.so`.
`--calibrate` is the mutant-aware driver: every spec must pass against the
upstream library, and every mutant must fail its unit's spec by the check its
manifest names.  Exit 0 when all of that held, 1 when not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from porter.errors import PorterError
from porter.gates.parity.compare import first_check

MUTANTS_FILE = "mutants.toml"
BUILD_TIMEOUT_S = 900


class BuildError(PorterError):
    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


# ---------------------------------------------------------------------------
# What to build, per target
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Recipe:
    """How a target's upstream backend becomes one shared library."""

    sources: tuple[str, ...]  # checkout-relative translation units
    needs: tuple[str, ...]  # other checkout files they include
    harness: tuple[str, ...]  # target-folder-relative sources of ours linked in (calibration hooks)
    libs: tuple[str, ...]  # extra link libraries
    library: str


RECIPES = {
    # ds4_cuda.cu is one translation unit; it includes ds4_iq2_tables_cuda.inc
    # (the IQ2 grids) and ds4_gpu.h's declarations, and needs cuBLAS.
    "ds4": Recipe(sources=("ds4_cuda.cu",), needs=("ds4_iq2_tables_cuda.inc", "ds4_gpu.h"),
                  harness=("parity/upstream_harness.cu",), libs=("-lcublas",), library="libds4_cuda.so"),
}


def recipe_for(target) -> Recipe:
    try:
        return RECIPES[target.name]
    except KeyError:
        raise PorterError(f"no upstream build recipe for target {target.name} (known: {', '.join(RECIPES)})") from None


# ---------------------------------------------------------------------------
# Mutations
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    search: str
    replace: str


@dataclass(frozen=True)
class Mutation:
    name: str
    unit: str
    file: str
    must_fail_check: str
    why: str
    rules: tuple[Rule, ...] = field(default_factory=tuple)


def load_mutations(target) -> list[Mutation]:
    """targets/<t>/mutants.toml, validated (names unique, checks known, rules non-empty)."""
    path = target.dir / MUTANTS_FILE
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise PorterError(f"{path}: not valid TOML: {exc}") from None
    from porter.gates.parity.compare import CHECK_ORDER

    out, seen = [], set()
    for i, m in enumerate(data.get("mutant", [])):
        where = f"{path.name}: mutant #{i + 1}"
        for k in ("name", "unit", "file", "must_fail_check", "why", "rule"):
            if k not in m:
                raise PorterError(f"{where} lacks {k!r}")
        if m["name"] in seen:
            raise PorterError(f"{where}: duplicate name {m['name']!r}")
        seen.add(m["name"])
        if m["must_fail_check"] not in CHECK_ORDER:
            raise PorterError(f"{where}: unknown check {m['must_fail_check']!r}")
        rules = []
        for j, r in enumerate(m["rule"]):
            if not isinstance(r.get("search"), str) or not r["search"] or not isinstance(r.get("replace"), str):
                raise PorterError(f"{where} rule {j + 1}: needs a non-empty 'search' and a 'replace' string")
            if r["search"] == r["replace"]:
                raise PorterError(f"{where} rule {j + 1}: replace equals search (no mutation)")
            rules.append(Rule(r["search"], r["replace"]))
        if not rules:
            raise PorterError(f"{where}: no rules")
        out.append(Mutation(m["name"], m["unit"], m["file"], m["must_fail_check"], m["why"], tuple(rules)))
    return out


def apply_mutation(text: str, mutation: Mutation) -> str:
    """Apply every rule; each search text must occur exactly once in the text it is applied to."""
    for j, rule in enumerate(mutation.rules):
        n = text.count(rule.search)
        if n != 1:
            first = rule.search.strip().splitlines()[0][:60] if rule.search.strip() else repr(rule.search)
            raise PorterError(f"mutant {mutation.name} rule {j + 1}: search text ({first!r}...) occurs {n} times "
                              f"in {mutation.file}, must occur exactly once")
        text = text.replace(rule.search, rule.replace, 1)
    return text


# ---------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------

def default_out_dir(target) -> Path:
    return Path(target.workspace) / "runs" / "known-good" / target.name


def _nvcc() -> str:
    exe = shutil.which("nvcc")
    if not exe:
        raise PorterError("nvcc is not on PATH: cannot build the upstream backend")
    return exe


def _nvcc_version(nvcc: str) -> str:
    try:
        return subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _toolkit_lib_dirs(nvcc: str) -> list[Path]:
    root = Path(nvcc).resolve().parent.parent
    return [d for d in (root / "lib64", root / "targets" / "x86_64-linux" / "lib") if d.is_dir()]


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if " error" in line or line.startswith("error") or "fatal" in line:
            return line.strip()[:300]
    lines = [ln for ln in log.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "no output")[:300]


def build_library(target, mutation: Mutation | None = None, out_dir: Path | None = None) -> Path:
    """Build the upstream backend (optionally mutated) with our calibration hooks; returns the .so path."""
    recipe = recipe_for(target)
    checkout = Path(target.checkout)
    missing = [f for f in (*recipe.sources, *recipe.needs) if not (checkout / f).is_file()]
    if missing:
        raise PorterError(f"source checkout {checkout} lacks {', '.join(missing)}")
    harness = [target.dir / h for h in recipe.harness]
    for h in harness:
        if not h.is_file():
            raise PorterError(f"calibration hook source {h} is missing")
    sources = {f: (checkout / f).read_text() for f in recipe.sources}
    if mutation is not None:
        if mutation.file not in sources:
            raise PorterError(f"mutant {mutation.name}: {mutation.file} is not one of {', '.join(sources)}")
        sources[mutation.file] = apply_mutation(sources[mutation.file], mutation)
    nvcc = _nvcc()
    flags = [*target.spec.cuda.nvcc_flags, "-shared"]
    h = hashlib.sha256()
    for part in [_nvcc_version(nvcc), " ".join(flags), " ".join(recipe.libs)]:
        h.update(part.encode() + b"\0")
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + sources[name].encode() + b"\0")
    for f in (*recipe.needs, *recipe.harness):
        p = checkout / f if f in recipe.needs else target.dir / f
        h.update(f.encode() + b"\0" + p.read_bytes() + b"\0")
    key = h.hexdigest()[:16]
    name = mutation.name if mutation else "upstream"
    lib_dir = Path(out_dir or default_out_dir(target)) / name / key
    lib = lib_dir / recipe.library
    if lib.is_file():
        return lib
    lib_dir.mkdir(parents=True, exist_ok=True)
    src_paths = []
    for f, text in sources.items():
        if mutation is not None and f == mutation.file:
            p = lib_dir / "src" / f  # the mutated copy; its includes resolve through -I <checkout>
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            src_paths.append(p)
        else:
            src_paths.append(checkout / f)
    tmp = lib_dir / f".{os.getpid()}.{time.monotonic_ns()}.so"
    # the toolkit's library folder as rpath: the parity child dlopens the library, and
    # libcublas must resolve there even when the loader's path does not name the toolkit
    rpath = [a for d in _toolkit_lib_dirs(nvcc) for a in ("-Xlinker", "-rpath", "-Xlinker", str(d))]
    cmd = [nvcc, *flags, "-I", str(checkout), "-o", str(tmp), *map(str, src_paths), *map(str, harness), *rpath,
           *recipe.libs]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"nvcc of {name} ran past {BUILD_TIMEOUT_S} s") from None
    log = proc.stdout + proc.stderr
    (lib_dir / "build.log").write_text(" ".join(cmd) + "\n" + log)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"nvcc failed building {name}: {_first_error(log)}", log)
    os.replace(tmp, lib)
    return lib


# ---------------------------------------------------------------------------
# Calibration with mutants
# ---------------------------------------------------------------------------

def _row(unit, kind, name, expect, res, ok, seconds) -> dict:
    ev = res.evidence or {}
    return {"unit": unit, "kind": kind, "name": name, "expect": expect, "got": first_check(res), "ok": bool(ok),
            "summary": res.summary, "seconds": round(seconds, 2),
            "failed_checks": (res.metrics or {}).get("failed_checks", []),
            "worst_nmse": (res.metrics or {}).get("worst_nmse"),
            "gbps": (res.metrics or {}).get("gbps"), "timing": ev.get("timing"),
            "cases": [{"label": c.get("label"), "passes": [p.get("metrics") for p in c.get("passes", [])]}
                      for c in ev.get("cases", [])],
            "failures": ev.get("failures", [])[:10], "diagnostics": (res.diagnostics or "")[-3000:]}


def calibrate(target, args, out=print) -> dict:
    from porter.gates.parity.gate import run_spec
    from porter.gates.parity.spec import load_specs

    specs = load_specs(target)
    units = args.unit or sorted(specs)
    unknown = [u for u in units if u not in specs]
    if unknown:
        raise PorterError(f"no parity spec for {', '.join(unknown)}")
    mutations = load_mutations(target)
    if args.mutant:
        names = {m.name for m in mutations}
        bad = [n for n in args.mutant if n not in names]
        if bad:
            raise PorterError(f"no mutant named {', '.join(bad)} in {target.name}/{MUTANTS_FILE}")
        mutations = [m for m in mutations if m.name in args.mutant]
    elif not args.all_mutants:
        mutations = []
    mutations = [m for m in mutations if m.unit in units]
    out_dir = Path(args.out_dir) if args.out_dir else None

    t0 = time.monotonic()
    prebuilt = getattr(args, "library", None)
    jobs = ([] if prebuilt else [None]) + list(mutations)
    built: dict[str, Path | Exception] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs) or 1, os.cpu_count() or 1))) as pool:
        for m, r in zip(jobs, pool.map(lambda m: _try_build(target, m, out_dir), jobs)):
            built[m.name if m else "upstream"] = r
    good = Path(prebuilt) if prebuilt else built["upstream"]
    if isinstance(good, Exception):
        raise good
    if not Path(good).is_file():
        raise PorterError(f"known-good library {good} does not exist")
    out(f"known-good: {'prebuilt library' if prebuilt else f'upstream {target.name} backend from {target.checkout}'}"
        f" -> {good} "
        f"({time.monotonic() - t0:.1f} s to build {len(jobs)} libraries)")

    rows = []
    records: dict[str, dict] = {}  # per unit, for the ledger's "calibration" records
    kw = {"workspace": Path(args.workspace), "timeout": args.timeout, "mode": args.mode,
          "timing_reps": args.timing_reps}
    for unit in units:
        t1 = time.monotonic()
        res = run_spec(target, specs[unit], good, **kw)
        records[unit] = {"ok": res.ok, "summary": res.summary[:300], "known_good_ok": res.ok, "mutants": 0,
                         "mutants_rejected": 0, "evidence": res.evidence, "spec": specs[unit]}
        rows.append(_row(unit, "known-good", "upstream", "pass", res, res.ok, time.monotonic() - t1))
        out(f"  {'ok ' if res.ok else 'BAD'} {unit}: {res.summary}")
        if not res.ok:
            out("\n".join("      " + ln for ln in (res.diagnostics or "").splitlines()[:40]))
    for m in mutations:
        lib = built[m.name]
        rec = records[m.unit]
        rec["mutants"] += 1
        if isinstance(lib, Exception):
            rec["ok"] = False
            rows.append({"unit": m.unit, "kind": "mutant", "name": m.name, "expect": m.must_fail_check,
                         "got": "build-error", "ok": False, "summary": str(lib), "seconds": 0.0})
            out(f"      BUILD-ERROR {m.name}: {lib}")
            continue
        t2 = time.monotonic()
        res = run_spec(target, specs[m.unit], lib, **kw)
        got = first_check(res)
        ok = got == m.must_fail_check
        rec["mutants_rejected"] += int(ok)
        rec["ok"] = rec["ok"] and ok
        rows.append(_row(m.unit, "mutant", m.name, m.must_fail_check, res, ok, time.monotonic() - t2))
        out(f"      {'ok ' if ok else 'BAD'} mutant {m.name}: want [{m.must_fail_check}], got [{got}]: "
            f"{res.summary[:240]}")
    desc = f"prebuilt library {Path(good).name}" if prebuilt else f"upstream {target.name} backend ({target.checkout})"
    report = {"target": target.name, "known_good": desc,
              "library": str(good), "rows": rows, "seconds": round(time.monotonic() - t0, 1)}
    if getattr(args, "ledger", False):
        record(target, args, records, report)
    return report


def record(target, args, records: dict, report: dict) -> None:
    """One ledger "calibration" record per unit (what `porter calibrate` writes), so the parity
    gate's evidence names these specs as calibrated -- against upstream AND its mutants."""
    from porter.calibrate import _record  # the ledger format is porter calibrate's; reuse it as is

    _record(target, args, records, report["known_good"], Path(report["library"]))


def _try_build(target, m, out_dir):
    try:
        return build_library(target, m, out_dir)
    except PorterError as exc:
        return exc


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m porter.known_good", description=__doc__.split("\n\n")[0])
    p.add_argument("-C", dest="workspace", default=".", help="workspace (default: .)")
    p.add_argument("--target", default="ds4")
    p.add_argument("--source", default=None, help="the target's source checkout (else $PORTER_<T>_SOURCE)")
    p.add_argument("--out-dir", default=None, help="where libraries go (default runs/known-good/<target>)")
    p.add_argument("--mutant", action="append", metavar="NAME", help="also build this mutant (repeatable)")
    p.add_argument("--all-mutants", action="store_true", help="build every mutant of targets/<t>/mutants.toml")
    p.add_argument("--calibrate", action="store_true", help="run every parity spec against the builds")
    p.add_argument("--unit", action="append", metavar="UNIT", help="only this unit's spec (with --calibrate)")
    p.add_argument("--library", metavar="SO", help="with --calibrate: a prebuilt known-good library instead of "
                   "building upstream (mutants are still built from the checkout)")
    p.add_argument("--timeout", type=float, default=120.0, help="time limit per parity child (default 120 s)")
    p.add_argument("--timing-reps", type=int, default=10)
    p.add_argument("--report", metavar="FILE", help="write the calibration report as JSON")
    p.add_argument("--no-ledger", dest="ledger", action="store_false",
                   help="do not append calibration records to the ledger (with --calibrate)")
    p.add_argument("--mode", choices=("cuda", "host"), default="cuda", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.workspace = Path(args.workspace).resolve()
    try:
        from porter.target import load_target

        target = load_target(args.workspace, args.target, args.source)
        if not args.calibrate:
            jobs = [None] + [m for m in load_mutations(target)
                             if args.all_mutants or (args.mutant and m.name in args.mutant)]
            for m in jobs:
                print(build_library(target, m, Path(args.out_dir) if args.out_dir else None))
            return 0
        from porter.gates.parity import available

        ok, why = available()
        if args.mode == "cuda" and not ok:
            raise PorterError(f"calibration needs the parity gate to run: {why}")
        report = calibrate(target, args)
    except PorterError as exc:
        print(f"porter: error: {exc}", file=sys.stderr)
        return exc.exit_code if exc.exit_code is not None else 2
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1, default=str))
    from porter.calibrate import table

    print()
    print(table(report))
    bad = [r for r in report["rows"] if not r["ok"]]
    print(f"\n{len(report['rows']) - len(bad)} of {len(report['rows'])} behaved as they must"
          + (f"; {len(bad)} did not" if bad else "") + f" ({report['seconds']} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
