"""Known-good perf baselines a run takes for itself before porting (target.toml `[perf] baseline`).

The perf gate decides against the calibrated known-good's timing where one
exists, else against a roofline floor.  For a target whose backend reads its
weights from host memory (ds4) no HBM floor is honest, so without a known-good
timing every unit would end `verified (perf unmeasured)`.  A target that names
`baseline = "upstream"` has its upstream backend in the user's checkout: on the
first run with a GPU, porter builds it and runs each spec the run is about to
need on it, once.  Each run is recorded as a "calibration" record with
known_good_ok and ok = false: a known-good baseline is not a calibration (no
mutant was shown to be rejected), and status keeps saying so.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from porter.calibration.calibrator import CalibrateOptions, baseline_alone, parity_on_library, record
from porter.calibration.libraries import BuildError, UpstreamLibraries
from porter.errors import PorterError
from porter.gates.driver import ParityOptions
from porter.spec import load_specs
from porter.gates.evidence import ParityEvidence
from porter.gates.perf import baseline as perf_baseline, perf_settings

PARALLEL_SPECS = 6
NOT_A_CALIBRATION = "known-good baseline only (taken by porter run for the perf gate; no mutants run)"


def baseline_source(target) -> str | None:
    return target.spec.perf.baseline


def times_a_case(spec) -> bool:
    """Does the spec time one of its cases?  A runtime scenario times nothing: its units stay
    `verified (perf unmeasured)`, and neither a baseline nor a launch trace has anything to measure."""
    return any(getattr(s, "timed", False) for s in spec.shapes)


def missing_baselines(specs: dict, history, units: list[str]) -> list[str]:
    """Units of `units` whose spec times a case and has no known-good timing for that exact spec."""
    return [u for u in units if u in specs and times_a_case(specs[u])
            and perf_baseline(history, u, specs[u].sha256)[0] is None]


def take_baselines(target, workspace: Path, history, units: list[str], ledger, line=print,
                   parity: ParityOptions | None = None) -> dict[str, bool]:
    """Run the upstream backend on the specs of `units` that lack a baseline; record each run.
    Returns {unit: known-good passed}.  Nothing happens unless the target asks for it and perf is on;
    a checkout that cannot build is one line, and the run goes on (perf then decides as before)."""
    enabled, _ = perf_settings(target)
    if baseline_source(target) != "upstream" or not enabled:
        return {}
    specs = load_specs(target)
    todo = missing_baselines(specs, history, units)
    if not todo:
        return {}
    t0 = time.monotonic()
    line(f"perf baselines: building the upstream {target.name} backend to time {len(todo)} spec(s) on it")
    libs = UpstreamLibraries(target)
    try:
        good = libs.known_good()
    except (BuildError, PorterError) as exc:
        line(f"perf baselines: none taken: {exc}")
        return {}
    line(f"perf baselines: built in {time.monotonic() - t0:.0f} s")
    opts = CalibrateOptions(Path(workspace), parity=parity or ParityOptions(), ledger=False)
    passed = {}
    done = 0

    def one(unit: str):
        t1 = time.monotonic()
        # where warm workers share the GPU (PORTER_PARITY_WORKERS_PER_GPU > 1) a warm run makes no timed call
        # (parity_on_library): the baseline is a fresh child holding the GPU alone, or it has nothing to time
        res = parity_on_library(target, unit, good, opts, fresh_process=baseline_alone())
        return unit, res, time.monotonic() - t1

    # several specs at once: each one's inputs and numpy reference (most of a ds4 spec's time: 109 s of
    # routed_moe_batch's, measured on an H100) are built in parallel, while the children that run and time
    # the library still take the GPU one at a time (one warm worker per GPU, or a fresh child holding it alone)
    with ThreadPoolExecutor(max_workers=PARALLEL_SPECS) as pool:
        for fut in as_completed([pool.submit(one, u) for u in todo]):
            unit, res, secs = fut.result()
            done += 1
            timing = ParityEvidence.of(res.evidence).timing
            timed = bool(timing and timing.median_ms)
            # a pass without a timed call is no baseline: recorded as one, it left perf judging every case by
            # the roofline floor alone while status said "no known-good comparison" (measured on an H200, run
            # with 4 workers on the GPU); unrecorded, the next run takes it again
            passed[unit] = res.ok and timed
            word = "ok" if res.ok and timed else "KNOWN-GOOD RAN UNTIMED" if res.ok else "KNOWN-GOOD REFUSED"
            what = f"{timing.median_ms:.4g} ms on {timing.case!r}" if passed[unit] else res.summary[:200]
            line(f"  [{done}/{len(todo)}] {unit}: {word}: {what} ({secs:.1f} s)")
            if res.ok and not timed:
                continue
            # recorded as each lands, not once all have: a run killed or time-boxed in this stage (ds4's takes
            # minutes: 33 of 57 were lost so on an H200 host) keeps every baseline it took, and the next run
            # takes only the rest (missing_baselines)
            record(target, Path(workspace), {unit: {
                "ok": False, "known_good_ok": res.ok, "mutants": 0, "mutants_rejected": 0,
                "summary": f"{NOT_A_CALIBRATION}: {res.summary}"[:300],
                "evidence": res.evidence if res.ok else None, "spec": specs[unit]}}, libs.describe, good, ledger=ledger)
    return passed
