"""`porter calibrate --mutate`: how much of what could go wrong in each unit do its specs catch?

    porter calibrate --mutate --target minimoe [--unit U ...] [--budget N] [--seed S] [--op OP ...]
    porter calibrate --mutate --target ds4 --known-good upstream --write     # GPU: record the table

1. generate: every operator's edits of each unit's known-good source, at most --budget per operator
   and unit, drawn by --seed (porter.calibration.mutate.generate);
2. build: each compiled as the build gate compiles a unit; did-not-build, equivalent to the known-good
   (same machine code) and duplicates (same machine code as another mutant) are set apart (objects);
3. judge: the rest through parity, and perf where parity passed, on the calibration's path (runner);
4. report: per operator and per unit, generated / did not build / equivalent / duplicate / killed /
   survived and the score, each survivor as its diff; --write records it in targets/<t>/mutation.json.

Without a GPU the first two steps run and the table says how many mutants wait to be judged; the
command then ends with one line saying parity needs a GPU, exit 2 (nothing was scored), unless
--builds-only asked for the builds alone (exit 0).  With a GPU: exit 0 when every unit's known-good
passed and every mutant that built was killed or is equivalent; 1 when a survivor is left to triage
or a known-good was refused; 2 when it cannot run here.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from porter.calibration.mutate import declared as declared_mod
from porter.calibration.mutate import report as rep
from porter.calibration.mutate.generate import candidates, operators_named, sample
from porter.calibration.mutate.objects import DID_NOT_BUILD, DISTINCT, DUPLICATE, EQUIVALENT, Built, build_all
from porter.digest import sha256_bytes
from porter.errors import PorterError

DEFAULT_BUDGET = 8
DEFAULT_SEED = 0


def add_arguments(p) -> None:
    """The --mutate options of `porter calibrate` (its --unit, --chunk, --known-good, --jobs, --json too)."""
    p.add_argument("--mutate", action="store_true",
                   help="mutation testing: operator-level mutants of each unit's known-good source, deduplicated by "
                   "machine code, run through parity; a score per operator and unit (docs/mutation.md)")
    p.add_argument("--budget", type=int, default=None, metavar="N",
                   help=f"with --mutate: at most N mutants per operator and unit (default {DEFAULT_BUDGET})")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help=f"with --mutate: the seed that draws them (default {DEFAULT_SEED}; same seed, same mutants)")
    p.add_argument("--op", action="append", metavar="OP", help="with --mutate: only this operator (repeatable)")
    p.add_argument("--builds-only", action="store_true",
                   help="with --mutate: generate, deduplicate and build, judge nothing (exit 0 without a GPU)")
    p.add_argument("--no-screen", action="store_true",
                   help="with --mutate: run every mutant on the whole spec (default: first on its untimed cases, "
                   "the whole spec only where those pass)")
    p.add_argument("--write", action="store_true",
                   help="record what was measured with the target: with --mutate the judged table in "
                   "targets/<t>/mutation.json, else each spec's seed sweep (2+ sets) in targets/<t>/seed_sweep.json")


ONLY_WITH_MUTATE = ("budget", "seed", "op", "builds_only", "no_screen")


def stray_options(args) -> list[str]:
    """The --mutate options given without --mutate (each would be silently ignored)."""
    return [f"--{k.replace('_', '-')}" for k in ONLY_WITH_MUTATE if getattr(args, k, None) not in (None, False)]


def _log(args):
    return (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print


def generate(target, sources: dict[str, str], units: list[str], ops, budget: int, seed: int):
    """(the sampled mutations of `units` in order, {unit: {op: how many there were to draw from}})."""
    drawn, possible = [], {}
    for u in units:
        every = candidates(u, sources[u], ops)
        possible[u] = {o.name: sum(m.op == o.name for m in every) for o in ops}
        drawn += sample(every, budget, seed)
    return drawn, possible


def outcomes(built: list[Built], results: dict[str, dict], sources: dict[str, str], why_not_run: str) -> list[dict]:
    """One record per mutant: what it is, its diff against the known-good, and what became of it."""
    out = []
    for b in built:
        m = b.mutation
        rec = {"id": m.id, "unit": m.unit, "op": m.op, "location": m.location, "function": m.function,
               "where": m.where, "note": m.note}
        if b.status == DID_NOT_BUILD:
            rec.update(outcome="did-not-build", error=b.error)
        elif b.status == EQUIVALENT:
            rec.update(outcome="equivalent", reason="same machine code as the known-good")
        elif b.status == DUPLICATE:
            rec.update(outcome="duplicate", same_as=b.same_as)
        else:
            r = results.get(m.id) or {"outcome": "not-run", "error": why_not_run}
            rec.update({k: v for k, v in r.items() if k != "id" and v is not None})
        rec["diff"] = m.diff(sources[m.unit])  # the recorded table keeps the survivors' only
        out.append(rec)
    return out


@dataclass
class Plan:
    """What one --mutate run works on, settled before any compile."""
    target: object
    workspace: Path
    units: list[str]
    specs: dict
    sources: dict[str, str]  # unit -> known-good source (every unit that has one: the libraries link them)
    describe: str
    missing: dict[str, str]  # a unit asked for without a known-good -> why
    declared: dict
    ops: tuple
    gpu: bool
    why: str  # why parity cannot run here ("" when it can)
    workers: int | None
    log: object


def plan(args) -> Plan:
    """The run's units, sources and declarations; PorterError (one line, exit 2) on anything that stops it."""
    from porter.calibration.chunks import chunk_units
    from porter.calibration.mutate.known_good import known_good_sources
    from porter.commands.doctor import preflight
    from porter.gates import parity
    from porter.gates.parity.executors import use_executor
    from porter.spec import load_specs
    from porter.target import load_target

    ws = Path(args.workspace)
    target = load_target(ws, args.target, getattr(args, "source", None))
    workers = use_executor(args, args.mode)
    log = _log(args)
    ops = operators_named(args.op)
    args.budget = DEFAULT_BUDGET if args.budget is None else args.budget
    args.seed = DEFAULT_SEED if args.seed is None else args.seed
    if args.budget < 1:
        raise PorterError(f"--budget must be at least 1, not {args.budget}")
    declared = declared_mod.load(target.dir)  # a malformed file stops here, before any work
    specs = load_specs(target)
    units = args.unit or sorted(specs)
    unknown = [u for u in units if u not in specs]
    if unknown:
        raise PorterError(f"no parity spec for {', '.join(unknown)}")
    if getattr(args, "chunk", None):
        units = chunk_units(target, args.chunk, units)
    gpu, why = parity.available()
    if args.write and (args.builds_only or not gpu):
        raise PorterError("--write records a judged table: " + ("--builds-only judges nothing" if args.builds_only
                                                                 else f"parity cannot run here ({why})"))
    preflight(ws, target, "calibrate")  # nvcc, the toolkit, the sandbox: one line, exit 2
    sources, describe, missing = known_good_sources(target, args.known_good, units)
    for u, m in missing.items():
        log(f"  no known-good for {u}: {m}")
    units = [u for u in units if u in sources]
    if not units:
        raise PorterError("no unit to mutate: none of them has a known-good source")
    return Plan(target, ws, units, specs, sources, describe, missing, declared, ops, gpu, "" if gpu else why,
                workers, log)


