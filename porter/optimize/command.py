"""`porter optimize`: ask for faster versions of verified units, keep only what is proven faster.

Which units: those verified now (status's derivation: the file is its last step's), prefill before
decode, then the furthest from their roofline first (or, without a roofline, the slowest against
the known-good), leaving out those already at --target-fraction of their roofline.  Each attempt is
a `porter run` attempt (porter.run.attempt.Run) with the optimisation prompt and every unit gate
again plus the speedup gate (porter.optimize.ab) and e2e; a step lands only when the speedup gate
passed, as a 'verified' step with one commit whose subject says the speedup and its p.  A refusal is
a failure record: a verified unit stays verified (its file has not changed).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from porter.records import gitops
from porter.commands.doctor import preflight
from porter.errors import PorterError
from porter.gates import registry
from porter.records.ledger import load_key
from porter.optimize.profile import profile_committed
from porter.prompt.optimize import optimize_request
from porter.providers import ProviderError, get_provider
from porter.run import locked, open_run, parse_duration
from porter.run.attempt import Run
from porter.records.signing import signer_for
from porter.commands.status import VERIFIED_STATES, derive
from porter.target import load_target

TIER_ORDER = ("runtime", "prefill", "decode", "unreachable")
DEFAULT_TARGET_FRACTION = 0.8


@dataclass
class OptimizeOptions:
    workspace: Path
    target: str | None = None
    source: str | None = None
    units: list[str] = field(default_factory=list)
    target_fraction: float = DEFAULT_TARGET_FRACTION
    max_attempts: int = 2
    time_budget: str | None = None
    provider: dict = field(default_factory=dict)
    json: bool = False


def roofline_share(speed: dict | None) -> float | None:
    """The fraction of its roofline a unit reaches, or None where no roofline is known."""
    if not speed or speed.get("pct_roofline") is None:
        return None
    return speed["pct_roofline"] / 100.0


def choose(report, wanted: list[str], target_fraction: float) -> tuple[list, list[tuple[str, str]]]:
    """(the UnitStatus rows to optimise, in order; (unit, why not) for the rest that were asked for or
    are verified)."""
    rows = [u for u in report.units if not wanted or u.unit in wanted]
    picked, passed_over = [], []
    for u in rows:
        share = roofline_share(u.speed)
        if u.state not in VERIFIED_STATES:
            if wanted:
                passed_over.append((u.unit, f"{u.state}, not verified: nothing to optimise"))
        elif not u.speed:
            passed_over.append((u.unit, "no timing of its committed file to improve on"))
        elif share is not None and share >= target_fraction:
            passed_over.append((u.unit, f"already at {share:.0%} of its roofline (--target-fraction {target_fraction:g})"))
        else:
            picked.append(u)

    def distance(u) -> float:  # smaller: further from fast
        share = roofline_share(u.speed)
        if share is not None:
            return share
        x = u.speed.get("x_known_good")
        return 1.0 / x if x else 1.0

    tier = {t: i for i, t in enumerate(TIER_ORDER)}
    picked.sort(key=lambda u: (tier.get(u.tier or "", len(TIER_ORDER)), distance(u)))
    return picked, passed_over


def engine_proven(report) -> bool:
    """e2e judges a speedup only where the engine was proven at HEAD: on a partial port (placeholders on
    the prefill path) the engine cannot run with or without the new unit, so there is nothing to keep."""
    return report.prefill.get("state") == "verified"


def gates(engine: bool) -> tuple[str, ...]:
    """Every gate of the registry in its order: the unit gates again, then old against new (the speedup
    gate), then the engine with the new unit, unless no engine was proven (`engine`: engine_proven).
    Not the engine's throughput: its minutes of ABBA runs per candidate would cost more than the unit's
    own A/B; the next `porter run` measures the new backend tree (it is due there)."""
    backend = registry.names(registry.BACKEND)
    engine_speed = registry.names(registry.BACKEND, role=registry.SPEED)
    return tuple(g for g in registry.names() if (engine or g not in backend) and g not in engine_speed)


def required() -> tuple[str, ...]:
    """The gates that must have passed for a step to land: no step without a measured speedup."""
    return registry.names(registry.SPEEDUP)


def optimize(opts: OptimizeOptions) -> int:
    ws = opts.workspace
    target = load_target(ws, opts.target, opts.source)
    for u in opts.units:
        target.api_function(u)  # unknown unit -> one-line error
    if not 0 < opts.target_fraction <= 1:
        raise PorterError("--target-fraction must be in (0, 1]")
    if opts.max_attempts < 1:
        raise PorterError("--max-attempts must be at least 1")
    budget_s = parse_duration(opts.time_budget)
    preflight(ws, target, "optimize", opts.provider)
    key = load_key(ws)
    provider = get_provider(opts.provider.get("provider"), target, opts.provider)
    signer = signer_for(ws)
    return locked(ws, target, key, lambda: _optimize_locked(opts, target, key, provider, signer, budget_s))


def _optimize_locked(opts: OptimizeOptions, target, key, provider, signer, budget_s: float | None) -> int:
    ws = opts.workspace
    started = time.monotonic()
    r = open_run(ws, target, key, provider, signer, suffix="-optimize", quiet=opts.json)
    out, run_id = r.out, r.run_id
    results: list[dict] = []
    try:
        if not r.parity_ok:
            raise PorterError(f"porter optimize needs the parity gate on a GPU: {r.parity_reason}", exit_code=2)
        report = derive(ws, target=target)
        picked, passed_over = choose(report, opts.units, opts.target_fraction)
        chain = gates(engine_proven(report))
        left_out = [g for g in registry.names() if g not in chain]
        if left_out and picked:
            out.line(f"{', '.join(left_out)}: not run (prefill is {report.prefill.get('state')} at HEAD: no proven "
                     "engine to keep unchanged); the unit gates and the speedup gate still decide", "yellow")
        for unit, why in passed_over:
            out.line(f"{unit}: {why}", "dim")
            results.append({"unit": unit, "outcome": "skipped", "why": why})
        out.line(f"porter optimize {run_id}: target {target.name}, provider {provider.describe()}, "
                 f"{len(picked)} unit(s) to speed up", "bold")
        stop = None
        for row in picked:
            if stop:
                break
            stop = _optimize_unit(r, row, opts, chain, results, lambda: budget_s is not None
                                  and time.monotonic() - started > budget_s)
        if gitops.dirty_paths(ws, "ledger"):
            refused = sum(len(x.get("refused", [])) for x in results)
            gitops.commit_paths(ws, ["ledger"], f"porter: ledger of optimize run {run_id} ({refused} answer(s) "
                                                f"refused)\n\nPorter-Run: {run_id}\nPorter-Target: {target.name}\n")
        landed = sum(1 for x in results if x["outcome"] == "faster")
        out.line(f"optimize {run_id}: {landed} speedup(s) landed, {len(r.commits)} commit(s)"
                 + (f"; stopped: {stop}" if stop else ""), "bold")
    finally:
        out.close()
    if opts.json:
        json.dump({"run": run_id, "units": results}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 1 if stop and stop.startswith("provider") else 0


def _optimize_unit(r: Run, row, opts: OptimizeOptions, chain, results: list[dict], out_of_time) -> str | None:
    """Attempts at one unit until a speedup lands or its attempts are used; why the run stops, or None."""
    unit, target = row.unit, r.target
    committed = target.unit_path(unit).read_text()
    profile = profile_committed(target, r.ws, unit, (row.speed or {}).get("case"))
    r.out.line(f"  {unit}: {profile.line()}", "dim")
    request = partial(optimize_request, committed=committed, speed=row.speed, profile=profile)
    entry = {"unit": unit, "outcome": "not faster", "before": row.speed, "refused": [], "profile": profile.as_dict()}
    results.append(entry)
    for _ in range(opts.max_attempts):
        if out_of_time():
            return f"time budget {opts.time_budget} spent"
        uh = r.history().unit(unit)
        try:
            o = r.attempt(unit, uh.next_attempt, uh.failures_since_step, request=request, gates=chain,
                          purpose="optimize", required=required())
        except ProviderError as exc:
            if getattr(exc, "usage", None):
                r._usage(unit, exc)
            entry["outcome"] = "provider"
            return f"provider: {exc}"
        verdicts = " · ".join(o.verdicts)
        if o.ok:
            r.out.line(f"  {unit} attempt {uh.next_attempt}: {verdicts} -> {o.summary}, committed {o.commit[:10]}",
                       "green")
            entry.update(outcome="faster", attempt=uh.next_attempt, commit=o.commit, summary=o.summary)
            return None
        r.out.line(f"  {unit} attempt {uh.next_attempt}: {verdicts} -> {o.gate}: {o.summary}", "red")
        entry["refused"].append({"attempt": uh.next_attempt, "gate": o.gate, "check": o.check, "summary": o.summary})
    return None


# -- the CLI -----------------------------------------------------------------------------------------

def add_arguments(p) -> None:
    p.add_argument("--unit", action="append", metavar="UNIT", help="only this verified unit (repeatable)")
    p.add_argument("--target-fraction", type=float, default=DEFAULT_TARGET_FRACTION, metavar="F",
                   help=f"leave units already at this fraction of their roofline (default {DEFAULT_TARGET_FRACTION})")
    p.add_argument("--max-attempts", type=int, default=2, metavar="N", help="answers asked for per unit (default 2)")
    p.add_argument("--provider", help="scripted, anthropic, openai, reference (as `porter run`)")
    p.add_argument("--model", help="model name for the provider")
    p.add_argument("--base-url", help="server URL (OpenAI-compatible local servers)")
    p.add_argument("--time-budget", metavar="DURATION", help="stop starting attempts after e.g. 30m, 2h")
    p.add_argument("--json", action="store_true", help="machine-readable outcome per unit")
    p.epilog = ("examples:\n  porter optimize --provider anthropic --max-attempts 3\n"
                "  porter optimize --provider scripted --unit mini_gpu_add_tensor --json\n\n"
                "A speedup lands only when the speedup gate measured it (ABBA rounds, rank test p < 1e-4, gain above\n"
                "the committed kernel's A/A margin) and every other gate passed again; one commit per speedup.")


def run(args) -> int:
    provider = {k: getattr(args, k) for k in ("provider", "model", "base_url") if getattr(args, k, None) is not None}
    return optimize(OptimizeOptions(args.workspace, getattr(args, "target", None), getattr(args, "source", None),
                                    list(dict.fromkeys(args.unit or [])), args.target_fraction, args.max_attempts,
                                    args.time_budget, provider, bool(getattr(args, "json", False))))
