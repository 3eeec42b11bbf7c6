"""`porter calibrate`: does every parity spec accept known-good code and reject mutants?

    porter calibrate --target minimoe                      # known-good = the scripted good answers
    porter calibrate --target minimoe --known-good DIR     # DIR/<unit>.cu or DIR/<unit>.md
    porter calibrate --target ds4 --known-good libds4.so   # a prebuilt library (no mutants then)
    porter calibrate --target ds4 --known-good upstream    # built from the checkout (mutants: python -m porter.known_good)

For each spec of the target:
  1. the known-good library must PASS it (else the spec is broken: it rejects
     correct code, and a unit could never be verified against it);
  2. every adversarial mutant of that unit (targets/<t>/adversarial/manifest.toml)
     must FAIL it, and by the check the manifest names (the summary's first
     check): a mutant caught by the wrong check means the intended check is
     blind to what it exists for;
  3. scripted bad answers whose manifest expects "parity" must fail it, and
     those expecting "perf" (right numbers, slow) must pass it.
A spec with no known-good implementation, or never run this way, is reported
"uncalibrated".  Each spec's outcome is appended to the ledger as a
"calibration" record (spec sha256, known-good sha256, mutants rejected), which
the parity gate quotes in its evidence; a spec edited since is uncalibrated
again.  Exit 0 when everything behaved, 1 otherwise, 2 when it cannot run here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from porter.errors import PorterError
from porter.gates.parity.compare import first_check

ADVERSARIAL_DIR = "adversarial"


# ---------------------------------------------------------------------------
# Ledger lookups (used by the parity gate as well)
# ---------------------------------------------------------------------------

def calibration_status(workspace: Path | None, target_name: str, spec) -> dict:
    """Is this exact spec (by sha256) calibrated?  From the ledger's "calibration" records."""
    if workspace is None:
        return {"calibrated": False, "reason": "no workspace"}
    try:
        from porter.ledger import Ledger

        recs = Ledger(Path(workspace)).records()
    except Exception as exc:  # noqa: BLE001 - status only
        return {"calibrated": False, "reason": f"ledger unreadable ({type(exc).__name__})"}
    mine = [r for r in recs if r.get("kind") == "calibration" and r.get("target") == target_name
            and r.get("unit") == spec.unit]
    current = [r for r in mine if r.get("spec_sha256") == spec.sha256]
    good = [r for r in current if r.get("ok")]
    if good:
        r = good[-1]
        return {"calibrated": True, "record": r.get("hash"), "time": r.get("time"), "known_good": r.get("known_good"),
                "mutants_rejected": r.get("mutants_rejected"), "mutants": r.get("mutants")}
    if current:
        return {"calibrated": False, "reason": f"last calibration failed: {current[-1].get('summary', '')}"[:300]}
    if mine:
        return {"calibrated": False, "reason": "spec changed since it was last calibrated"}
    return {"calibrated": False, "reason": "never calibrated (run `porter calibrate`)"}


# ---------------------------------------------------------------------------
# Known-good sources and the adversarial corpus
# ---------------------------------------------------------------------------

def _extract(text: str, unit: str, target) -> str:
    try:
        from porter.extract import extract_unit_source

        return extract_unit_source(text, unit, target)
    except ImportError:  # pragma: no cover - extract is part of porter
        import re

        m = re.search(r"```(?:cuda|cu|cpp|c\+\+)?\n(.*?)```", text, re.S)
        if not m:
            raise PorterError(f"no code block for {unit}")
        return m.group(1)


def scripted_answers(target) -> list[dict]:
    path = target.scripted_dir / "manifest.toml"
    if not path.is_file():
        return []
    return list(tomllib.loads(path.read_text()).get("answer", []))


def known_good_sources(target, spec: str) -> tuple[dict[str, str] | None, Path | None, str]:
    """(unit -> source, prebuilt library, description)."""
    if spec == "upstream":  # the target's upstream backend, built from its checkout (porter/known_good.py)
        from porter.known_good import build_library

        return None, build_library(target), f"upstream {target.name} backend ({target.checkout})"
    if spec == "scripted":
        out = {}
        for a in scripted_answers(target):
            if a.get("expect") == "pass":
                text = (target.scripted_dir / a["file"]).read_text()
                out[a["unit"]] = _extract(text, a["unit"], target)
        if not out:
            raise PorterError(f"target {target.name} has no scripted good answers (scripted/manifest.toml)")
        return out, None, f"scripted good answers ({target.scripted_dir.relative_to(target.dir)})"
    p = Path(spec).expanduser().resolve()
    if p.is_file() and p.suffix == ".so":
        return None, p, f"prebuilt library {p.name}"
    if p.is_dir():
        out = {}
        for u in target.units:
            for ext in (".cu", ".md"):
                f = p / f"{u}{ext}"
                if f.is_file():
                    text = f.read_text()
                    out[u] = text if ext == ".cu" else _extract(text, u, target)
                    break
        if not out:
            raise PorterError(f"{p} holds no <unit>.cu or <unit>.md for target {target.name}")
        return out, None, f"sources in {p}"
    raise PorterError(f"--known-good {spec}: not 'scripted', 'upstream', a directory or a .so file")