def judge_all(args, p: Plan, built: list[Built], cache: Path) -> tuple[dict, dict]:
    """Every distinct mutant through parity (and perf) on the calibration's path: (known-good facts per unit,
    result per mutant id)."""
    from porter.calibration.calibrator import CalibrateOptions
    from porter.calibration.libraries import SourceLibraries
    from porter.calibration.mutate.runner import run_all
    from porter.gates.driver import ParityOptions

    opts = CalibrateOptions(p.workspace, p.units, None, True,
                            ParityOptions(mode=args.mode, sanitize=args.sanitize, timeout=args.timeout,
                                          timing_reps=args.timing_reps),
                            show_static=False, ledger=False, variants=False,
                            mutation_screen=not getattr(args, "no_screen", False))
    if getattr(args, "jobs", None):
        if args.jobs < 1:
            raise PorterError(f"--jobs must be at least 1, not {args.jobs}")
        opts.jobs = args.jobs
    elif p.workers:
        opts.jobs = p.workers  # one unit per cluster worker
    libs = SourceLibraries(p.target, cache, p.sources, p.describe)
    todo = [u for u in p.units if any(b.mutation.unit == u and b.status == DISTINCT for b in built)]
    return run_all(p.target, libs, built, todo, opts, out=p.log)


def make_report(args, p: Plan, built: list[Built], possible: dict, facts: dict, results: dict, judged: bool,
                seconds: float) -> tuple[dict, list[dict], list]:
    """(the report, the mutants with today's declarations applied, the declarations no mutant matched)."""
    from porter.gates import build as build_gate

    not_run = "--builds-only" if args.builds_only else f"parity needs a GPU: {p.why}"
    mutants = outcomes(built, results, p.sources, not_run)
    shown, unmatched = rep.declared_outcomes(mutants, p.declared)
    report = {
        "target": p.target.name, "known_good": p.describe, "seed": args.seed, "budget": args.budget,
        "ops": [o.name for o in p.ops], "judged": judged, "not_judged_because": None if judged else not_run,
        "toolchain": {"nvcc_version": build_gate.toolchain()["nvcc_version"],
                      "nvcc_flags": list(p.target.nvcc_flags)},
        "devices": sorted({f["device"] for f in facts.values() if f.get("device")}),
        "units": {u: {"spec_sha256": p.specs[u].sha256, "known_good_sha256": sha256_bytes(p.sources[u].encode()),
                      "candidates": possible[u], "known_good": facts.get(u)} for u in p.units},
        "missing_known_good": p.missing, "mutants": mutants, "summary": rep.summarize(shown),
        "declared_unmatched": [asdict(d) for d in unmatched], "seconds": round(seconds, 1),
    }
    return report, shown, unmatched


