"""`porter run`: prompt -> answer -> gates (extract first) -> one commit per passing step.

One module per job: attempt (one attempt and its landing), reconcile, scheduler
(which units, in what order, --jobs slots), progress (terminal), kill (test hooks).

Durable writes, in the order they happen, and what a SIGKILL after each leaves
(the next run repairs it before doing anything else, see `reconcile`):

  per attempt
   1. runs/<run>/<unit>/attempt-N.{prompt,response}.md   (ignored by git; nothing to repair)
   2. ledger "attempt"        -> kill: an attempt with no verdict; reconcile appends
                                 "reconcile" action=abandon-attempt, and the unit is tried again
                                 (the scripted provider replays the same answer).
   3. per gate: evidence file (ledger/evidence/<sha>.json), then ledger "gate"
                              -> kill: an orphan evidence file (content-addressed, harmless) or
                                 gate records with no verdict: same as 2.
  on a failure
   4. runs/diagnostics/<sha>.txt, then ledger "failure"
                              -> kill: the attempt is concluded; the next run continues with the
                                 next attempt.  (Kill before the record: same as 2.)
   5. after the last failed attempt: ledger "exhausted".
  on success
   4. the unit file, written to a temp file, fsynced, renamed over targets/<t>/ported/<unit>.cu
                              -> kill: a unit file holding the candidate of a verdict-less attempt:
                                 reconcile restores the committed version and abandons the attempt.
   5. ledger "step" (candidate sha256, evidence sha256s)
                              -> kill: a step with no commit whose file on disk is the candidate:
                                 reconcile makes that commit now (a step whose file does not match is
                                 abandoned with a "reconcile" record).
   6. git commit of the unit file + ledger/ (ledger.jsonl and the evidence) with the step's trailers
                              -> kill after: nothing to do.  A step is committed iff a commit
                                 reachable from HEAD carries `Porter-Step: <its record hash>`,
                                 so no step is ever committed twice.
  end of run: the ledger records since the last step commit are committed as "porter: ledger of run <id>".

PORTER_TEST_KILL_AT=<point>[:<n>] makes the process SIGKILL itself right after
the n-th (default first) durable write named <point> (porter.run.kill); the
crash tests use it to check every row of the table above.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from porter.records import gitops
from porter.calibration.baseline import take_baselines
from porter.commands.doctor import preflight
from porter.gates.build import cache_dir, check_environment
from porter.errors import PorterError
from porter.host.toolchain import nvcc_path
from porter.gates import registry
from porter.gates.driver import Candidate, GateContext, run_gates
from porter.gates.e2e.state import E2E_UNIT, head_backend_tree, prefill_status, run_e2e_if_due
from porter.gates.e2e.throughput_state import throughput_due, throughput_records_from_ledger
from porter.gates.result import GateResult
from porter.records.history import Usage
from porter.records.ledger import Ledger, load_key
from porter.records.lock import RunLock
from porter.providers import get_provider
from porter.run.attempt import Run
from porter.run.progress import Reporter
from porter.run.reconcile import reconcile
from porter.run.scheduler import exhausted_line, ordered_units, schedule, select_units, verify_deferred
from porter.records.signing import signer_for
from porter.commands.status import derive, tamper_check
from porter.target import load_target


def parse_duration(text: str | None) -> float | None:
    """'30m', '2h', '90s', '1h30m', '45' (seconds) -> seconds."""
    if text is None:
        return None
    s = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", s)
    if not parts or "".join(f"{a}{b}" for a, b in parts) != s.replace(" ", ""):
        raise PorterError(f"--time-budget {text!r}: use e.g. 30m, 2h, 90s or 1h30m")
    return sum(float(a) * {"h": 3600, "m": 60, "s": 1}[b] for a, b in parts)


@dataclass
class RunOptions:
    """What `porter run` was asked to do (the CLI builds it; tests may too)."""

    workspace: Path
    target: str | None = None
    source: str | None = None
    units: list[str] = field(default_factory=list)  # explicit --unit: only these, exhausted ones retried
    max_attempts: int = 3
    max_units: int | None = None
    time_budget: str | None = None
    quiet: bool = False
    provider: dict = field(default_factory=dict)  # provider, model, base_url, prices, budgets
    jobs: int = 1  # units in flight at once (provider calls in parallel, gates through the worker pool)


def check_options(target, opts: RunOptions) -> float | None:
    """One-line errors for bad options, before anything is written; returns the time budget in seconds."""
    for u in opts.units:
        target.api_function(u)  # unknown unit -> one-line error
        if u not in target.units:
            raise PorterError(f"{u} is listed in [units].skip of {target.name}'s target.toml: it is not ported")
    if opts.max_attempts < 1:
        raise PorterError("--max-attempts must be at least 1")
    if opts.jobs < 1:
        raise PorterError("--jobs must be at least 1")
    budget_s = parse_duration(opts.time_budget)
    nvcc_path()  # no nvcc, no run
    if not target.conventions_header.is_file():
        raise PorterError(f"target {target.name} has no CUDA conventions header "
                          f"({target.conventions_header.relative_to(opts.workspace)}): units cannot build until it is written")
    return budget_s


def run(opts: RunOptions) -> int:
    ws = opts.workspace
    target = load_target(ws, opts.target, opts.source)
    opts.units = list(dict.fromkeys(opts.units))  # repeated --unit: once
    budget_s = check_options(target, opts)
    preflight(ws, target, "run", opts.provider)  # nothing is asked for on a machine that cannot judge it
    key = load_key(ws)
    provider = get_provider(opts.provider.get("provider"), target, opts.provider)
    if opts.provider.get("answer_delay_s"):
        from porter.providers.delayed import DelayedProvider

        provider = DelayedProvider(provider, opts.provider["answer_delay_s"])
    signer = signer_for(ws)  # a signed workspace and no key, or another key: one line, exit 3

    return locked(ws, target, key, lambda: _run_locked(opts, target, key, provider, signer, budget_s))


def locked(ws: Path, target, key, body: Callable[[], int]) -> int:
    """`body` under the workspace's run lock (porter run and porter optimize): 0 at once when another run
    holds it (cron never piles up), and never over a tampered or rolled-back workspace."""
    from porter.workspace import require_made_by_porter

    require_made_by_porter(ws)  # never porter's own checkout, nor a repository `porter init` did not make
    lock = RunLock(ws)
    with lock as held:
        if not held:
            print(f"porter: another porter run is active (pid {lock.holder() or '?'}); nothing to do")
            return 0
        # a run appends to the ledger and commits it: over a tampered or rolled-back workspace that would
        # bury the evidence, so it refuses (exit 3) and `porter repair` is the way on
        if (found := tamper_check(ws, target, key)) is not None:
            raise PorterError(f"workspace {found[0]}, not starting: {found[1]}; see `porter status`, and `porter "
                              f"repair --reason TEXT` to accept the loss and go on", exit_code=3)
        return body()


def open_run(ws: Path, target, key, provider, signer, *, suffix: str = "", quiet: bool = False) -> Run:
    """A run's id, folder and log, and its ledger made whole (a torn tail moved aside, what a crash left
    reconciled with git): where porter run and porter optimize start, under `locked`.  The caller closes
    r.out."""
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}{suffix}"
    run_dir = ws / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    out = Reporter(run_dir / "run.log", quiet=quiet)
    try:
        ledger = Ledger(ws, key, signer)
        if ledger.repair_torn_tail():
            out.line("ledger: a torn last line (interrupted write) was moved aside and recorded", "yellow")
        for line in reconcile(ws, target, ledger, out):
            out.line(f"reconcile: {line}", "yellow")
        return Run(ws, target, provider, ledger, out, run_id, run_dir)
    except BaseException:
        out.close()
        raise


def _run_locked(opts: RunOptions, target, key, provider, signer, budget_s: float | None) -> int:
    ws = opts.workspace
    started = time.monotonic()
    r = open_run(ws, target, key, provider, signer, quiet=opts.quiet)
    out, run_id, run_dir = r.out, r.run_id, r.run_dir
    try:
        if hasattr(getattr(provider, "budget", None), "seed"):
            provider.budget.seed([u for u in r.history().records if isinstance(u, Usage)])
        order = opts.units or ordered_units(target, out)
        todo, reverify, skipped = select_units(target, r.history(), order, bool(opts.units), r)
        for line in skipped if opts.units else []:
            out.line(f"{line}: nothing to do", "dim")
        out.line(f"porter run {run_id}: target {target.name}, provider {provider.describe()}, "
                 f"{len(todo)} unit(s) to port, {len(skipped)} already done or skipped", "bold")
        if not opts.units and (line := exhausted_line(skipped, opts.max_attempts)):
            out.line(line, "magenta")
        if todo or reverify:
            # the glue and a placeholder compile before the first answer is asked for: a toolkit that
            # lacks a header the conventions include stops here (exit 2), never as a unit's failure
            check_environment(target, cache_dir(ws))
        if not r.parity_ok:
            out.line(f"parity: not available here ({r.parity_reason}); passing units are committed as 'built'", "yellow")
        elif todo:
            take_baselines(target, ws, r.history(), todo, r.ledger, line=out.line)
        results: dict[str, str] = {}
        out_of_time = lambda: budget_s is not None and time.monotonic() - started > budget_s  # noqa: E731
        stop_reason = schedule(todo, r, opts, reverify, out_of_time, results)
        stop_reason = stop_reason or verify_deferred(r, opts, results, out_of_time)
        return finish(ws, target, r, results, stop_reason, run_dir)
    finally:
        out.close()


def end_to_end(ws: Path, target, r: Run) -> None:
    """The backend gates on the whole backend once every prefill-tier unit is verified, and again after
    any of them changed (a new backend tree at HEAD): e2e (its record is what status's prefill line
    reads), then throughput on a backend e2e passed; throughput alone where e2e passed on this tree
    before and its speed was never measured (a run cut short, a porter that had no throughput gate)."""
    if target.spec.e2e is None or not r.parity_ok:
        return
    report = derive(ws, target=target)
    states = {u.unit: u.state for u in report.units}
    prefill_units = [u.unit for u in report.units if u.tier == "prefill"]
    output_gates = registry.names(registry.BACKEND, role=registry.OUTPUT)

    def record(res: GateResult) -> None:
        r._record_gate(E2E_UNIT, 0, res)
        colour = "green" if res.ok else "yellow" if res.skipped else "red"
        r.out.line(f"{res.gate}: {res.summary}", colour)

    def build_and_run(gates: tuple[str, ...], proven: tuple[str, ...] = ()) -> GateResult:
        """`gates` on the backend as committed, each result recorded as it comes; `proven`: gates whose
        passing record on this very tree stands for them (what a gate's `needs` asks for)."""
        # the candidate: the whole backend as committed, named by its tree hash (what status's prefill
        # line compares with HEAD's)
        backend = Candidate.backend(E2E_UNIT, head_backend_tree(ws, target))
        # a silent step of minutes (ds4: about 280 s on an H200) reads as a hang in a cron log
        r.out.line(f"{', '.join(gates)}: building the engine on the reference and the ported backend, then "
                   "running both")
        ctx = GateContext(target, ws, progress=getattr(r.out, "steps", None), log=r.out.line)
        for name in proven:
            ctx.results[name] = GateResult(name, True, f"{name} passed on this backend tree (its record)")
        # its library: the library gates link one unit's current file with every other unit's (any unit
        # will do; the library gates judge one unit, so one is named as the build's anchor)
        anchor = (prefill_units or target.units)[0]
        library = registry.names(registry.UNIT, role=registry.LIBRARY)
        built = run_gates(Candidate.of(anchor, target.unit_path(anchor).read_text()), ctx, gates=library)[-1]
        if not built.ok:
            res = GateResult(gates[0], False, f"{gates[0]}: the backend does not build: {built.summary}",
                             check=built.gate)
            record(res)
            return res
        return run_gates(backend, ctx, gates=gates, on_result=record)[0]

    # a target without [e2e.throughput] has no benchmark to run: no skipped record per backend tree
    speed = registry.names(registry.BACKEND, role=registry.SPEED) if target.spec.e2e.throughput else ()
    ran = run_e2e_if_due(target, ws, states, prefill_units, r.history().mine,
                         run=lambda: build_and_run(output_gates + speed), record=lambda res: None)
    if ran is not None:
        return
    records = r.history().mine
    verified_here = prefill_status(ws, target, records)[0] == "verified"
    if speed and throughput_due(
            throughput_records_from_ledger(ws, target.name, records), head_backend_tree(ws, target),
            verified_here)[0]:
        build_and_run(speed, proven=output_gates)


def finish(ws: Path, target, r: Run, results: dict[str, str], stop_reason: str | None, run_dir: Path) -> int:
    """Run e2e when it is due, commit the records since the last step commit (failures, exhausted,
    reconcile, e2e); say how the run ended."""
    end_to_end(ws, target, r)
    if gitops.dirty_paths(ws, "ledger"):
        n_fail = sum(1 for v in results.values() if v == "exhausted")
        gitops.commit_paths(ws, ["ledger"], f"porter: ledger of run {r.run_id} ({n_fail} unit(s) exhausted)\n\n"
                                            f"Porter-Run: {r.run_id}\nPorter-Target: {target.name}\n")
    counts = {s: sum(1 for v in results.values() if v == s) for s in ("verified", "built", "exhausted")}
    tail = f"; stopped: {stop_reason}" if stop_reason else ""
    r.out.line(f"run {r.run_id}: {counts['verified']} verified, {counts['built']} built, {counts['exhausted']} exhausted, "
               f"{len(r.commits)} step commit(s){tail}; log: {(run_dir / 'run.log').relative_to(ws)}", "bold")
    failed = counts["exhausted"] > 0 or (stop_reason or "").startswith("provider")
    return 1 if failed else 0