@dataclass
class Mutant:
    unit: str
    file: str
    must_fail_check: str
    why: str
    timeout: float | None = None
    source: str = ""
    origin: str = "adversarial"


def adversarial(target) -> list[Mutant]:
    d = target.dir / ADVERSARIAL_DIR
    path = d / "manifest.toml"
    if not path.is_file():
        return []
    from porter.gates.parity.compare import CHECK_ORDER

    out = []
    for i, m in enumerate(tomllib.loads(path.read_text()).get("mutant", [])):
        for k in ("unit", "must_fail_check", "why"):
            if k not in m:
                raise PorterError(f"{path}: mutant #{i + 1} lacks {k}")
        if ("file" in m) == ("scripted" in m):
            raise PorterError(f"{path}: mutant #{i + 1} needs exactly one of file / scripted")
        if m["must_fail_check"] not in CHECK_ORDER:
            raise PorterError(f"{path}: mutant #{i + 1}: unknown check {m['must_fail_check']!r}")
        if "file" in m:
            src_path = d / m["file"]
            if not src_path.is_file():
                raise PorterError(f"{path}: mutant file {m['file']} is missing")
            src, name, origin = src_path.read_text(), m["file"], "adversarial"
        else:
            src_path = target.scripted_dir / m["scripted"]
            if not src_path.is_file():
                raise PorterError(f"{path}: scripted answer {m['scripted']} is missing")
            src, name, origin = _extract(src_path.read_text(), m["unit"], target), m["scripted"], "scripted"
        out.append(Mutant(m["unit"], name, m["must_fail_check"], m["why"], m.get("timeout"), src, origin))
    return out


def scripted_mutants(target, skip: set[str] = frozenset()) -> list[Mutant]:
    """Scripted bad answers that must reach parity: expect 'parity' (fail) or 'perf' (pass parity),
    except those the adversarial manifest already names (with the check they must fail)."""
    out = []
    for a in scripted_answers(target):
        if a.get("expect") in ("parity", "perf") and a["file"] not in skip:
            text = (target.scripted_dir / a["file"]).read_text()
            try:
                src = _extract(text, a["unit"], target)
            except PorterError:
                continue
            out.append(Mutant(a["unit"], a["file"], "any" if a["expect"] == "parity" else "pass",
                              a.get("why", ""), None, src, origin="scripted"))
    return out


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------

@dataclass
class Row:
    unit: str
    kind: str  # "known-good" | "adversarial" | "scripted"
    name: str
    expect: str  # "pass" | check name | "any"
    got: str  # "pass" | first failing check | "skipped" | "build-error"
    ok: bool
    summary: str
    seconds: float = 0.0
    failed_checks: list[str] = field(default_factory=list)
    static: str | None = None
    probe: dict = field(default_factory=dict)  # stream-probe outcomes over all calls: clean/changed/inconclusive


def _run(target, spec, lib, args, timeout=None):
    from porter.gates.parity.gate import run_spec

    return run_spec(target, spec, lib, workspace=args.workspace, sanitize=args.sanitize,
                    timeout=timeout or args.timeout, mode=args.mode, timing_reps=args.timing_reps)


def _probe_counts(res) -> dict:
    out: dict = {}
    for c in (res.evidence or {}).get("cases", []):
        for p in c.get("passes", []):
            k = p.get("probe") or "none"
            out[k] = out.get(k, 0) + 1
    return out


def _static_verdict(target, unit, source) -> str | None:
    try:
        from porter.gates import static
    except ImportError:
        return None
    try:
        r = static.check(target, unit, source)
    except Exception as exc:  # noqa: BLE001 - informative column only
        return f"error: {type(exc).__name__}"
    return "pass" if r.ok else "reject"


