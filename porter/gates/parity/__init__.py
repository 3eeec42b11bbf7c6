"""Parity gate: a ported unit, called through the backend library on real GGUF
tensors, must compute what an independent CPU reference computes -- under checks
a clever wrong answer cannot pass.

    available() -> (bool, reason)
    run(candidate, ctx) -> GateResult   (porter.gates.driver)

How (details in the modules):
  spec.py     targets/<t>/parity/<unit>.py: inputs, shapes, reference, tolerances
  gate.py     run_spec, the one pipeline of both kinds of spec (op specs here,
              runtime scenarios in scenario.py): inputs + references in this
              process (two fresh os.urandom seeds), the verdict check by check
              (compare.CHECK_ORDER), the evidence
  runner.py   the sandboxed child process: time limit, crash and hang containment
  pool.py     where plans run: a pre-started sandboxed worker per GPU, or a
              fresh child per plan; either serves one plan only
  worker.py   the pre-started worker: numpy, cupy and a CUDA context opened
              before the candidate exists, then one plan, then exit
  child.py    the one child entry point: loads the library (loader.py, the
              only module that loads one); an op plan calls the unit on fenced
              cupy buffers (sentinel-filled outputs, guard bytes, const hashes,
              stream probe, second call in the same buffers, CUDA-event timing
              with L2 flushed and the timed outputs read back for re-checking),
              a scenario plan makes its calls in scenario_child.py
  compare.py  metrics (max abs, max rel, NMSE, exact with tie rule)
  device.py   cupy buffers, events, the stream hold; a host stand-in for CI

The gate is skipped (never "ok") where there is no GPU or no cupy, and where a
unit has no spec.  Runtime units have scenario specs (scenario.py: a sequence
of API calls); one is skipped while the other units it calls are placeholders.
"""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from porter.host import sandbox
from porter.target.cparse import calls_to
from porter.gates import archs
from porter.gates.evidence import BuildEvidence
from porter.gates.parity import executors
from porter.gates.parity.gate import prepare_cases, run_spec
from porter.gates.parity.scenario import placeholders_among, scenario_uses
from porter.spec import SpecError, UnitSpec, load_spec
from porter.gates.result import GateResult
from porter.host.toolchain import cuda_device_here

__all__ = ["available", "run", "start_ahead"]

_AHEAD_POOL: ThreadPoolExecutor | None = None
_AHEAD_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, what) when parity can run on a GPU: this machine's (cupy sees one), or under
    --executor ray the cluster's; else (False, why)."""
    if os.environ.get("PORTER_PARITY", "").lower() in ("off", "0", "no"):
        return False, "parity disabled by PORTER_PARITY=off"
    if os.environ.get("PORTER_PARITY_EXECUTOR", "").lower() == "ray":  # the cluster's GPUs, not this machine's
        from porter.gates.parity.cluster import available as on_cluster

        return on_cluster()
    return cuda_device_here()


def waiting_on(target, spec, candidate, linked: dict | None = None) -> str | None:
    """Why parity cannot judge this candidate on a library linked from the workspace yet, or None.
    A runtime scenario calls other units; a candidate may call other API functions (ds4's shared
    gate/up calls matmul and swiglu): while one of them is a placeholder, a refusal would be its.
    `linked` is the build gate's record of the library under test: with --jobs N a unit it calls can be
    committed between that link and this check (ds4's tensor_copy, linked while tensor_alloc was still a
    placeholder, was refused for alloc's NULL), so a placeholder in the library counts as unported too."""
    in_library = {u for u, m in (BuildEvidence.of({"linked": linked}).linked or {}).items() if m.placeholder}

    def unported(units) -> list[str]:
        units = sorted(units)
        return sorted(set(placeholders_among(target, units)) | (set(units) & in_library))

    waiting = unported(scenario_uses(target, spec))  # [] for an op spec, or none
    if waiting:
        return f"the scenario for {candidate.unit} also calls unported {', '.join(waiting)}"
    waiting = unported(calls_to(candidate.source, set(target.units) - {candidate.unit}))
    if waiting:
        return f"{candidate.unit} calls unported {', '.join(waiting)}"
    return None


