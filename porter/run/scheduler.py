"""Which units a run ports, in what order, and the one scheduler that runs them: `--jobs N` keeps up
to N units in flight; `--jobs 1` is the same path with one slot (the units one after another)."""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager

from porter.digest import sha256_bytes
from porter.errors import PorterError
from porter.gates import parity
from porter.gates.driver import Candidate
from porter.spec import load_spec
from porter.records.history import History
from porter.target.plan import ranked_units
from porter.run.attempt import Run, port_unit


def ordered_units(target, out) -> list[str]:
    runtime = [u for u in target.units if u in target.runtime_units]
    fallback = runtime + [u for u in target.units if u not in runtime]
    try:
        ranked = [r.unit for r in ranked_units(target)]
    except PorterError as exc:
        out.line(f"order: header order, runtime units first (ranking failed: {exc})", "yellow")
        return fallback
    order = [u for u in ranked if u in target.units]
    return order + [u for u in fallback if u not in order]


EXHAUSTED_EARLIER = "exhausted earlier"


def exhausted_line(skipped: list[str], max_attempts: int) -> str | None:
    """The units a run without --unit leaves alone because their attempts ran out in an earlier run, and
    how to retry them; None when there are none (they never drop out of a run silently)."""
    names = [line.split(" (", 1)[0] for line in skipped if f"({EXHAUSTED_EARLIER};" in line]
    if not names:
        return None
    how = (f"`porter run --unit {names[0]}`" if len(names) == 1 else "`porter run --unit UNIT` (repeatable)")
    return (f"{len(names)} unit{'s' if len(names) != 1 else ''} exhausted earlier, not retried: {', '.join(names)}; "
            f"retry with {how}, which gives each {max_attempts} more attempt(s) (--max-attempts)")


def select_units(target, history: History, order: list[str], explicit: bool, r: Run):
    """(to port, to verify first, skipped with why): what this run will do, from the history alone."""
    todo, reverify, skipped = [], set(), []
    for u in order:
        uh = history.unit(u)
        path = target.unit_path(u)
        step = uh.step_for(sha256_bytes(path.read_bytes()) if path.is_file() else None)
        state = step.state if step else None
        if state == "built" and r.can_verify(u):
            if uh.refutation is None:  # committed before parity could run here: verify the committed file first
                reverify.add(u)
                todo.append(u)
                continue
            state = None  # its committed candidate failed parity or perf: port it again
        if state:
            skipped.append(f"{u} ({state})")
        elif not explicit and uh.exhausted:
            skipped.append(f"{u} ({EXHAUSTED_EARLIER}; retry with --unit {u})")
        else:
            todo.append(u)
    return todo, reverify, skipped


def unit_dependencies(target, todo: list[str], out) -> dict[str, set[str]]:
    """unit -> the units of `todo` it must wait for: every runtime unit before any op, and the
    API functions its host implementation calls (porter.target.scan) before it."""
    runtime = {u for u in todo if u in target.runtime_units}
    deps = {u: (set() if u in runtime else set(runtime)) for u in todo}
    try:
        from porter.target.scan import scan

        api = scan(target).host.api
    except Exception as exc:  # noqa: BLE001 - the runtime-first order still holds without the scan
        out.line(f"order: unit call graph unavailable ({type(exc).__name__}: {exc}); runtime units first", "yellow")
        return deps
    for u in todo:
        ad = api.get(u)
        for c in (ad.api_calls if ad else []):
            if c in deps and c != u and u not in _reachable(deps, c):  # never a cycle
                deps[u].add(c)
    return deps


