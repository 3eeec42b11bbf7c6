"""Each distinct mutant through parity, and perf where parity passed: the path calibration takes for a
hand-written mutant (porter.calibration.calibrator.parity_then_perf), on libraries
the calibration library builder links (porter.calibration.libraries.SourceLibraries: the known-good
source of every unit, this unit's mutated).

Per unit, the known-good runs first on the seeds all its mutants then share: it must pass (else the
spec refuses correct code and no kill of that spec means anything: its mutants are not-run), and its
timing is the perf baseline.  A mutant's time limit is a few known-good runs' worth (MUTANT_TIMEOUT),
not the spec's full limit: a mutant that loops forever is common and is killed by `timeout`.  A judged
mutant's library is removed (drop_library): none is loaded twice.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path

from porter.calibration import calibrator
from porter.calibration.libraries import BuildError
from porter.gates.mutants import Mutant
from porter.calibration.mutate.objects import DISTINCT, Built
from porter.errors import PorterError
from porter.gates.evidence import ParityEvidence
from porter.gates.parity.gate import fresh_seeds
from porter.spec import load_spec

# a mutant's time limit: this many times the known-good's run, at least MIN_TIMEOUT_S, at most the spec's
MUTANT_TIMEOUT = 5.0
MIN_TIMEOUT_S = 30.0
ORIGIN = "mutation"


def as_mutant(b: Built) -> Mutant:
    """The calibration mutant of a generated mutation: its whole mutated file, refused by any check."""
    m = b.mutation
    return Mutant(m.unit, m.name, "any", m.note, ORIGIN, source=m.source)


def mutant_timeout(known_good_seconds: float, limit: float | None, sharing: int = 1) -> float:
    """`sharing`: the plans that may run on the GPU beside it (--per-gpu): the known-good ran alone, a mutant
    may run that many times slower without looping, and a timeout must not pass for a kill."""
    t = max(MIN_TIMEOUT_S, MUTANT_TIMEOUT * known_good_seconds) * max(1, sharing)
    return min(t, limit) if limit else t


def drop_library(libs, lib, good) -> None:
    """Remove a judged mutant's library from the calibration builder's cache (cache/lib/<key>/): thousands of
    mutants would each leave a whole backend there (ds4: every unit linked), and none is loaded twice.
    Anything not laid out that way, and the known-good's, is left alone."""
    cache = getattr(libs, "cache", None)
    lib = Path(lib)
    if cache is None or lib == Path(good):
        return
    folder = lib.resolve().parent
    if folder.parent == (Path(cache) / "lib").resolve() and lib.resolve() != Path(good).resolve():
        shutil.rmtree(folder, ignore_errors=True)


def judge(parity, perf=None) -> tuple[str, str | None, str]:
    """(outcome, check, summary) from a mutant's parity result and, where parity passed, perf's."""
    if parity.skipped:
        return "not-run", None, f"parity skipped: {parity.summary}"
    if not parity.ok:
        return "killed", parity.word, parity.summary
    if perf is not None and not perf.ok and not perf.skipped:
        return "killed", perf.word, perf.summary
    why = f"; perf: {perf.summary}" if perf is not None and perf.skipped else ""
    return "survived", None, parity.summary + why


def screens(target, unit: str) -> bool:
    """Whether the unit's spec has untimed cases to screen a mutant on and timed ones to spare it: the timed
    cases are the production sizes, most of a heavy spec's time (ds4: a 2048-token prefill).  A spec with
    nothing to screen is not run twice."""
    timed = [getattr(s, "timed", False) for s in getattr(load_spec(target, unit), "shapes", [])]
    return any(timed) and not all(timed)


def screen(target, unit: str, lib, opts, timeout: float, seeds: list[int]):
    """The mutant on its spec's untimed cases (gate.screen_cases): their refusal, which is the whole spec's
    refusal too (the same cases, seeds and checks), else None -- the whole spec decides."""
    r = calibrator.parity_on_library(target, unit, lib, opts, timeout=timeout, seeds=seeds, screen=True)
    return r if not r.ok and not r.skipped and (r.evidence or {}).get("screen") else None