def units_it_calls(target, unit: str) -> set[str]:
    """The other units parity calls to judge `unit` (a runtime scenario's), which its library must link
    (GateContext.units_checks_call asks every gate that runs the candidate)."""
    try:
        spec = load_spec(target, unit)
    except SpecError:
        return set()
    return set(scenario_uses(target, spec)) & set(target.units)


def start_ahead(candidate, ctx) -> Future | None:
    """Begin the parity run's inputs and references for `candidate` while the build gate compiles
    it (they need no library; a large spec's references take longer than the build).  None where
    parity will not use them: caller-given seeds, no spec, a runtime scenario, no device."""
    target, opts = ctx.target, ctx.parity
    if opts.seeds:
        return None
    try:
        spec = load_spec(target, candidate.unit)
    except SpecError:
        return None
    if not isinstance(spec, UnitSpec):
        return None

    def work():
        if opts.mode == "cuda" and not available()[0]:
            return None
        return prepare_cases(target, spec)

    global _AHEAD_POOL
    with _AHEAD_LOCK:
        if _AHEAD_POOL is None:
            _AHEAD_POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2),
                                             thread_name_prefix="parity-ahead")
        return _AHEAD_POOL.submit(work)


def run(candidate, ctx) -> GateResult:
    """Run the unit's parity spec against the library the build gate linked (ctx.library);
    skipped (not ok) when it cannot run here."""
    target, opts = ctx.target, ctx.parity
    if opts.mode == "cuda":
        ok, why = available()
        if not ok:
            return GateResult("parity", False, f"parity skipped: {why}", skipped=True)
    if ctx.library is None:
        return GateResult("parity", False, "parity skipped: no backend library was built", skipped=True)
    try:
        sandbox.require()
    except sandbox.SandboxUnavailable as exc:  # the harness's lack, never the candidate's failure
        return GateResult("parity", False, f"parity refused: {exc}", skipped=True)
    try:
        spec = load_spec(target, candidate.unit)
    except SpecError as exc:
        return GateResult("parity", False, f"parity skipped: spec error: {exc}", skipped=True)
    if spec is None:
        kind = "runtime unit" if candidate.unit in target.runtime_units else "no spec written yet"
        return GateResult("parity", False, f"parity skipped: no parity spec for {candidate.unit} ({kind})",
                          skipped=True)
    # a runtime scenario calls other units: on a library the build gate linked from the workspace it cannot
    # judge this one while they are placeholders (calibration libraries hold every unit)
    build = ctx.results.get("build")
    why = waiting_on(target, spec, candidate, BuildEvidence.of(build.evidence).linked) if build is not None else None
    if why:
        return GateResult("parity", False, f"parity skipped: {why}", skipped=True)
    sanitize = opts.sanitize
    if sanitize is None:
        sanitize = os.environ.get("PORTER_PARITY_SANITIZE", "") not in ("", "0", "off")
    extra = {}  # only a unit spec's run takes `prepared` (start_ahead makes none for a scenario)
    ahead = ctx.ahead.get("parity")  # what the driver started for this gate while the library was made
    if ahead is not None:
        try:
            prepared = ahead.result()
        except Exception:  # noqa: BLE001 - a harness fault ahead: run_spec prepares again and reports it
            prepared = None
        if prepared is not None:
            extra["prepared"] = prepared
    from porter.gates import mutants  # in a function: mutants reads compare, whose package this is

    calibration = ctx.history.calibration_status(candidate.unit, spec.sha256,
                                                 mutants.current_digests(target, candidate.unit))

    def on(arch: str | None) -> GateResult:
        return run_spec(target, spec, Path(ctx.library), workspace=ctx.workspace, seeds=opts.seeds, sanitize=sanitize,
                        timeout=opts.timeout, mode=opts.mode, timing_reps=opts.timing_reps, env=opts.env,
                        regime=opts.regime, fresh_process=opts.fresh_process, screen=opts.screen,
                        candidate_sha256=candidate.sha256,
                        calibration=calibration, arch=arch, **extra)

    required = getattr(target, "required_archs", ())
    if not required:
        return on(None)  # a verdict for the GPU it runs on, which its evidence names
    return archs.across(required, executors.served_archs(opts.mode), on, gate="parity")