def _reachable(deps: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for d in deps.get(stack.pop(), ()):
            if d not in seen:
                seen.add(d)
                stack.append(d)
    return seen


def verify_deferred(r: Run, opts, results: dict[str, str], out_of_time) -> str | None:
    """Parity again on the units this run committed as 'built' although parity runs here.

    A runtime unit's scenario drives the other runtime units it calls, and a candidate may call other
    API functions; while one of them is still a placeholder parity is skipped and the unit lands as
    'built' (measured on ds4 with --jobs 8: 20 of 24 runtime units, their scenarios calling each other;
    and the shared gate/up refused 3 times while the swiglu it calls was a placeholder).  Once the pass is over
    they are ported, so each such unit's committed file is verified now, as a later run would."""
    def ready(u: str) -> bool:
        return not parity.waiting_on(r.target, load_spec(r.target, u),
                                     Candidate.of(u, r.target.unit_path(u).read_text(errors="replace")))

    again = [u for u, how in results.items() if how == "built" and r.can_verify(u) and ready(u)]
    if not again:
        return None
    r.out.line(f"{len(again)} unit(s) built while the units their checks call were placeholders: "
               "verifying their committed files now", "bold cyan")
    for unit in again:
        if out_of_time():
            return f"time budget {opts.time_budget} spent"
        how, why = port_unit(unit, r, opts, True, out_of_time, f"{unit}: ")
        if how:
            results[unit] = how
        if why:
            return why
    return None


@contextmanager
def _not_awaited(executor: ThreadPoolExecutor):
    """The executor, shut down on the way out without waiting: answers asked early for units that
    never started (a stop, an error) are not worth a minute of the run."""
    try:
        yield executor
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def schedule(todo: list[str], r: Run, opts, reverify: set, out_of_time, results: dict[str, str]) -> str | None:
    """Up to --jobs units in flight, each started once every unit it depends on has ended (however it
    ended).  A reason to stop lets the units in flight finish and starts no more."""
    deps = unit_dependencies(r.target, todo, r.out)
    several = opts.jobs > 1  # lines name their unit only when units interleave
    bar = r.out.progress(len(todo) if opts.max_units is None else min(len(todo), opts.max_units), "porting")
    pending = list(todo)
    ended: set[str] = set()
    stop_reason: str | None = None
    started = 0
    asked_early: set[str] = set()
    with _not_awaited(ThreadPoolExecutor(max_workers=opts.jobs, thread_name_prefix="porter-ask")) as ask, \
            ThreadPoolExecutor(max_workers=opts.jobs, thread_name_prefix="porter-unit") as pool:
        flying: dict = {}
        while pending or flying:
            while not stop_reason and len(flying) < opts.jobs:
                ready = next((u for u in pending if deps[u] <= ended), None)
                if ready is None:
                    break
                if opts.max_units is not None and started >= opts.max_units:
                    stop_reason = f"--max-units {opts.max_units} reached"
                    break
                pending.remove(ready)
                started += 1
                kind = "runtime" if ready in r.target.runtime_units else "op"
                r.out.line(f"[{started}/{len(todo)}] {ready} ({kind}){' started' if several else ''}", "bold cyan")
                bar.working_on(ready)
                flying[pool.submit(port_unit, ready, r, opts, ready in reverify, out_of_time,
                                   f"{ready}: " if several else "")] = ready
            # free slots while units wait for their dependencies: their first answers are asked for now
            # (a model thinks for a minute; measured at --jobs 8 on minimoe, waiting for the runtime units
            # held the run to 5.99x --jobs 1).  Never more answers in the air than --jobs, never beyond
            # --max-units, never once stopping, never for a unit that starts by re-checking a committed file.
            waiting_asked = sum(1 for u in asked_early if u in pending)  # asked, not started yet
            room = opts.jobs - len(flying) - waiting_asked
            limit = None if opts.max_units is None else opts.max_units - started - waiting_asked
            for u in pending:
                if room <= 0 or stop_reason or out_of_time() or (limit is not None and limit <= 0):
                    break
                if u in asked_early or u in reverify or deps[u] <= ended:
                    continue
                if r.prefetch(u, ask):
                    asked_early.add(u)
                    room -= 1
                    if limit is not None:
                        limit -= 1
            if not flying:
                break  # stopped, or nothing left that can start
            done, _ = wait(list(flying), return_when=FIRST_COMPLETED)
            for fut in done:
                unit = flying.pop(fut)
                ended.add(unit)
                bar.advance()
                how, why = fut.result()
                if how:
                    results[unit] = how
                if why and not stop_reason:
                    stop_reason = why
    bar.stop()
    return stop_reason