def run(args) -> int:
    from porter.gates import build as build_gate
    from porter.term import console, steps_factory

    t0 = time.monotonic()
    p = plan(args)
    drawn, possible = generate(p.target, p.sources, p.units, p.ops, args.budget, args.seed)
    cache = (Path(args.build_dir).expanduser() if args.build_dir else build_gate.cache_dir(p.workspace)).resolve()
    p.log(f"mutating {len(p.units)} unit(s) of {p.target.name} ({p.describe}): {len(drawn)} mutants "
          f"(budget {args.budget} per operator and unit, seed {args.seed})")
    progress = steps_factory(console(file=sys.stderr if args.json else None), plain=p.log)
    built = build_all(p.target, p.sources, drawn, cache, progress)
    judged = p.gpu and not args.builds_only
    facts, results = judge_all(args, p, built, cache) if judged else ({}, {})
    report, shown, unmatched = make_report(args, p, built, possible, facts, results, judged, time.monotonic() - t0)
    if args.write:
        path, what = rep.write_record(p.target, report)
        p.log(f"recorded {path} ({what})")
    if getattr(args, "report", None):
        Path(args.report).write_text(json.dumps(report, indent=1, default=str))
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        by_op = {o.name: sum(possible[u][o.name] for u in p.units) for o in p.ops}
        _print(report, report["summary"], by_op, shown, unmatched, p.target.symbol_prefix, judged)
    return _exit(args, report, report["summary"], p.gpu, p.why)


def _print(report: dict, summary: dict, possible: dict[str, int], shown: list[dict], unmatched, prefix: str,
           judged: bool) -> None:
    from porter.term import width

    cols = width()
    print(f"\n{rep.op_table(summary, possible, cols, judged)}")
    if judged:
        print(f"\n{rep.unit_table(summary, prefix, width=cols)}")
        surv = rep.survivors_text(shown)
        if surv:
            print(f"\n{surv}")
    for d in unmatched:
        print(f"declared equivalent but not produced by this run (stale, or not drawn): {d.unit} {d.op} {d.id}")
    c = summary["overall"]
    print(f"\n{c['generated']} mutants: {c['did-not-build']} did not build, {c['equivalent']} equivalent, "
          f"{c['duplicate']} duplicate, " + (f"{c['killed']} killed, {c['survived']} survived, score "
                                              f"{rep.score_text(c)}" if judged else f"{c['not-run']} built and "
                                              "waiting for parity") + f" ({report['seconds']} s)")


def _exit(args, report: dict, summary: dict, gpu: bool, why: str) -> int:
    if args.builds_only:
        return 0
    if not gpu:
        print(f"parity needs a GPU: {why}; {summary['overall']['not-run']} mutants built, none judged "
              "(--builds-only to stop after the builds)", file=sys.stderr)
        return 2
    refused = [u for u, f in report["units"].items() if f.get("known_good") and not f["known_good"]["ok"]]
    return 1 if refused or summary["overall"]["survived"] or summary["overall"]["not-run"] else 0


# ---------------------------------------------------------------------------
# the recorded table, as `porter calibrate` shows it
# ---------------------------------------------------------------------------

def recorded_scores(target, report: dict | None = None) -> dict | None:
    """The target's recorded mutation scores with today's declarations and specs (None: no table;
    {"error": why} for a table or declaration file that does not read: calibrate still reports)."""
    from porter.spec import load_specs

    try:
        if not rep.record_path(target).is_file():
            return None
        specs = {u: s.sha256 for u, s in load_specs(target).items()}
        return rep.recorded_scores(target, specs, declared_mod.load(target.dir))
    except PorterError as exc:
        return {"error": str(exc)}


def recorded_table(target, report: dict, width: int | None = None) -> str:
    """The mutation score of each calibrated unit from targets/<t>/mutation.json ("" without one)."""
    s = recorded_scores(target, report)
    if s is None:
        return ""
    if "error" in s:
        return f"mutation table: {s['error']}"
    units = sorted({r["unit"] for r in report.get("rows", [])})
    return rep.recorded_text(s, units, target.symbol_prefix, f"targets/{target.name}/{rep.RECORD}", width)