def run_unit(target, libs, good, unit: str, built: list[Built], opts, run=None) -> tuple[dict, list[dict]]:
    """The known-good and every distinct mutant of `unit`: ({known-good facts}, [one result per mutant]).
    `run(fn)`: where a parity run happens (the calibration's run slots); None: here, now."""
    run = run or (lambda fn: fn())
    seeds = opts.parity.seeds or fresh_seeds(2)
    t0 = time.monotonic()
    res = run(lambda: calibrator.parity_on_library(target, unit, good, opts, seeds=seeds,
                                                   fresh_process=calibrator.baseline_alone()))
    kg_seconds = time.monotonic() - t0
    facts = {"ok": res.ok, "word": res.word, "summary": res.summary[:300], "seconds": round(kg_seconds, 2),
             "device": ParityEvidence.of(res.evidence).gpu}
    mine = [b for b in built if b.status == DISTINCT]
    if not res.ok:
        why = f"the known-good was refused ({res.word}): {res.summary[:200]}"
        return facts, [{"id": b.mutation.id, "outcome": "not-run", "error": why} for b in mine]
    from porter.gates.parity import executors

    timeout = mutant_timeout(kg_seconds, opts.parity.timeout, executors.workers_per_gpu())
    screened_first = opts.mutation_screen and screens(target, unit)  # the spec read once, not per mutant

    def one(b: Built) -> dict:
        m = as_mutant(b)
        t1 = time.monotonic()
        try:
            lib = libs.mutant(m)
        except (BuildError, PorterError) as exc:
            return {"id": b.mutation.id, "outcome": "did-not-build", "error": f"link: {exc}"[:300]}
        refused = screen(target, unit, lib, opts, timeout, seeds) if screened_first else None
        # any mutant may have changed only its speed: every one is timed and judged by perf against this run's
        # known-good, as a hand-written perf mutant is
        r, p = (refused, None) if refused is not None else \
            calibrator.parity_then_perf(target, unit, lib, opts, res, seeds, timeout)
        drop_library(libs, lib, good)
        outcome, check, summary = judge(r, p)
        return {"id": b.mutation.id, "outcome": outcome, "check": check, "summary": summary[:300],
                "seconds": round(time.monotonic() - t1, 2), **({"screen": True} if refused is not None else {})}

    return facts, [run(lambda b=b: one(b)) for b in mine] if opts.slots is None else \
        opts.slots.map([lambda b=b: one(b) for b in mine])


def run_all(target, libs, built: list[Built], units: list[str], opts, out=print) -> tuple[dict, dict[str, dict]]:
    """Every unit's known-good and mutants, the units side by side within opts.jobs parity runs:
    ({unit: known-good facts}, {mutant id: its result})."""
    from concurrent.futures import ThreadPoolExecutor

    good = libs.known_good()
    slots = calibrator.RunSlots(opts.jobs)
    unit_opts = replace(opts, slots=slots)
    facts: dict[str, dict] = {}
    results: dict[str, dict] = {}
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(opts.jobs, len(units) or 1))) as pool:
            def one(u):
                mine = [b for b in built if b.mutation.unit == u]
                return run_unit(target, libs, good, u, mine, unit_opts, slots.run)

            done = {u: pool.submit(one, u) for u in units}
            for u in units:
                f, rs = done[u].result()
                facts[u] = f
                results.update({r["id"]: r for r in rs})
                killed = sum(r["outcome"] == "killed" for r in rs)
                out(f"  {'ok ' if f['ok'] else 'BAD'} {u}: known-good {f['word']}; {killed} of {len(rs)} mutants "
                    f"killed")
    finally:
        slots.close()
    return facts, results
