"""`porter dev perf-table`: the known-good's speed per op in each regime, whether it passes its own perf
limit when timed again, and whether every perf mutant is refused by the check it names.  GPU.

    porter dev perf-table --target ds4 --source CHECKOUT          # upstream ds4, every timed spec
    porter dev perf-table --target ds4 --chunk 1/2 --out runs/perf-table-1.md

Per timed spec: the known-good (the checkout's upstream backend, built as `porter calibrate --known-good
upstream` does) timed in the target's regime, timed again in a fresh process on the same inputs and judged
by the perf gate against the first run (the limit the first run's spread allows: a limit the known-good
itself cannot meet is a wrong limit), and timed in each further named regime ([perf] regimes) for the
comparison.  Then every perf mutant of those units (targets/<t>/perf_mutants.toml) is built and judged:
parity first, perf against the known-good's first run.  Writes a Markdown table (--out, default
runs/perf-table.md) and the rows as JSON beside it, again after every finished row, so a run cut short
keeps what it measured (its JSON says `"complete": false`); exit 0 when the known-good passed everywhere
and every perf mutant was refused by its check, else 1.

The `suggested floor` column is half the known-good's roofline share in the production regime: the
[perf.floors] value a target may declare for a real port of that op (no known-good to compare with).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from porter.calibration.baseline import times_a_case
from porter.calibration.calibrator import CalibrateOptions, baseline_alone, parity_on_library, parity_then_perf
from porter.calibration.chunks import chunk_units
from porter.calibration.libraries import libraries_for
from porter.gates.mutants import perf_rule_mutants
from porter.gates import perf
from porter.gates.driver import ParityOptions
from porter.gates.parity.gate import fresh_seeds
from porter.gates.evidence import ParityEvidence, PerfEvidence
from porter.records import durable
from porter.spec import load_specs

PARALLEL_SPECS = 4  # inputs and references built side by side; the GPU runs still take turns


def _timing(res) -> dict:
    timing = ParityEvidence.of(res.evidence).timing
    return timing.dump() if timing is not None else {}


def _seconds(res) -> dict:
    """Where a parity run's time went (preparing the cases, the child, the child's own phases): the
    production-size rows cost minutes each on one GPU, and the table says where."""
    ev = res.evidence or {}
    return {**(ev.get("harness_s") or {}), "child_phases": (ev.get("child") or {}).get("phase_s")}


def _regime_run(target, unit, lib, opts: CalibrateOptions, seeds, regime: str | None, fresh: bool = False):
    o = dataclasses.replace(opts, parity=dataclasses.replace(opts.parity, regime=regime))
    return parity_on_library(target, unit, lib, o, seeds=seeds, fresh_process=fresh)


def measure_unit(target, unit: str, good: Path, opts: CalibrateOptions, regimes: list[str]) -> tuple[dict, object, list]:
    """(the unit's row, the known-good's first run, its seeds)."""
    seeds = fresh_seeds(2)
    # the known-good's time is the row's point: alone on the GPU where warm workers share it (a shared warm
    # run makes no timed call, see calibrator.parity_on_library)
    first = _regime_run(target, unit, good, opts, seeds, None, fresh=baseline_alone())
    row = {"unit": unit, "regime": target.spec.perf.regime, "known_good": first.word, "case": _timing(first).get("case"),
           "spec_sha256": getattr(ParityEvidence.of(first.evidence).spec, "sha256", None)}
    if not first.ok:  # the known-good refused on its own spec: why is the row's point
        row["known_good_summary"] = first.summary[:600]
    t = _timing(first)
    row.update(ms=t.get("median_ms"), pct_roofline=perf.pct_of_roofline(t), gbps=t.get("gbps"),
               limit=perf.calibrated_limit(t)["limit"] if t else None)
    again = verdict = None
    if first.ok and t.get("median_ms"):
        again = _regime_run(target, unit, good, opts, seeds, None, fresh=True)
        base, why = perf.known_good_baseline(first)
        verdict = perf.decide(target, unit, again, base, why,
                              lambda: _regime_run(target, unit, good, opts, fresh_seeds(2), None, fresh=True))
        row.update(again_ms=_timing(again).get("median_ms"), perf=verdict.word, perf_summary=verdict.summary[:300])
    row["cases"] = case_rows(first, again, verdict)
    row["seconds"] = {"first": _seconds(first), **({"again": _seconds(again)} if again is not None else {})}
    shares = [c["suggested_floor"] for c in row["cases"] if c.get("suggested_floor") is not None]
    if shares and verdict is not None:
        row["suggested_floor"] = min(shares)
    for name in regimes:
        other = _regime_run(target, unit, good, opts, seeds, name, fresh=baseline_alone())
        ot = _timing(other)
        row[f"{name}_ms"] = ot.get("median_ms")
        row[f"{name}_pct_roofline"] = perf.pct_of_roofline(ot)
        row[f"{name}_known_good"] = other.word
    return row, first, seeds


def _measured_now(row: dict, specs: dict) -> bool:
    """A row with its timed cases kept, measured on the spec as it is now (its recorded hash is the loaded one's)."""
    u = row["unit"]
    return bool(row.get("cases")) and u in specs and row.get("spec_sha256") == specs[u].sha256


def judged_mutants(table: dict, specs: dict) -> set[tuple[str, str]]:
    """(unit, perf mutant) pairs of a perf-table JSON judged on the unit's spec as it is now: on a case the
    unit's current row times, or, refused by a parity check before any case was timed, on that spec's hash.
    Only a mutant refused by the check it names counts: one that got another verdict is judged again (a
    harness fix since, or a spec gap, is what the next lease is for)."""
    judged = {(m["unit"], m["mutant"]): m.get("case") or m.get("spec_sha256")
              for m in table.get("mutants") or [] if m.get("ok") is True}
    out = set()
    for r in filter(lambda r: _measured_now(r, specs), table["rows"]):
        where = {c["case"] for c in r["cases"]} | {specs[r["unit"]].sha256}
        out |= {(unit, name) for (unit, name), at in judged.items() if unit == r["unit"] and at in where}
    return out


def current_rows(table: dict, specs: dict, perf_mutants: dict[str, list[str]] | None = None) -> set[str]:
    """Units whose row in a perf-table JSON (`table`, loaded) was measured on the spec as it is now
    (_measured_now), with each of the unit's perf mutants (`perf_mutants`: unit -> names) judged on it
    (judged_mutants) (--missing-from: a lease that ends mid-table is resumed by the next one, which
    measures only the rest)."""
    judged = judged_mutants(table, specs)
    return {r["unit"] for r in table["rows"] if _measured_now(r, specs)
            and all((r["unit"], name) in judged for name in (perf_mutants or {}).get(r["unit"], []))}


def half_share(pct: float | None) -> float | None:
    """The floor a case's roofline share suggests: half of it, at 4 decimals (None without a share)."""
    return round(pct / 200.0, 4) if pct else None


def case_rows(first, again, verdict) -> list[dict]:
    """Every case the known-good's first run timed, in the spec's order: its time and roofline share, what
    bounds it (bytes or FLOPs: the larger roofline term), the limit its spread allows, the fresh-process
    time and the perf gate's verdict on that case (perf judges every timed case, not one per op)."""
    judged = {c.case: c for c in (PerfEvidence.of(verdict.evidence).cases or [])} if verdict is not None else {}
    again_cases = perf.cases_of(again.evidence) if again is not None else {}
    out = []
    for case, t in perf.cases_of(first.evidence).items():
        v = judged.get(case)
        pct = perf.pct_of_roofline(t)
        out.append({"case": case, "ms": t.get("median_ms"), "pct_roofline": pct,
                    "suggested_floor": half_share(pct),
                    "bound": bound_by(t), "bytes": t.get("bytes"), "flops": t.get("flops"),
                    "limit": perf.calibrated_limit(t)["limit"] if t.get("median_ms") else None,
                    "again_ms": (again_cases.get(case) or {}).get("median_ms"),
                    "ratio": v.ratio if v is not None else None,
                    "perf": None if v is None else "skipped" if v.skipped else "pass" if v.ok else "fail"})
    return out


def bound_by(t: dict) -> str:
    """'compute' where the case's FLOPs at the GPU's peak take longer than its bytes at peak bandwidth,
    'memory' otherwise; '-' where the spec declares neither term the GPU can be measured against."""
    gbps, tflops = t.get("peak_gbps"), t.get("peak_fp32_tflops")
    mem = t["bytes"] / (gbps * 1e9) if t.get("bytes") and gbps else None
    flop = t["flops"] / (tflops * 1e12) if t.get("flops") and tflops else None
    if mem is None and flop is None:
        return "-"
    return "compute" if (flop or 0) > (mem or 0) else "memory"


def judge_mutant(target, m, libs, opts: CalibrateOptions, first, seeds) -> dict:
    row = {"unit": m.unit, "mutant": m.name, "expect": m.must_fail_check}
    try:
        lib = libs.mutant(m)
    except Exception as exc:  # noqa: BLE001 - a mutant that does not build is a row, not a crash
        return dict(row, got="build-error", ok=False, summary=str(exc)[:300])
    # timed alone whatever check it names, unlike calibration: its row keeps the mutant's time (`ms`)
    r = parity_then_perf(target, m.unit, lib, opts, first, seeds, m.timeout, timed=True, judge_perf=m.perf).verdict
    named = PerfEvidence.of(r.evidence).candidate if r.gate == "perf" else None
    return dict(row, got=r.word, ok=m.rejected_by(r.word), ms=(r.metrics or {}).get("median_ms"),
                case=named.case if named else None, roofline_ms=named.roofline_ms if named else None,
                spec_sha256=getattr(ParityEvidence.of(first.evidence).spec, "sha256", None), summary=r.summary[:300])


def _f(v, fmt="{:.4g}") -> str:
    return "-" if v is None else fmt.format(v)


def render(target, rows: list[dict], mutants: list[dict], regimes: list[str], seconds: float, device: str) -> str:
    prod = target.spec.perf.regime
    head = ["unit", "timed case", f"{prod} ms", f"{prod} % roofline", "limit", "again ms", "perf"]
    for name in regimes:
        head += [f"{name} ms", f"{name} % roofline"]
    head.append("suggested floor")
    lines = [f"# {target.name}: the known-good per op ({device}; {seconds:.0f} s)", "",
             f"Production regime: {prod}. `perf`: the known-good timed again in a fresh process and judged by the "
             "perf gate against its first run.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["unit"].removeprefix(target.symbol_prefix), r.get("case") or "-", _f(r.get("ms")),
                 _f(r.get("pct_roofline"), "{:.1f}"), _f(r.get("limit"), "{:.3g}x"), _f(r.get("again_ms")),
                 r.get("perf") or r["known_good"]]
        for name in regimes:
            cells += [_f(r.get(f"{name}_ms")), _f(r.get(f"{name}_pct_roofline"), "{:.1f}")]
        cells.append(_f(r.get("suggested_floor"), "{:.3g}"))
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    lines += cases_block(target, rows)
    # a declared perf mutant of a tabled op with no row was never judged: the table says so rather than
    # counting only the ones it ran
    judged = {(m["unit"], m["mutant"]) for m in mutants}
    tabled = {r["unit"] for r in rows}
    unjudged = [m for m in perf_rule_mutants(target) if m.unit in tabled and (m.unit, m.name) not in judged]
    if mutants or unjudged:
        lines += ["", "## perf mutants", "", "| mutant | unit | must fail by | got | ok |", "|---|---|---|---|---|"]
        for m in mutants:
            lines.append(f"| {m['mutant']} | {m['unit'].removeprefix(target.symbol_prefix)} | {m['expect']} | "
                         f"{m['got']} | {'yes' if m['ok'] else 'NO'} |")
        for m in unjudged:
            lines.append(f"| {m.name} | {m.unit.removeprefix(target.symbol_prefix)} | {m.must_fail_check} | "
                         "not judged | - |")
    passed = sum(1 for r in rows if r.get("perf") == "pass")
    refused = sum(1 for m in mutants if m["ok"])
    lines += ["", f"known-good passes perf in the {prod} regime on {passed} of {len(rows)} timed ops; "
              f"{refused} of {len(mutants)} perf mutants refused by the check they name"
              + (f"; {len(unjudged)} declared perf mutant(s) not judged here" if unjudged else "")]
    return "\n".join(lines) + "\n"


def cases_block(target, rows: list[dict]) -> list[str]:
    """The table's every-case section: one line per timed case of every op (rows of runs made before the
    cases were kept have none, and add no line)."""
    every = [(r, c) for r in rows for c in r.get("cases") or []]
    if not every:
        return []
    judged = [c for _, c in every if c.get("perf") in ("pass", "fail")]
    out = ["", "## every timed case", "",
           "The perf gate judges each of these against the known-good's first run (`x`: the fresh run's time "
           "over it; `limit`: what that case's own spread allows).", "",
           "| unit | case | ms | % roofline | bound by | limit | again ms | x | perf |", "|---|---|---|---|---|---|---|---|---|"]
    for r, c in every:
        cells = [r["unit"].removeprefix(target.symbol_prefix), c.get("case") or "-", _f(c.get("ms")),
                 _f(c.get("pct_roofline"), "{:.1f}"), c.get("bound") or "-", _f(c.get("limit"), "{:.3g}x"),
                 _f(c.get("again_ms")), _f(c.get("ratio"), "{:.2f}"), c.get("perf") or "-"]
        out.append("| " + " | ".join(str(x).replace("|", "/") for x in cells) + " |")
    passed = sum(1 for c in judged if c["perf"] == "pass")
    out += ["", f"{len(every)} timed cases over {sum(1 for r in rows if r.get('cases'))} ops; the known-good "
            f"re-timed in a fresh process passes {passed} of the {len(judged)} judged"]
    return out


def floors_block(target, rows: list[dict]) -> str:
    """The [perf.floors] a target may declare from this table: half the roofline share the known-good
    reached in the production regime, per op, or per case where the op times several (a prefill matmul
    is compute-bound where its decode is bandwidth-bound: one share for both either refuses upstream on
    the one or lets a serial kernel through on the other).  A share that rounds to 0 at 4 decimals is
    pure latency at its timed size and gets no line (the launch allowance decides there)."""
    lines = [f"[perf.floors]  # half of {target.name}'s known-good roofline share per op (porter dev perf-table)"]
    tables = []
    for r in sorted(rows, key=lambda r: r["unit"]):
        if r.get("perf") != "pass":
            continue
        per_case = {c["case"]: half for c in r.get("cases") or []
                    if (half := half_share(c.get("pct_roofline")) or 0) >= 0.0001}
        if len(per_case) > 1:
            tables.append(f"\n[perf.floors.{r['unit']}]")
            tables += [f"{json.dumps(case)} = {share:.4g}" for case, share in per_case.items()]
        elif per_case:
            lines.append(f"{r['unit']} = {next(iter(per_case.values())):.4g}")
        elif not r.get("cases") and (r.get("suggested_floor") or 0) >= 0.0001:  # a row measured before cases were kept
            lines.append(f"{r['unit']} = {r['suggested_floor']:.4g}")
    return "\n".join(lines + tables) + "\n"


def from_json(target, paths: list[str], out: Path) -> int:
    """One table from the JSON of several --chunk runs (each chunk may run on its own GPU of one kind), or
    of an earlier table and a re-measurement of some of its ops: a unit or perf mutant in several parts
    keeps the last part's row, and each row keeps the `measured` note of the part it came from."""
    by_unit, by_mutant, device, seconds = {}, {}, set(), 0.0
    for p in paths:
        try:
            d = json.loads(Path(p).read_text())
            part = [dict(r, measured=r.get("measured") or d.get("measured")) for r in d["rows"]]
            for r in part:
                if r["unit"] in by_unit:
                    print(f"perf-table: {r['unit']}: the row of {p} replaces an earlier part's", file=sys.stderr)
                by_unit[r["unit"]] = r
            for m in d["mutants"]:
                by_mutant[(m["unit"], m["mutant"])] = dict(m, measured=m.get("measured") or d.get("measured"))
            if d.get("complete") is False:
                print(f"perf-table: {p} is a run cut short: its finished rows only", file=sys.stderr)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"perf-table: {p}: not a perf-table JSON ({exc})", file=sys.stderr)
            return 2
        device.add(d.get("device") or "unknown GPU")
        seconds = max(seconds, float(d.get("seconds") or 0))
    if len(device) > 1:
        print(f"perf-table: the parts ran on different GPUs ({sorted(device)}): one table compares one kind",
              file=sys.stderr)
        return 2
    rows, mrows = sorted(by_unit.values(), key=lambda r: r["unit"]), list(by_mutant.values())
    stale = [m for m in mrows if m.get("case") and by_unit.get(m["unit"], {}).get("cases")
             and m["case"] not in {c["case"] for c in by_unit[m["unit"]]["cases"]}]
    for m in stale:
        print(f"perf-table: mutant {m['mutant']} was judged on {m['case']!r}, a case {m['unit']}'s row no "
              "longer times (kept, with the case it ran on)", file=sys.stderr)
    gpu = device.pop()
    text = render(target, rows, mrows, list(target.spec.perf.regimes), seconds, gpu)
    text += "\n```toml\n" + floors_block(target, rows) + "```\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "mutants": mrows, "device": gpu,
                                                    "seconds": seconds}, indent=1, default=str))
    print(text)
    bad = [r for r in rows if r.get("perf") != "pass"] + [m for m in mrows if not m["ok"]]
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="porter dev perf-table", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="the target (default: the workspace's only target)")
    ap.add_argument("--source", metavar="DIR", help="the target's checkout (default: PORTER_<T>_SOURCE)")
    ap.add_argument("--known-good", default="upstream", metavar="SRC", help="as `porter calibrate --known-good`")
    ap.add_argument("--unit", action="append", metavar="UNIT", help="only this unit (repeatable)")
    ap.add_argument("--chunk", metavar="I/N", help="only the I-th of N parts of the timed specs")
    ap.add_argument("--missing-from", metavar="JSON", help="only the ops whose row in this perf-table JSON "
                    "(e.g. targets/<t>/perf/<gpu>.json) is missing, has no per-case rows or was measured on "
                    "another version of its spec; join the result to it with --merge")
    ap.add_argument("--no-mutants", action="store_true")
    ap.add_argument("--regimes", metavar="A,B", help="the comparison regimes timed beside the production one "
                    "(default: the target's [perf] regimes; '' for none: one run less per spec)")
    ap.add_argument("--parallel", type=int, default=PARALLEL_SPECS, metavar="N",
                    help=f"specs prepared side by side (default {PARALLEL_SPECS}; their GPU runs take turns)")
    ap.add_argument("--timing-reps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=180.0, metavar="S", help="per parity child")
    ap.add_argument("--out", default="runs/perf-table.md", metavar="FILE")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="no GPU: one table (and its [perf.floors] "
                    "block) from the JSON of earlier --chunk runs")
    args = ap.parse_args(argv)

    from porter.gates import parity
    from porter.target import load_target
    from porter.workspace import default_target

    if args.merge:
        ws = Path.cwd()
        return from_json(load_target(ws, args.target or default_target(ws), args.source), args.merge, Path(args.out))
    ok, why = parity.available()
    if not ok:
        print(f"perf-table needs a GPU: {why}", file=sys.stderr)
        return 2
    ws = Path.cwd()
    target = load_target(ws, args.target or default_target(ws), args.source)
    specs = load_specs(target)
    units = [u for u in (args.unit or sorted(specs)) if u in specs and times_a_case(specs[u])]
    regimes = list(target.spec.perf.regimes) if args.regimes is None else [r for r in args.regimes.split(",") if r]
    unknown = [r for r in regimes if r not in target.spec.perf.regimes]
    if unknown:  # before any build: a typo costs nothing
        print(f"perf-table: {target.name} has no regime {unknown[0]!r} (its [perf] regimes: "
              f"{sorted(target.spec.perf.regimes) or 'none'})", file=sys.stderr)
        return 2
    if args.missing_from:
        named: dict[str, list[str]] = {}
        for m in perf_rule_mutants(target):
            named.setdefault(m.unit, []).append(m.name)
        try:
            table = json.loads(Path(args.missing_from).read_text())
            current = current_rows(table, specs, named)
            # an op measured again only for its perf mutants not yet judged: the ones judged on its current
            # spec keep their rows (a mutant at production sizes costs minutes of GPU)
            done = judged_mutants(table, specs)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"perf-table: {args.missing_from}: not a perf-table JSON ({exc})", file=sys.stderr)
            return 2
        print(f"perf-table: {len(set(units) & current)} op(s) already measured on their current spec in "
              f"{args.missing_from}; {len(set(units) - current)} to go", flush=True)
        units = [u for u in units if u not in current]
    else:
        done = set()
    if args.chunk:
        units = chunk_units(target, args.chunk, units)
    libs = libraries_for(target, args.known_good, ws / "runs" / "build-cache")
    mutants = [] if args.no_mutants else [m for m in perf_rule_mutants(target)
                                          if m.unit in units and (m.unit, m.name) not in done]
    t0 = time.monotonic()
    libs.prepare(mutants)
    good = libs.known_good()
    opts = CalibrateOptions(ws, units, parity=ParityOptions(timeout=args.timeout, timing_reps=args.timing_reps),
                            ledger=False, variants=False)
    print(f"perf-table: {len(units)} timed spec(s), {len(mutants)} perf mutant(s), regimes "
          f"{[target.spec.perf.regime] + regimes}; known-good {good}", flush=True)
    out = Path(args.out)
    kept = Kept(target, out, regimes, t0)
    firsts: dict = {}

    def measured(u: str):
        row, first, seeds = measure_unit(target, u, good, opts, regimes)
        firsts[u] = (first, seeds)
        kept.row(row, ParityEvidence.of(first.evidence).gpu)
        return row

    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        list(pool.map(measured, units))
    for m in mutants:
        first, seeds = firsts[m.unit]
        kept.mutant(judge_mutant(target, m, libs, opts, first, seeds))
    text = kept.write(done=True)
    print("\n" + text)
    bad = [r for r in kept.rows if r.get("perf") != "pass"] + [m for m in kept.mutants if not m["ok"]]
    return 1 if bad else 0