def calibrate(target, args, out=print) -> dict:
    from porter.gates.parity.libbuild import BuildError, LibBuilder
    from porter.gates.parity.spec import load_specs

    specs = load_specs(target)
    units = args.unit or sorted(specs)
    unknown = [u for u in units if u not in specs]
    if unknown:
        raise PorterError(f"no parity spec for {', '.join(unknown)}")
    sources, prebuilt, desc = known_good_sources(target, args.known_good)
    cache = Path(args.build_dir) if args.build_dir else Path(args.workspace) / "runs" / "build-cache"
    builder = None
    rows: list[Row] = []
    t0 = time.monotonic()
    if prebuilt is not None:
        good_lib = prebuilt
    else:
        builder = LibBuilder(target, cache)
        good_lib = builder.library(sources, "known-good")
    out(f"known-good: {desc} -> {good_lib}  ({time.monotonic() - t0:.1f} s to build)")

    mutants = adversarial(target) if args.adversarial else []
    if args.scripted_bad:
        mutants += scripted_mutants(target, {m.file for m in mutants if m.origin == "scripted"})
    if builder is not None and mutants:  # compile every mutant's unit in parallel up front (objects are cached)
        from concurrent.futures import ThreadPoolExecutor
        import os

        todo = [m for m in mutants if m.unit in units]
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            list(pool.map(lambda m: _try_compile(builder, m), todo))
    records = {}
    for unit in units:
        spec = specs[unit]
        if prebuilt is None and unit not in sources:
            rows.append(Row(unit, "known-good", "-", "pass", "uncalibrated", False,
                            "no known-good implementation of this unit"))
            records[unit] = {"ok": False, "summary": "no known-good implementation", "known_good_ok": None}
            continue
        t1 = time.monotonic()
        res = _run(target, spec, good_lib, args)
        got = first_check(res)
        rows.append(Row(unit, "known-good", desc, "pass", got, res.ok, res.summary, time.monotonic() - t1,
                        res.metrics.get("failed_checks", []), probe=_probe_counts(res)))
        out(f"  {'ok ' if res.ok else 'BAD'} {unit}: {res.summary}")
        unit_mutants = [m for m in mutants if m.unit == unit]
        m_ok = 0
        for m in unit_mutants:
            if builder is None:
                rows.append(Row(unit, m.origin, m.file, m.must_fail_check, "skipped", False,
                                "a prebuilt known-good library: mutants cannot be linked"))
                continue
            t2 = time.monotonic()
            try:
                lib = builder.library({**sources, unit: m.source}, m.file)
            except BuildError as exc:
                rows.append(Row(unit, m.origin, m.file, m.must_fail_check, "build-error", False, str(exc)))
                out(f"      BUILD-ERROR {m.file}: {exc}")
                continue
            r = _run(target, spec, lib, args, timeout=m.timeout)
            got = first_check(r)
            if m.must_fail_check == "pass":
                good = r.ok
            elif m.must_fail_check == "any":
                good = not r.ok and not r.skipped
            else:
                good = got == m.must_fail_check
            m_ok += good
            rows.append(Row(unit, m.origin, m.file, m.must_fail_check, got, good, r.summary,
                            time.monotonic() - t2, r.metrics.get("failed_checks", []),
                            _static_verdict(target, unit, m.source) if args.static else None,
                            _probe_counts(r)))
            out(f"      {'ok ' if good else 'BAD'} {m.file}: want {m.must_fail_check}, got {got}: {r.summary[:160]}")
        ok = res.ok and m_ok == len(unit_mutants)
        records[unit] = {"ok": ok, "summary": res.summary[:300], "known_good_ok": res.ok,
                         "mutants": len(unit_mutants), "mutants_rejected": m_ok,
                         "evidence": res.evidence, "spec": spec}
    report = {"target": target.name, "known_good": desc, "library": str(good_lib),
              "rows": [asdict(r) for r in rows], "seconds": round(time.monotonic() - t0, 1)}
    if not args.no_ledger:
        _record(target, args, records, desc, good_lib)
    return report


def _try_compile(builder, m) -> None:
    from porter.gates.parity.libbuild import BuildError

    try:
        builder.object_for(m.unit, m.source)
    except BuildError:
        pass  # reported when its library is linked


def _record(target, args, records, desc, good_lib) -> None:
    try:
        from porter.evidence import store_evidence
        from porter.ledger import Ledger, load_key
    except ImportError:  # pragma: no cover
        return
    ledger = Ledger(Path(args.workspace), load_key(Path(args.workspace)))
    lib_sha = hashlib.sha256(Path(good_lib).read_bytes()).hexdigest()
    for unit, r in records.items():
        spec = r.get("spec")
        ev_sha = None
        if r.get("evidence"):
            ev = dict(r["evidence"], candidate_sha256=r["evidence"].get("candidate_sha256") or lib_sha,
                      calibration_role="known-good")
            ev_sha = store_evidence(Path(args.workspace), ev)
        ledger.append("calibration", target=target.name, unit=unit, ok=bool(r["ok"]),
                      spec_sha256=spec.sha256 if spec else None,
                      spec_file=str(spec.path.name) if spec and spec.path else None,
                      known_good=desc, known_good_sha256=lib_sha, known_good_ok=r.get("known_good_ok"),
                      mutants=r.get("mutants", 0), mutants_rejected=r.get("mutants_rejected", 0),
                      summary=r.get("summary", ""), evidence=ev_sha)


