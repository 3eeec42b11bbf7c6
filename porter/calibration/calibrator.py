"""Run every parity spec against a known-good backend and each of its mutants; record the outcome.

For each spec of the target:
  1. the known-good library must PASS it (else the spec rejects correct code, and
     a unit could never be verified against it), on every one of its seed sets
     (seed_sweep.py: K fresh sets, more near the tolerance; the record keeps each
     case's worst error/tolerance and the seeds that made it);
  2. every mutant of that unit must be REJECTED, by the check it names: a mutant
     caught by another check means the intended check is blind to what it is for.
A spec is calibrated (its "calibration" record is ok) only when 1 holds, it has
at least one mutant, and 2 holds for all of them: a spec nothing was shown to
reject proves nothing.  Records name the spec's sha256, so a spec edited since
is uncalibrated again (porter.records.history.calibration_status).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from porter.calibration import seed_sweep
from porter.calibration.libraries import BuildError, UpstreamLibraries
from porter.gates.mutants import Mutant, digest_of, load_mutants
from porter.calibration.variants import VariantPlan
from porter.digest import sha256_file
from porter.errors import PorterError
from porter.records.evidence import store_evidence
from porter.gates import perf, registry, static
from porter.gates.evidence import ParityEvidence
from porter.gates.driver import Candidate, GateContext, ParityOptions, refusal, run_gates
from porter.gates.parity.compare import CHECK_ORDER
from porter.gates.parity.gate import fresh_seeds
from porter.gates.result import GateResult
from porter.spec import inputs_facts, load_specs
from porter.gates.perf import calibrated_limit
from porter.records.ledger import Ledger
from porter.term import Steps


@dataclass
class CalibrateOptions:
    workspace: Path
    units: list[str] | None = None  # None: every spec
    mutants: list[str] | None = None  # names to run; None: all of the units'
    with_mutants: bool = True
    parity: ParityOptions = field(default_factory=ParityOptions)
    show_static: bool = True  # the static gate's verdict on each whole-file mutant (an informative column)
    ledger: bool = True
    variants: bool = True  # also run the known-good with each of its env-knob variants (variants.py)
    jobs: int = field(default_factory=lambda: min(4, os.cpu_count() or 1))  # parity runs in flight at once
    progress: object = None  # (what, total) -> porter.term.Steps: the command's bar or log lines; None: silent
    slots: "RunSlots | None" = None  # calibrate() sets it: the runs in flight over every unit; None: one at a time
    # seed sets the known-good runs on per spec (seed_sweep.py; `porter calibrate --seed-sets`, default 20
    # there); 1: one run, as before the sweep (what a library caller gets unless it asks)
    seed_sets: int = 1
    # mutation testing: each mutant first on the spec's untimed cases, the whole spec only where those pass
    # (porter.calibration.mutate.runner)
    mutation_screen: bool = True


class RunSlots:
    """The parity runs a calibration has in flight at once, over all its units: --jobs of them.  Each run
    holds its inputs and references in host memory (gigabytes for ds4's MoE cases), so the bound is on
    runs, not units.  Within it one spec's variants and mutants run side by side: on two H200s through
    Ray, a chunk's wall time was one spec's (the Q8_0 matmul and its mutants, one after another) while
    the other GPU had nothing left to do."""

    def __init__(self, n: int):
        self.sem = threading.BoundedSemaphore(max(1, n))
        self.pool = ThreadPoolExecutor(max_workers=max(1, n), thread_name_prefix="porter-calibrate-run")

    def run(self, fn):
        with self.sem:
            return fn()

    def map(self, fns: list) -> list:
        """Each fn's result, in order; the runs side by side within the bound."""
        futures = [self.pool.submit(self.run, f) for f in fns]
        return [f.result() for f in futures]

    def close(self) -> None:
        self.pool.shutdown(wait=True)


@dataclass
class Row:
    unit: str
    kind: str  # "known-good" | "variant" (known-good with env knobs) | "adversarial" | "scripted" | "rules"
    name: str
    expect: str  # "pass" | check name | "any"
    got: str  # "pass" | the check that refused it | "skipped" | "build-error" | "uncalibrated"
    ok: bool
    summary: str
    seconds: float = 0.0
    failed_checks: list[str] = field(default_factory=list)
    static: str | None = None
    worst_nmse: float | None = None
    timing: dict | None = None
    probe: dict = field(default_factory=dict)  # stream-probe outcomes over all calls: clean/changed/inconclusive


def _probe_counts(res) -> dict:
    out: dict = {}
    for c in ParityEvidence.of(res.evidence).cases or []:
        for p in c.get("passes", []):
            k = p.get("probe") or "none"
            out[k] = out.get(k, 0) + 1
    return out


def parity_on_library(target, unit: str, lib: Path, opts: CalibrateOptions, timeout: float | None = None,
                      env: dict | None = None, seeds: list[int] | None = None, fresh_process: bool = False,
                      screen: bool = False):
    """The unit gates judging output (the registry's: parity, and any other registered so), through the
    one driver, on a library that holds the unit under test (a typed library candidate): the first
    refusal, else the first of them's verdict (parity's: its evidence is what calibration keeps).
    env: a known-good variant's knobs, set in the parity child; seeds: the same for every library
    of one unit, so its inputs and references are prepared once; fresh_process: a fresh child holding the
    GPU alone (a perf re-time; any timed run where warm workers share the GPU).
    Where they share it (--per-gpu K > 1) a warm run makes no timed calls: its neighbours would slow them, and
    parity's own timing checks (the exchange measured from outside the candidate's process, the roofline)
    would refuse correct code for their load -- measured: upstream's indexer QAT at 2048 tokens, 2.4 ms more
    from outside than its events said.  Its values decide; a run whose timing matters is made alone
    (timed_alone).  screen: the spec's untimed cases only (ParityOptions.screen; a mutation screen)."""
    shared = not fresh_process and baseline_alone()
    parity = ParityOptions(**{**asdict(opts.parity), "timeout": timeout or opts.parity.timeout,
                              **({"env": env} if env else {}), **({"seeds": seeds} if seeds else {}),
                              "fresh_process": fresh_process, "screen": screen,
                              **({"timing_reps": 0} if shared else {})})
    ctx = GateContext(target, opts.workspace, parity=parity, library=Path(lib))
    results = run_gates(Candidate.library(unit, lib), ctx, gates=registry.names(registry.UNIT, role=registry.OUTPUT))
    return refusal(results) or results[0]


def baseline_alone() -> bool:
    """Whether the known-good's run, the perf baseline of the unit's mutants, must be a fresh child holding
    the GPU alone: where warm workers share a GPU (--per-gpu K > 1), a warm run's timing is a busy GPU's."""
    from porter.gates.parity import executors

    return executors.workers_per_gpu() > 1


# parity's checks of the timed calls themselves (porter/gates/parity/compare.py): a mutant named for one must be
# run with timed calls, which a run on a shared GPU does not make
TIMED_CHECKS = ("timing", "impossible")


def timed_alone(target, unit: str, lib: Path, opts: CalibrateOptions, first, seeds: list[int],
                timeout: float | None = None):
    """A run perf will judge: `first` itself where the GPU is not shared, else, when `first` passed on its
    values, the same library on the same seeds again in a fresh child alone on the GPU, with its timed calls
    and every check of them (a mutant that games its timing is refused there by parity's timing checks)."""
    if not baseline_alone() or not first.ok:
        return first
    return parity_on_library(target, unit, lib, opts, timeout=timeout, seeds=seeds, fresh_process=True)


def perf_on_mutant(target, unit: str, parity, known_good, retime_fn):
    """The perf gate's verdict on a perf mutant that passed parity, against the known-good run of this same
    calibration (same seeds, same device, same regime); `retime_fn`: its parity again in a fresh process."""
    base, why = perf.known_good_baseline(known_good)
    return perf.decide(target, unit, parity, base, why, retime_fn)


class MutantRun(NamedTuple):
    parity: GateResult  # the run alone where one was made: the one perf judged
    perf: GateResult | None  # None: perf was not asked for, or parity refused

    @property
    def verdict(self) -> GateResult:
        return self.perf if self.perf is not None else self.parity


def parity_then_perf(target, unit: str, lib: Path, opts: CalibrateOptions, known_good: GateResult,
                     seeds: list[int], timeout: float | None, *, timed: bool = True,
                     judge_perf: bool = True) -> MutantRun:
    """A mutant judged the one way calibration, mutation testing and the perf table all judge one: parity on
    its values first (a warm worker sharing the GPU makes no timed call), then, where that passed and the GPU
    is shared, again alone in a fresh child with its timed calls (timed_alone), so that parity's timing checks
    and perf see a quiet GPU; then, where parity passed, perf against `known_good` (the known-good's run on the
    same seeds, device and regime).
    timed: whether its timed calls matter (perf judges it, or a check of the timed calls must refuse it);
    where they do not, the run alone would be one more GPU run that decides nothing.
    judge_perf: whether perf judges it; where a parity check alone must refuse it, perf's verdict on it would
    replace the one that counts."""
    r = parity_on_library(target, unit, lib, opts, timeout=timeout, seeds=seeds)
    if timed:
        r = timed_alone(target, unit, lib, opts, r, seeds, timeout)
    if not (judge_perf and r.ok):
        return MutantRun(r, None)
    return MutantRun(r, perf_on_mutant(target, unit, r, known_good, lambda: parity_on_library(
        target, unit, lib, opts, timeout=timeout, fresh_process=True)))


def _row(unit, kind, name, expect, res, ok, seconds, static_verdict=None) -> Row:
    m = res.metrics or {}
    return Row(unit, kind, name, expect, res.word, ok, res.summary, round(seconds, 2), m.get("failed_checks", []),
               static_verdict, m.get("worst_nmse"), _timing_of(res), _probe_counts(res))


def _timing_of(res) -> dict | None:
    t = ParityEvidence.of(res.evidence).timing
    return t.dump() if t is not None else None


def _static_verdict(target, m: Mutant) -> str | None:
    if m.source is None:
        return None
    try:
        return "pass" if static.run(Candidate.of(m.unit, m.source), GateContext(target)).ok else "reject"
    except Exception as exc:  # noqa: BLE001 - informative column only
        return f"error: {type(exc).__name__}"


def select_mutants(target, libs, units: list[str], opts: CalibrateOptions) -> list[Mutant]:
    every = load_mutants(target)
    if opts.mutants:
        unknown = sorted(set(opts.mutants) - {m.name for m in every})
        if unknown:
            raise PorterError(f"no mutant named {', '.join(unknown)} for target {target.name}")
        every = [m for m in every if m.name in opts.mutants]
    elif not opts.with_mutants:
        return []
    if isinstance(libs, UpstreamLibraries):  # a whole-file mutant cannot replace part of one translation unit
        every = [m for m in every if m.source is None]
    return [m for m in every if m.unit in units]


def calibrate(target, libs, opts: CalibrateOptions, out=print) -> dict:
    specs = load_specs(target)
    units = opts.units or sorted(specs)
    unknown = [u for u in units if u not in specs]
    if unknown:
        raise PorterError(f"no parity spec for {', '.join(unknown)}")
    mutants = select_mutants(target, libs, units, opts)
    t0 = time.monotonic()
    progress = opts.progress or Steps
    libs.prepare(mutants, progress)
    good = libs.known_good()
    build_s = time.monotonic() - t0
    out(f"known-good: {libs.describe} -> {good}  ({build_s:.1f} s to build, {len(mutants)} mutant(s))")

    plan = VariantPlan(target) if opts.variants and isinstance(libs, UpstreamLibraries) else None
    # Units side by side: each one's inputs and references are host work (minutes for the prefill
    # MoE) while its parity children take the GPU one at a time through the worker pool.  Each
    # unit's lines are printed together when it ends; rows and records keep the units' order.
    # Heaviest first (parity runs: the known-good, its variants, its mutants), each unit to the first
    # free slot: the longest-first schedule --chunk used across runs, here across the --jobs slots
    # (with --executor ray, one per GPU of the cluster), so one command calibrates a whole target.
    # A unit's variants and mutants share the --jobs run slots with the other units' runs (RunSlots).
    heaviest = sorted(units, key=lambda u: (-calibration_runs(u, plan, mutants), units.index(u)))
    slots = RunSlots(opts.jobs)
    unit_opts = replace(opts, slots=slots)
    try:
        with progress(f"calibrating {len(units)} specs", len(units)) as steps, \
                ThreadPoolExecutor(max_workers=max(1, min(opts.jobs, len(units) or 1))) as pool:
            def one(u):
                steps.working_on(u)
                try:
                    return _calibrate_unit(target, libs, unit_opts, good, plan, mutants, specs, u, out)
                finally:
                    steps.advance()

            started = {u: pool.submit(one, u) for u in heaviest}
            done = [started[u].result() for u in units]
    finally:
        slots.close()
    rows: list[Row] = [r for unit_rows, _ in done for r in unit_rows]
    records: dict[str, dict] = {u: rec for u, (_, rec) in zip(units, done)}
    report = {"target": target.name, "known_good": libs.describe, "library": str(good),
              "rows": [asdict(r) for r in rows], "seconds": round(time.monotonic() - t0, 1),
              "build_seconds": round(build_s, 1),
              "inputs": {u: inputs_facts(specs[u]) for u in units},
              "seed_sweep": {u: rec["seed_sweep"] for u, rec in records.items() if rec.get("seed_sweep")},
              "device": next((gpu for rec in records.values() if rec.get("evidence")
                              and (gpu := ParityEvidence.of(rec["evidence"]).gpu)), None)}
    if opts.ledger:
        record(target, opts.workspace, records, libs.describe, good)
    return report


_OUT_LOCK = threading.Lock()


def calibration_runs(unit: str, plan, mutants: list[Mutant]) -> int:
    """Parity runs a unit's calibration makes: the known-good, its env-knob variants, its mutants."""
    return 1 + (len(plan.for_unit(unit)) if plan is not None else 0) + sum(1 for m in mutants if m.unit == unit)


def _calibrate_unit(target, libs, opts: CalibrateOptions, good: Path, plan, mutants: list[Mutant], specs: dict,
                    unit: str, emit) -> tuple[list[Row], dict]:
    """One spec on the known-good, its variants and its mutants: (rows, the unit's record).
    Its lines go to `emit` together when it ends (units run side by side)."""
    lines: list[str] = []
    try:
        return _unit_runs(target, libs, opts, good, plan, mutants, specs, unit, lines.append)
    finally:
        with _OUT_LOCK:
            for ln in lines:
                emit(ln)


def _unit_runs(target, libs, opts, good, plan, mutants, specs, unit, out) -> tuple[list[Row], dict]:
    rows: list[Row] = []
    if not libs.has(unit):
        return ([Row(unit, "known-good", "-", "pass", "uncalibrated", False, "no known-good implementation of this unit")],
                {"ok": False, "summary": "no known-good implementation", "known_good_ok": None})
    t1 = time.monotonic()
    seeds = opts.parity.seeds or fresh_seeds(2)
    slots = opts.slots
    run = slots.run if slots is not None else (lambda fn: fn())
    res = run(lambda: parity_on_library(target, unit, good, opts, seeds=seeds, fresh_process=baseline_alone()))
    rows.append(_row(unit, "known-good", libs.describe, "pass", res, res.ok, time.monotonic() - t1))
    out(f"  {'ok ' if res.ok else 'BAD'} {unit}: {res.summary}")
    if not res.ok:
        out("\n".join("      " + ln for ln in (res.diagnostics or "").splitlines()[:40]))
    variants = plan.for_unit(unit) if plan is not None else []
    mine = [m for m in mutants if m.unit == unit]

    def variant_run(v):
        t2 = time.monotonic()
        r = parity_on_library(target, unit, good, opts, env=v.env, seeds=seeds)
        return r, time.monotonic() - t2

    def mutant_run(m):
        t2 = time.monotonic()
        try:
            lib = libs.mutant(m)
        except (BuildError, PorterError) as exc:
            return exc, 0.0, None
        # judged against this calibration's known-good run, made above
        r = parity_then_perf(target, unit, lib, opts, res, seeds, m.timeout,
                             timed=m.perf or m.must_fail_check in TIMED_CHECKS, judge_perf=m.perf).verdict
        return r, time.monotonic() - t2, _static_verdict(target, m) if opts.show_static else None

    # after the known-good run (the perf mutants' baseline), the unit's other runs side by side in the slots
    jobs = [lambda v=v: variant_run(v) for v in variants] + [lambda m=m: mutant_run(m) for m in mine]
    results = slots.map(jobs) if slots is not None else [j() for j in jobs]
    variants_ok = 0
    for v, (r, seconds) in zip(variants, results[:len(variants)]):
        variants_ok += r.ok
        rows.append(_row(unit, "variant", v.name, "pass", r, r.ok, seconds))
        out(f"      {'ok ' if r.ok else 'BAD'} variant {v.name}: {r.summary[:200]}")
    rejected = 0
    for m, (r, seconds, static_verdict) in zip(mine, results[len(variants):]):
        if isinstance(r, Exception):
            rows.append(Row(unit, m.origin, m.name, m.must_fail_check, "build-error", False, str(r)))
            out(f"      BUILD-ERROR {m.name}: {r}")
            continue
        ok = m.rejected_by(r.word)
        rejected += ok
        rows.append(_row(unit, m.origin, m.name, m.must_fail_check, r, ok, seconds, static_verdict))
        out(f"      {'ok ' if ok else 'BAD'} {m.name}: want {m.must_fail_check}, got {r.word}: {r.summary[:200]}")
    # the known-good on more seed sets (seed_sweep.py): the run above is set 1; a refused or skipped set 1
    # already decides, so only a passing spec is swept
    k = max(1, opts.seed_sets) if res.ok else 1
    sets = seed_sweep.sweep(lambda s: parity_on_library(target, unit, good, opts, seeds=s),
                            dict(getattr(specs[unit], "outputs", None) or {}), k, first=(seeds, res),
                            map_fn=slots.map if slots is not None else None)
    sweep = seed_sweep.summary(sets, k)
    if k > 1:
        w = sweep["worst"]
        said = (sweep["reason"] if not sweep["ok"] else
                f"worst {seed_sweep.ratio_text(w['ratio'])} of tolerance ({w['output']} {w['metric']}, {w['case']!r})"
                if w else "no toleranced output")
        bad_set = seed_sweep.first_failure(sets)
        rows.append(Row(unit, "seed-sets", f"{len(sets)} seed sets", "pass",
                        "pass" if sweep["ok"] else (bad_set.check or ("skipped" if bad_set.skipped else "refused")),
                        sweep["ok"], said[:300]))
        out(f"      {'ok ' if sweep['ok'] else 'BAD'} {len(sets)} seed sets: {said[:200]}")
    summary = res.summary[:300] if mine else f"no mutant: nothing shows this spec rejects anything; {res.summary}"[:300]
    if not sweep["ok"] and res.ok:
        summary = f"{sweep['reason']}; {summary}"[:300]
    if variants_ok < len(variants):
        summary = f"refuses {len(variants) - variants_ok} of upstream's {len(variants)} env-knob variants; {summary}"[:300]
    blind = ParityEvidence.of(res.evidence).zero_answer_passes or []
    if blind:
        summary = (f"an all-zero answer passes {len(blind)} case(s) (reference too small for the tolerance): "
                   f"{blind[0]}; {summary}")[:300]
        out(f"      BAD zero answer passes: {'; '.join(blind)[:300]}")
    good_everywhere = res.ok and variants_ok == len(variants) and sweep["ok"]
    rec = {"ok": good_everywhere and bool(mine) and rejected == len(mine) and not blind,
           "summary": summary, "known_good_ok": good_everywhere, "seed_sweep": sweep,
           "variants": len(variants), "variants_ok": variants_ok, "mutants": len(mine), "mutants_rejected": rejected,
           "mutant_digests": {m.name: digest_of(m) for m in mine},
           "mutant_scope": "rules" if isinstance(libs, UpstreamLibraries) else "all",
           # a skipped run (a spec or harness error) measured nothing: no evidence to keep
           "evidence": None if res.skipped else res.evidence, "spec": specs[unit]}
    return rows, rec


def record(target, workspace: Path, records: dict, describe: str, good_lib: Path, ledger=None) -> None:
    """One ledger "calibration" record per spec, with the known-good run as its evidence.
    ledger: the caller's open ledger (a run's, which serialises appends); else this user's."""
    ledger = ledger if ledger is not None else Ledger.open(Path(workspace))  # signed in a signed workspace
    lib_sha = sha256_file(good_lib)
    for unit, r in records.items():
        spec = r.get("spec")
        ev_sha = None
        if r.get("evidence"):
            ev = dict(r["evidence"], candidate_sha256=r["evidence"].get("candidate_sha256") or lib_sha,
                      calibration_role="known-good")
            if r.get("seed_sweep"):  # per case: the worst error/tolerance over every seed set, and its seeds
                ev["seed_sweep"] = r["seed_sweep"]
            timing = ParityEvidence.of(ev).timing
            if timing is not None and timing.median_ms:
                # the perf limit this known-good's own spread allows, kept with the calibration it came from
                ev["perf_limit"] = calibrated_limit(timing.dump())
            ev_sha = store_evidence(Path(workspace), ev)
        ledger.append("calibration", target=target.name, unit=unit, ok=bool(r["ok"]),
                      spec_sha256=spec.sha256 if spec else None,
                      spec_file=str(spec.path.name) if spec and spec.path else None,
                      known_good=describe, known_good_sha256=lib_sha, known_good_ok=r.get("known_good_ok"),
                      mutants=r.get("mutants", 0), mutants_rejected=r.get("mutants_rejected", 0),
                      mutant_digests=r.get("mutant_digests"), mutant_scope=r.get("mutant_scope"),
                      summary=r.get("summary", ""), evidence=ev_sha,
                      **({"seed_sweep": seed_sweep.compact(r["seed_sweep"])} if r.get("seed_sweep") else {}))


# ---------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------

def table(report: dict, width: int | None = None) -> str:
    """One line per run: what it must do and what it did (term.Table: fits `width`, None = no limit)."""
    from porter.term import Column, Table

    t = Table([Column("unit", key=True), Column("kind"), Column("candidate"), Column("must"), Column("got"),
               Column("verdict")], rule=False)
    for r in report["rows"]:
        t.add_row(r["unit"], r["kind"], r["name"] if r["kind"] != "known-good" else "known-good", r["expect"],
                  r["got"], "ok" if r["ok"] else "WRONG")
    return t.text(width)


# the rows of the known-good itself: its run, its env-knob variants, its other seed sets (seed_sweep.py)
GOOD_KINDS = ("known-good", "variant", "seed-sets")

MATRIX_LEGEND = ("cells: mutants rejected by that check (the first check that failed); '!' = not the check the "
                 "mutant names; good: P = known-good (each env-knob variant, each seed set) passed, X = one was rejected "
                 "(broken spec)")


def matrix(report: dict, prefix: str = "", width: int | None = None) -> str:
    """unit x check: how many mutants each check rejected (known-good pass shown as 'P')."""
    import textwrap

    from porter.term import Column, Table

    rows = report["rows"]
    units = sorted({r["unit"] for r in rows})
    used = [c for c in CHECK_ORDER if any(r["got"] == c for r in rows)]
    t = Table([Column("unit", key=True), Column("good", right=True)] + [Column(c, right=True) for c in used],
              rule=False)
    for u in units:
        good = [r for r in rows if r["unit"] == u and r["kind"] in GOOD_KINDS]
        g = "P" if good and all(r["ok"] for r in good) else ("-" if not good else "X")
        cells = []
        for c in used:
            hits = [r for r in rows if r["unit"] == u and r["kind"] not in GOOD_KINDS and r["got"] == c]
            cells.append((f"{len(hits)}" + ("!" if any(not r["ok"] for r in hits) else "")) if hits else ".")
        t.add_row(u.removeprefix(prefix).removesuffix("_tensor"), g, *cells)
    legend = textwrap.fill(MATRIX_LEGEND, width) if width else MATRIX_LEGEND
    return t.text(width) + "\n" + legend


INPUTS_LEGEND = ("cases: ok cases per seed; edge: how many sit at a numerical edge (Shape.edge); inputs: the "
                 "distributions they are drawn from (UnitSpec.inputs)")


def inputs_table(report: dict, prefix: str = "", width: int | None = None) -> str:
    """Per op spec: its ok cases, how many sit at a numerical edge, and its declared input distributions."""
    import textwrap

    from porter.term import Column, Table

    ops = {u: f for u, f in (report.get("inputs") or {}).items() if f["cases"]}  # runtime scenarios draw no numbers
    if not ops:
        return ""
    t = Table([Column("unit", key=True), Column("cases", right=True), Column("edge", right=True)], tail="inputs",
              rule=False, tail_style=None)
    for u, f in ops.items():
        t.add_row(u.removeprefix(prefix).removesuffix("_tensor"), f["cases"], len(f["edges"]),
                  tail=f["inputs"] or "UNDECLARED")
    legend = textwrap.fill(INPUTS_LEGEND, width) if width else INPUTS_LEGEND
    return t.text(width) + "\n" + legend