class Kept:
    """The table so far, rewritten (Markdown and JSON) after every finished row and mutant: a run cut
    short by its time box or a kill keeps what it measured, and `--merge` reads a partial JSON as well
    (its `complete` is false)."""

    def __init__(self, target, out: Path, regimes: list[str], t0: float):
        self.target, self.out, self.regimes, self.t0 = target, out, regimes, t0
        self.rows: list[dict] = []
        self.mutants: list[dict] = []
        self.device = None
        self.note: tuple[str | None, str] = (None, "")  # (device, its `measured` note)
        self.lock = threading.Lock()

    def row(self, row: dict, gpu: str | None) -> None:
        with self.lock:
            self.rows.append(row)
            self.device = self.device or gpu
            print(f"  [{time.monotonic() - self.t0:.0f} s] {row['unit']}: {row.get('perf') or row['known_good']} "
                  f"{_f(row.get('ms'))} ms ({_f(row.get('pct_roofline'), '{:.1f}')}% roofline)"
                  + (f": {row['known_good_summary'][:300]}" if row.get("known_good_summary") else ""), flush=True)
            self.write()

    def mutant(self, m: dict) -> None:
        with self.lock:
            self.mutants.append(m)
            print(f"  [{time.monotonic() - self.t0:.0f} s] mutant {m['mutant']}: want {m['expect']}, got {m['got']}",
                  flush=True)
            self.write()

    def write(self, done: bool = False) -> str:
        rows = sorted(self.rows, key=lambda r: r["unit"])
        seconds = time.monotonic() - self.t0
        device = self.device or "unknown GPU"
        text = render(self.target, rows, self.mutants, self.regimes, seconds, device)
        text += "\n```toml\n" + floors_block(self.target, rows) + "```\n"
        if self.note[0] != device:  # git is asked once a run, not after every row
            self.note = (device, provenance(self.target, device))
        durable.write_atomic(self.out, text.encode())
        durable.write_atomic(self.out.with_suffix(".json"), json.dumps(
            {"rows": rows, "mutants": self.mutants, "device": device, "seconds": round(seconds, 1),
             "complete": done, "measured": self.note[1]}, indent=1, default=str).encode())
        return text


def provenance(target, device: str) -> str:
    """What a row's `measured` note says by default: the day, the GPU, and the commits of the checkout and
    of porter where each is a git work tree (a table joined from several leases keeps, per row, which one
    measured it)."""
    import datetime

    import porter
    from porter.records import gitops

    parts = [datetime.date.today().isoformat(), device]
    # only a folder that is itself a work tree's top: porter installed in a virtualenv inside some other
    # repository must not report that repository's commit as porter's
    for name, where in ((f"upstream {target.name}", getattr(target, "checkout", None)),
                        ("porter", Path(porter.__file__).resolve().parents[1])):
        top = gitops.toplevel(Path(where)) if where else None
        sha = gitops.head(top) if top is not None and top.resolve() == Path(where).resolve() else None
        if sha:
            parts.append(f"{name} {sha[:7]}")
    return ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