# ---------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------

def table(report: dict) -> str:
    rows = report["rows"]
    lines = []
    w = max([len(r["name"]) for r in rows] + [10])
    lines.append(f"{'unit':<40} {'kind':<11} {'candidate':<{w}} {'must':<12} {'got':<12} verdict")
    for r in rows:
        name = r["name"] if r["kind"] != "known-good" else "known-good"
        verdict = "ok" if r["ok"] else "WRONG"
        lines.append(f"{r['unit']:<40} {r['kind']:<11} {name:<{w}} {r['expect']:<12} {r['got']:<12} {verdict}")
    return "\n".join(lines)


def matrix(report: dict) -> str:
    """unit x check: how many candidates each check rejected (known-good pass shown as 'P')."""
    from porter.gates.parity.compare import CHECK_ORDER

    rows = report["rows"]
    units = sorted({r["unit"] for r in rows})
    used = [c for c in CHECK_ORDER if any(r["got"] == c for r in rows)]
    short = {u: u.replace("mini_gpu_", "").replace("_tensor", "") for u in units}
    w = max(len(s) for s in short.values()) if short else 10
    head = f"{'unit':<{w}} good " + " ".join(f"{c:>{max(len(c), 3)}}" for c in used)
    lines = [head]
    for u in units:
        good = next((r for r in rows if r["unit"] == u and r["kind"] == "known-good"), None)
        g = "P" if good and good["ok"] else ("-" if good is None else "X")
        cells = []
        for c in used:
            hits = [r for r in rows if r["unit"] == u and r["kind"] != "known-good" and r["got"] == c]
            wrong = [r for r in hits if not r["ok"]]
            cell = f"{len(hits)}" + ("!" if wrong else "") if hits else "."
            cells.append(f"{cell:>{max(len(c), 3)}}")
        lines.append(f"{short[u]:<{w}} {g:>4} " + " ".join(cells))
    lines.append("cells: mutants rejected by that check (the first check that failed); '!' = not the check the "
                 "manifest names; good: P = known-good passed, X = rejected (broken spec)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# CLI hooks
# ---------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--known-good", default="scripted", metavar="SRC",
                   help="'scripted' (the target's scripted good answers, default), 'upstream' (the target's upstream "
                   "backend built from its checkout), a DIR of <unit>.cu/.md, or a .so")
    p.add_argument("--unit", action="append", metavar="UNIT", help="only this unit's spec (repeatable)")
    p.add_argument("--no-adversarial", dest="adversarial", action="store_false",
                   help="skip targets/<t>/adversarial/ mutants")
    p.add_argument("--no-scripted-bad", dest="scripted_bad", action="store_false",
                   help="skip scripted bad answers that expect 'parity' or 'perf'")
    p.add_argument("--sanitize", action="store_true", help="also run each case under compute-sanitizer memcheck")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="time limit per parity child (default 60)")
    p.add_argument("--timing-reps", type=int, default=10, metavar="N", help="CUDA-event timing repetitions")
    p.add_argument("--build-dir", metavar="DIR", help="object/library cache (default runs/build-cache)")
    p.add_argument("--no-ledger", action="store_true", help="do not append calibration records to the ledger")
    p.add_argument("--no-static", dest="static", action="store_false",
                   help="do not show the static gate's verdict on each mutant")
    p.add_argument("--report", metavar="FILE", help="write the full report as JSON to FILE")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--mode", choices=("cuda", "host"), default="cuda", help=argparse.SUPPRESS)


def run(args) -> int:
    from porter.gates.parity import available
    from porter.target import load_target

    target = load_target(Path(args.workspace), args.target, getattr(args, "source", None))
    if args.mode == "cuda":
        ok, why = available()
        if not ok:
            raise PorterError(f"calibrate needs the parity gate to run: {why}")
    log = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print
    report = calibrate(target, args, out=log)
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1, default=str))
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print()
        print(table(report))
        print()
        print(matrix(report))
    bad = [r for r in report["rows"] if not r["ok"]]
    if not args.json:
        print(f"\n{len(report['rows']) - len(bad)} of {len(report['rows'])} behaved as they must"
              + (f"; {len(bad)} did not" if bad else "") + f" ({report['seconds']} s)")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    """`python -m porter.calibrate ...` without the porter CLI."""
    p = argparse.ArgumentParser(prog="porter calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("-C", dest="workspace", default=".", help="workspace (default: .)")
    p.add_argument("--target", default="minimoe")
    p.add_argument("--source", default=None)
    add_arguments(p)
    args = p.parse_args(argv)
    args.workspace = Path(args.workspace).resolve()
    try:
        return run(args)
    except PorterError as exc:
        print(f"porter: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
