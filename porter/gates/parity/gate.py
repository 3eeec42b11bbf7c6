"""The parity gate proper: spec -> inputs and references -> child run -> verdict.

The parent (this module) builds every input and every reference output before
the child starts, with two seeds drawn from os.urandom at verify time; the
child (child.py) only calls the library and reports what it saw; the verdict
is made here, from the child's facts and the references, check by check (the
names are in compare.CHECK_ORDER).  Seeds go into the evidence, never into the
summary or diagnostics (those feed the next prompt).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from porter.gates.parity import blas_threads, compare, executors, merge, runner
from porter.gates.parity.compare import Failure
from porter.spec import (Call, Context, Exact, Flag, In, InOut, Map, Null, Out, Same, Shape, SpecError,
                                      UnitSpec, header_params, validate_call)
from porter.host import toolchain
from porter.digest import sha256_file
from porter.records.evidence import gate_facts
from porter.gates.evidence import ParityEvidence
from porter.gates.result import GateResult
from porter.tomlfile import read_toml

DEFAULT_TIMEOUT_S = 90.0
# The watchdog also allows for the plan's model maps: each pass loads its map (the regime's hook: a copy
# into device memory for ds4), and the check compares it on the host and reads the device copy back; each
# timed repetition loads its set's map again.  A routed-MoE spec moves tens of GB that way (its real Q4_K
# case maps 3.6 GB): on a full ds4 run sharing its host with other GPU jobs, a flat 90 s killed the
# reference slice's child mid-check on all three attempts while upstream's, which returns no device
# copy to read back, passed.  By the count below that plan moves about 138 GB (five 1.8 GB IQ2_XXS
# cases, one timed, and the 3.6 GB Q4_K one), and it was killed in the Q4_K case's check, its last big
# one: about 1.2 GB/s on average, with other jobs on the host.  0.5 GB/s leaves twice that room.
MAP_BYTES_PER_S = 0.5e9
# The stream probe holds the unit's stream while the call returns and the outputs are peeked at on
# another stream.  The hold must outlast the call's host side, the delay and the peek (a few ms for
# these buffers); a call that outlasts it is inconclusive and the case's next pass is probed with a
# hold four times longer.  One pass per case (drawn at random in the child) keeps every case's path
# watched at half the cost of watching both: the holds were most of a warm verdict's child time.
PROBE = {"enabled": True, "hold_ms": 6, "delay_ms": 2, "retry_hold_ms": 24}
# PORTER_STREAM_PROBE=every-pass: the probe before this change (every pass, 15 ms holds), for the
# bench's before/after and for a unit whose ordering fault is suspected on one pass only
PROBE_EVERY_PASS = {"enabled": True, "hold_ms": 15, "delay_ms": 5, "every_pass": True}


def watchdog_s(base: float, cases, timing_reps: int) -> float:
    """How long a plan's child may run: `base` for its calls, plus its model maps' traffic."""
    def map_bytes(call) -> int:
        return sum(a.size for a in call.args.values() if isinstance(a, Map))

    moved = 0
    for c in cases:
        if not hasattr(c, "calls"):  # a runtime scenario's run: its steps call the backend, no unit map
            continue
        moved += 4 * sum(map_bytes(call) for call in c.calls)  # load, two host compares, the read-back
        if c.shape.timed and c.shape.expect == "ok" and timing_reps > 0:
            moved += 2 * timing_reps * max((map_bytes(call) for call in c.timing_sets), default=0)
    return base + moved / MAP_BYTES_PER_S


def default_probe() -> dict:
    return PROBE_EVERY_PASS if os.environ.get("PORTER_STREAM_PROBE") == "every-pass" else PROBE


# The timed calls rotate through this many input sets (the case's two passes and the rest built for timing
# only), never the same set twice in a row: a candidate that replays its last answer when called again on
# unchanged inputs gets nothing from it, and a checked repetition is judged against its own set's reference.
TIMING_SETS = 3


def timing_set_count() -> int:
    return max(2, int(os.environ.get("PORTER_TIMING_SETS", TIMING_SETS)))


def rotation_order(n_sets: int, reps: int, rand=None) -> list[int]:
    """Which input set each timed repetition gets: every set once in a random order, then random sets,
    never the one just used (with at least two sets).  Drawn from os.urandom, kept in the parent."""
    import random

    rand = rand or random.SystemRandom()
    order = list(range(n_sets))
    rand.shuffle(order)
    while len(order) < reps:
        order.append(rand.choice([k for k in range(n_sets) if k != order[-1]] or [0]))
    return order[:reps]


# Work left on another stream past the timed call's end event: the device is still busy when the harness
# synchronizes it right after that event.  Idle, that synchronize returns in microseconds; the median over
# the repetitions must stay under the larger of these.
TAIL_LIMIT_MS = 0.1
TAIL_SHARE = 0.5  # of the median timed call


# ---------------------------------------------------------------------------
# Preparing the calls
# ---------------------------------------------------------------------------

@dataclass
class PreparedCase:
    id: str
    shape: Shape
    calls: list[Call]  # one per pass (2 for valid shapes, 1 for error shapes)
    seeds: list[int]
    layout: dict = field(default_factory=dict)
    timing_calls: list[Call] = field(default_factory=list)  # input sets for the timed calls only

    @property
    def timing_sets(self) -> list[Call]:
        """Every input set a timed repetition may get: the passes', then the timing-only ones."""
        return list(self.calls) + list(self.timing_calls)

    @property
    def label(self) -> str:
        return self.shape.label


def _layout(spec: UnitSpec, params: list[dict], call: Call) -> dict:
    """Buffers, bindings and scalars of one call: both passes of a case must agree.  A buffer's
    descriptor lie (an error case's data_null / claim_bytes) is part of it; a Null tensor is bound to
    no buffer (None) and, as an output, is not read back."""
    buffers, bind, scalars, outputs = {}, {}, {}, {}
    map_info = None
    roles = ((In, "in"), (InOut, "inout"), (Out, "out"))
    for p in params:
        a = call.args[p["name"]]
        role = next((r for cls, r in roles if isinstance(a, cls)), None)
        if role is not None:
            buffers[p["name"]] = {"role": role, "nbytes": a.nbytes, "dtype": a.dtype, **a.descriptor()}
            bind[p["name"]] = p["name"]
        elif isinstance(a, Null):
            bind[p["name"]] = None
        elif isinstance(a, Map):
            map_info = {"size": a.size, "file": a.file}
        elif not isinstance(a, (Same, Flag)):
            scalars[p["name"]] = float(a) if p["kind"] in ("f32", "f64") else int(a)
    for p in params:
        a = call.args[p["name"]]
        if isinstance(a, Same):
            bind[p["name"]] = bind[a.param]
    for name in spec.outputs:
        if bind[name] is not None:
            outputs[name] = bind[name]
    return {"buffers": buffers, "bind": bind, "scalars": scalars, "outputs": outputs, "map": map_info}


def _same_layout(a: dict, b: dict) -> bool:
    a, b = dict(a), dict(b)
    if a["map"] and b["map"]:
        a["map"], b["map"] = a["map"]["size"], b["map"]["size"]
    return a == b


# Calls built at once per prepare(): each has its own generator, so the order they finish in changes
# nothing; numpy releases the GIL in the large array work the references do.  Measured: one 129-token
# call of ds4's routed_moe_batch takes ~45 s of CPU, and a parity run builds 2 per case, 11 cases.
BUILD_THREADS = max(1, min(8, os.cpu_count() or 1))


def _build_call(spec: UnitSpec, shape, ctx: Context, ent: list[int]):
    try:
        return spec.build(shape, ctx, np.random.default_rng(ent))
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - a spec/reference bug, reported as such
        raise SpecError(f"{spec.unit} shape {shape.label!r}: building inputs failed: "
                        f"{type(exc).__name__}: {exc}") from exc


def prepare(spec: UnitSpec, api_fn, ctx: Context, seeds: list[int], timing_sets: bool = True) -> list[PreparedCase]:
    """timing_sets=False: no input sets for timed calls alone, for a run that makes none (a shared GPU's,
    a seed sweep's fresh sets, a mutant's).  They are the third build of every timed case, and the timed
    cases are the production sizes: a third of a heavy spec's prepare spent on calls never made."""
    params = header_params(api_fn)
    cases = []
    n_sets = timing_set_count()
    plan = []
    for i, shape in enumerate(spec.shapes):
        n_pass = 2 if shape.judges_values else 1  # a second call on fresh inputs: a remembered answer shows
        # a timed case's extra input sets come from the first seed and their own stream of it
        entropy = [[seeds[p] & (2**64 - 1), i] for p in range(n_pass)]
        if shape.timed and shape.expect == "ok" and timing_sets:
            entropy += [[seeds[0] & (2**64 - 1), i, 1000 + k] for k in range(max(0, n_sets - n_pass))]
        plan.append((i, shape, n_pass, entropy))
    jobs = [(shape, ent) for _, shape, _, entropy in plan for ent in entropy]
    if len(jobs) > 1 and BUILD_THREADS > 1:
        with blas_threads.one_blas_thread(), \
                ThreadPoolExecutor(max_workers=min(BUILD_THREADS, len(jobs)), thread_name_prefix="porter-build") as ex:
            futures = [ex.submit(_build_call, spec, shape, ctx, ent) for shape, ent in jobs]
            built = [f.result() for f in futures]  # the first failure in case order is the one raised
    else:
        built = [_build_call(spec, shape, ctx, ent) for shape, ent in jobs]
    it = iter(built)
    for i, shape, n_pass, entropy in plan:
        calls, layouts = [], []
        for _ in entropy:
            call = next(it)
            validate_call(spec, api_fn, shape, call)
            calls.append(call)
            layouts.append(_layout(spec, params, call))
        if any(not _same_layout(layouts[0], other) for other in layouts[1:]):
            raise SpecError(f"{spec.unit} shape {shape.label!r}: the two seeds give different layouts "
                            "(sizes and scalars must depend on the shape only)")
        cases.append(PreparedCase(f"c{i}", shape, calls[:n_pass], seeds[:n_pass], layouts[0], calls[n_pass:]))
    return cases


# (unit, spec, seeds) -> (cases, their Context), the last PREPARED_KEEP (the trace runs 6 ops at once)
_PREPARED: dict = {}
PREPARED_KEEP = 8
_PREPARED_LOCK = threading.Lock()


def _prepared(spec: UnitSpec, api_fn, ctx: Context, seeds: list[int],
              remember: bool, timing_sets: bool = True) -> tuple[list[PreparedCase], Context]:
    """prepare(), remembered for the same spec and caller-given seeds: calibration runs one unit's
    spec on the known-good, each env-knob variant and each mutant with the same seeds, and the
    references of the large specs (the prefill MoE) take minutes.  Fresh seeds never repeat, so
    a candidate's parity prepares its own and nothing of it is kept.
    Returns the cases and the Context that made them: a case's weight map can be a file in that
    Context's scratch folder, deleted with it, so remembered cases keep their own Context alive
    and every later run gets that one (measured: the MoE specs' variants and mutants found the
    sparse map gone once the known-good's run had dropped the Context that wrote it)."""
    if not remember:
        return prepare(spec, api_fn, ctx, seeds, timing_sets=timing_sets), ctx
    # the file's bytes, and what a caller may have replaced in the loaded spec (tests do)
    key = (spec.unit, spec.sha256, getattr(spec.build, "__qualname__", repr(spec.build)), repr(spec.shapes),
           tuple(int(s) for s in seeds))
    with _PREPARED_LOCK:
        # cases made with the timing sets serve a run without timed calls too (write_plan reads those
        # sets only for timed calls); never the other way round
        for k in ((key + (True,),) if timing_sets else (key + (False,), key + (True,))):
            if k in _PREPARED:
                return _PREPARED[k]
    key = key + (timing_sets,)
    made = prepare(spec, api_fn, ctx, seeds, timing_sets=timing_sets), ctx
    with _PREPARED_LOCK:
        _PREPARED[key] = made
        while len(_PREPARED) > PREPARED_KEEP:
            _PREPARED.pop(next(iter(_PREPARED)))
    return made


@dataclass
class Prepared:
    """A spec's seeds and cases, ready for a parity run (prepare_cases)."""

    unit: str
    spec_sha256: str
    seeds: list[int]
    cases: list[PreparedCase]
    ctx: Context | None
    error: str | None = None  # a SpecError while preparing: the parity run reports it as a skip
    timing_sets: bool = True  # built with the input sets timed calls rotate through (prepare)


def prepare_cases(target, spec: UnitSpec, seeds: list[int] | None = None, ctx: Context | None = None,
                  timing_sets: bool = True) -> Prepared:
    """Inputs and references for `spec`: with fresh seeds unless the caller gives some (those are
    remembered, see _prepared).  None of it depends on the library, so the driver makes it while the
    build gate compiles; the candidate's code cannot see it (this process's memory)."""
    remember = bool(seeds)
    seeds = list(seeds) if seeds else fresh_seeds(2)
    if len(seeds) < 2:
        raise ValueError("parity needs at least two seeds")
    try:
        cases, ctx = _prepared(spec, target.api_function(spec.unit), ctx or Context.for_target(target), seeds,
                               remember, timing_sets)
        return Prepared(spec.unit, spec.sha256, seeds, cases, ctx, timing_sets=timing_sets)
    except SpecError as exc:
        return Prepared(spec.unit, spec.sha256, seeds, [], None, str(exc), timing_sets=timing_sets)


def in_regime(harness: dict, regime: str) -> dict:
    """The harness with the model hook of `regime` as the one the child calls: [harness.regimes] names a
    hook per regime (ds4: a device copy, or the registered host map); a harness without that table has one
    hook, and it serves the target's one regime."""
    hooks = harness.get("regimes") or {}
    if not hooks:
        return dict(harness, regime=regime)
    if regime not in hooks:
        raise ValueError(f"regime {regime!r} has no model hook in parity/harness.toml's [harness.regimes] "
                         f"(it names {', '.join(sorted(hooks))})")
    return dict(harness, model_ptr=hooks[regime], regime=regime)


def harness_names(target) -> dict:
    """Target-owned helper symbols the child calls (targets/<t>/parity/harness.toml)."""
    declared = read_toml(target.dir / "parity" / "harness.toml", missing=None)
    if declared is not None:
        return dict(declared.get("harness", {}))
    base = target.symbol_prefix.replace("_gpu_", "_cuda_")
    return {"stream": f"{base}stream", "model_ptr": f"{base}model_ptr", "forget_models": f"{base}forget_models",
            "success": "zero"}


def write_plan(plan_dir: Path, spec: UnitSpec, api_fn, cases: list[PreparedCase], library: Path, *,
               mode: str, harness: dict, probe: dict | None, timing_reps: int,
               env: dict | None = None) -> dict[str, list[int]]:
    """plan.json and inputs.npz; returns each timed case's rotation of input sets (kept by the caller:
    the child's folder is writable from inside, the judgement must not read its order back from there)."""
    params = [{"name": p["name"], "kind": p["kind"]} for p in header_params(api_fn)]
    arrays: dict[str, np.ndarray] = {}
    plan_cases, orders = [], {}

    def call_data(c, tag, call) -> dict:
        data, mp = {}, None
        for name, buf in c.layout["buffers"].items():
            a = call.args[name]
            if isinstance(a, (In, InOut)):
                key = f"{c.id}.{tag}.{name}"
                arrays[key] = a.array
                data[name] = key
        for pinfo in params:
            a = call.args[pinfo["name"]]
            if isinstance(a, Map):
                if a.file:
                    mp = {"file": a.file}
                else:
                    key = f"{c.id}.{tag}.map"
                    arrays[key] = a.array
                    mp = {"npz": key}
        return {"data": data, "map": mp, "scalars": _layout(spec, header_params(api_fn), call)["scalars"]}

    for c in cases:
        passes = [call_data(c, p, call) for p, call in enumerate(c.calls)]
        pc = {
            "id": c.id, "label": c.shape.label, "expect": c.shape.expect, "timed": c.shape.timed,
            "buffers": {n: {k: v for k, v in b.items() if k != "dtype"} for n, b in c.layout["buffers"].items()},
            "bind": c.layout["bind"], "outputs": c.layout["outputs"], "passes": passes,
        }
        if c.shape.timed and c.shape.expect == "ok" and timing_reps > 0:
            extra = [call_data(c, f"x{k}", call) for k, call in enumerate(c.timing_calls)]
            orders[c.id] = rotation_order(len(passes) + len(extra), timing_reps)
            pc["timing_sets"], pc["timing_order"] = passes + extra, orders[c.id]
        plan_cases.append(pc)
    plan = {
        "version": 1, "mode": mode, "library": str(Path(library).resolve()), "unit": spec.unit,
        "restype": "int" if api_fn.return_type.strip() == "int" else "void",
        "params": params, "harness": harness, "guard_bytes": 16384,
        "probe": probe or {"enabled": False}, "timing_reps": timing_reps, "cases": plan_cases,
        "env": {str(k): str(v) for k, v in (env or {}).items()},
    }
    plan_dir.mkdir(parents=True, exist_ok=True)
    (plan_dir / "plan.json").write_text(json.dumps(plan, indent=1))
    np.savez(plan_dir / "inputs.npz", **arrays)
    return orders


# ---------------------------------------------------------------------------
# Judging
# ---------------------------------------------------------------------------

def _out_arg(call: Call, name: str):
    a = call.args[name]
    return call.args[a.param] if isinstance(a, Same) else a


def _decode(raw: np.ndarray, arg, ref: np.ndarray) -> np.ndarray:
    dt = np.dtype("<i4") if getattr(arg, "dtype", "f32") == "i32" else np.dtype("<f4")
    vals = np.frombuffer(raw.tobytes(), dtype=dt)
    return vals[: ref.size].reshape(ref.shape)


def _value_failures(spec: UnitSpec, case: PreparedCase, p: int, call: Call, outputs, metrics: dict,
                    tag: str | None = None) -> list[Failure]:
    """sentinel / exact / tie-rule / values failures of one call's outputs (tag: the output key's
    middle part, the pass index unless given: 't3' for the 4th timed call)."""
    fails = []
    for name, tol in spec.outputs.items():
        key = f"{case.id}.{tag if tag is not None else p}.{name}"
        if key not in outputs:
            fails.append(Failure("crash", case.shape.label, p, f"no output {name!r} came back"))
            continue
        f = _judge_output(name, tol, outputs[key], case, p, call, metrics)
        if f is not None:
            fails.append(f)
    return fails


def _judge_output(name: str, tol, raw: np.ndarray, case: PreparedCase, p: int, call: Call,
                  metrics: dict) -> Failure | None:
    ref = np.asarray(call.expect[name])
    n_sent, first = compare.sentinel_count(raw)
    if n_sent:
        idx = tuple(int(v) for v in np.unravel_index(first, ref.shape)) if first < ref.size else (first,)
        metrics[name] = {"unwritten": n_sent}
        return Failure("sentinel", case.shape.label, p,
                       f"{name}: {n_sent} of {ref.size} elements never written (first at {idx})")
    got = _decode(raw, _out_arg(call, name), ref)
    if isinstance(tol, Exact):
        res = compare.compare_exact(got, ref, call.keys.get(name))
        metrics[name] = {"mismatch_rows": res.n_mismatch_rows, "rows": res.n_rows}
        if not res.ok:
            check = "tie-rule" if res.tie_only else "exact"
            extra = f" ({tol.tie_rule})" if check == "tie-rule" and tol.tie_rule else ""
            return Failure(check, case.shape.label, p,
                           f"{name}: {res.n_mismatch_rows} of {res.n_rows} rows differ, {res.first}{extra}")
        return None
    m = compare.float_metrics(got, ref)
    metrics[name] = {k: m[k] for k in ("max_abs", "max_rel", "nmse", "max_err_rms", "n_nonfinite")}
    why = compare.tolerance_violations(m, tol.nmse, tol.max_err_rms, tol.max_abs)
    if why:
        ex = compare.mismatch_examples(got, ref, ref.shape, limit=3)
        return Failure("values", case.shape.label, p,
                       f"{name}: {'; '.join(why)}" + (f" (e.g. {ex[0]})" if ex else ""))
    return None


def zero_answer_passes(spec: UnitSpec, cases: list[PreparedCase]) -> list[str]:
    """Where an all-zero answer would pass the spec's own value checks: "case label / output"
    for every ok case (first call) whose reference is too small for its tolerance to mean
    anything.  Such a case proves nothing about the path it reaches (a kernel that wrote
    zeros, or a port that skipped the work, passes it), so calibration refuses the spec."""
    out = []
    ok_cases = [c for c in cases if c.shape.expect == "ok" and c.calls]
    if ok_cases and all(c.shape.zero_answer for c in ok_cases):
        return ["every ok case declares an all-zero answer: nothing shows the op computes anything"]
    for case in ok_cases:
        if case.shape.zero_answer:
            continue
        call = case.calls[0]
        for name, tol in spec.outputs.items():
            ref = np.asarray(call.expect[name])
            zeros = np.zeros(max(1, ref.size) * 4, dtype=np.uint8)
            if _judge_output(name, tol, zeros, case, 0, call, {}) is None:
                out.append(f"{case.shape.label} / {name}")
    return out


def _recalled(spec: UnitSpec, case: PreparedCase, outputs) -> bool:
    """Call 2 returned call 1's answer (or nothing at all) where call 1 was right."""
    for name, tol in spec.outputs.items():
        k0, k1 = f"{case.id}.0.{name}", f"{case.id}.1.{name}"
        if k0 not in outputs or k1 not in outputs:
            return False
        r0, r1 = outputs[k0], outputs[k1]
        if r0.tobytes() == r1.tobytes():
            continue
        n_sent, _ = compare.sentinel_count(r1)
        if n_sent * 4 == r1.size:
            continue
        ref0 = np.asarray(case.calls[0].expect[name])
        got1 = _decode(r1, _out_arg(case.calls[1], name), ref0)
        if isinstance(tol, Exact):
            if not np.array_equal(got1, ref0):
                return False
        else:
            m = compare.float_metrics(got1, ref0)
            if compare.tolerance_violations(m, tol.nmse, tol.max_err_rms, tol.max_abs):
                return False
    return True


VALUE_CHECKS = {"sentinel", "exact", "tie-rule", "values"}


def evaluate(spec: UnitSpec, cases: list[PreparedCase], results: dict, outputs,
             success: str = "zero", stream: str = "the unit's stream",
             orders: dict | None = None, ran_through: bool = True) -> tuple[list[Failure], list[dict]]:
    """Failures by check, and a report per case.  `success`: the API's convention for a
    successful return ("zero", as mini_gpu.h; "nonzero", as ds4_gpu.h); `stream`: the target's
    [cuda] stream, in words, for the stream checks' texts; `orders`: the input set of each timed
    repetition per case (write_plan's), None: every repetition got the last pass's inputs."""
    def succeeded(rc) -> bool:
        if rc is None:
            return True
        return rc == 0 if success == "zero" else rc != 0

    failures: list[Failure] = []
    reports = []
    by_id = {c["id"]: c for c in (results or {}).get("cases", [])}
    for case in cases:
        crec = by_id.get(case.id)
        rep = {"id": case.id, **case.shape.facts(), "passes": []}
        reports.append(rep)
        seen = len((crec or {}).get("passes", []))
        # the checker's record says which calls were made: none is assumed (a run that died already has
        # its failure, by the check of how it died)
        if ran_through and seen < len(case.calls):
            failures.append(Failure("crash", case.shape.label, seen, f"call {seen + 1} of {len(case.calls)} "
                                    "was never seen through by the checker"))
        if crec is None:
            continue
        if ran_through and orders is not None and case.id in orders and "timing" not in crec \
                and seen == len(case.calls):
            failures.append(Failure("timing", case.shape.label, None, "the timed calls were never made"))
        value_fail = {}
        for prec in crec.get("passes", []):
            p = prec["pass"]
            call = case.calls[p]
            label = case.shape.label
            metrics: dict = {}
            f: list[Failure] = []
            rc = prec.get("rc")
            if prec.get("runner"):
                f.append(Failure("crash", label, p, prec["runner"]))
            if prec.get("launch_error"):
                f.append(Failure("cuda-error", label, p, f"CUDA error left after the call: {prec['launch_error']}"))
            if case.shape.expect == "ok" and not succeeded(rc):
                f.append(Failure("rc", label, p, f"returned {rc} (failure) on valid inputs"))
            if case.shape.expect == "error" and succeeded(rc):
                why = f" ({case.shape.why})" if case.shape.why else ""
                f.append(Failure("error-return", label, p, f"returned {rc} (success) on an invalid call{why}"))
            for s in prec.get("struct_changed", []):
                f.append(Failure("struct", label, p, f"descriptor of {s['tensor']} changed from "
                                 f"(data={_hx(s['before'][0])}, bytes={s['before'][1]}, owner={s['before'][2]}) to "
                                 f"(data={_hx(s['after'][0])}, bytes={s['after'][1]}, owner={s['after'][2]})"))
            for g in prec.get("guard_damage", []):
                if g.get("side") == "past-claim":  # the checker's: an error case's descriptor said fewer bytes
                    where = ("its descriptor's data pointer was NULL" if g.get("data_null") else
                             f"its descriptor claimed {g.get('claim')} bytes")
                    f.append(Failure("guard", label, p, f"{g['n_bytes']} bytes of {g['tensor']} past what the unit was "
                                     f"given were written ({where}; first {g['first']} bytes past it)"))
                    continue
                f.append(Failure("guard", label, p, f"{g['n_bytes']} guard bytes {g['side']} {g['tensor']} were "
                                 f"written (nearest {g['first']} bytes from its {'start' if g['side'] == 'before' else 'end'})"))
            for c in prec.get("const_changed", []):
                f.append(Failure("const", label, p, f"const input {c['tensor']} changed ({c['n_bytes']} bytes, "
                                 f"first at byte {c['first']})"))
            probe = prec.get("probe") or {}
            if probe.get("status") == "changed":
                f.append(Failure("stream", label, p, f"{', '.join(probe['changed'])} written while {stream} "
                                 "was still held by the harness: the work did not run on the unit's stream"))
            if prec.get("settle_changed"):
                f.append(Failure("stream", label, p, f"{', '.join(prec['settle_changed'])} still changing after "
                                 f"{stream} was synchronized: work left running on another stream"))
            if case.shape.judges_values and succeeded(rc):
                vf = _value_failures(spec, case, p, call, outputs, metrics)
                value_fail[p] = vf
                f.extend(vf)
            rep["passes"].append({"seed_index": p, "rc": rc, "metrics": metrics,
                                  "probe": probe.get("status"), "call_ms": prec.get("call_ms")})
            failures.extend(f)
        # a second call that fails only on values where the first was right: remembered answer?
        if value_fail.get(1) and not value_fail.get(0) and 0 in value_fail and _recalled(spec, case, outputs):
            failures = [x for x in failures if not (x.case == case.shape.label and x.pass_index == 1
                                                    and x.check in VALUE_CHECKS)]
            failures.append(Failure("repeat", case.shape.label, 1, "the second call (same buffers, fresh inputs) "
                                    "returned the first call's answer (or left the outputs untouched)"))
        if "timing" in crec:
            rep["timing"] = timing_stats(crec["timing"])
            failures.extend(_timed_failures(spec, case, rep["timing"], outputs, (orders or {}).get(case.id)))
    return failures, reports


def timing_stats(raw: dict) -> dict:
    """Median and p90 computed here from the child's raw per-call times (never taken from the child)."""
    t = {k: raw[k] for k in ("reps", "checked_reps", "l2_flushed", "l2_persisting_reset", "clock",
                             "settle_changed_reps", "wall_ms", "gap_limit_ms") if k in raw}
    if "wall_ms" in raw:
        t["raw_times_ms"] = list(raw.get("times_ms") or [])
        walls = sorted(float(x) for x in raw["wall_ms"])
        t["wall_median_ms"] = statistics.median(walls) if walls else None
    times = sorted(float(x) for x in raw.get("times_ms") or [] if isinstance(x, (int, float)) and x == x)
    tails = sorted(float(x) for x in raw.get("tail_ms") or [] if isinstance(x, (int, float)) and x == x)
    t["times_ms"] = times
    t["tail_median_ms"] = statistics.median(tails) if tails else None
    if times:
        t["median_ms"] = statistics.median(times)
        t["p90_ms"] = times[min(len(times) - 1, int(round(0.9 * (len(times) - 1))))]
        t["min_ms"] = times[0]
    else:
        t["median_ms"] = t["p90_ms"] = t["min_ms"] = None
    return t


def _timed_failures(spec: UnitSpec, case: PreparedCase, timing: dict, outputs,
                    order: list[int] | None = None) -> list[Failure]:
    """The timed calls judged: the checked repetitions' outputs against the reference of the input set
    each was given (`order`, the parent's record of the rotation), outputs that changed after the unit's
    stream was done, and a device still busy after the end event (work deferred to another stream)."""
    checked = timing.get("checked_reps") or []
    label, reps = case.shape.label, timing.get("reps")
    if not checked:
        return [Failure("timing", label, None, "the timed calls' outputs were not read back")]
    if "wall_ms" in timing:  # a checker timed the exchange: the events are believed only within its bound
        gaps = merge.gap_failures(timing.get("raw_times_ms") or [], timing["wall_ms"], int(reps or 0),
                                  float(timing.get("gap_limit_ms") or 0.5))
        if gaps:
            return [Failure("timing", label, None, gaps[0])]
    sets = case.timing_sets
    fails = []
    for r in checked:
        k = order[r] if order is not None and 0 <= r < len(order) else len(case.calls) - 1
        if not 0 <= k < len(sets):
            fails.append(Failure("timing", label, None, f"timed call {r + 1} of {reps}: no input set {k}"))
            continue
        for f in _value_failures(spec, case, min(k, len(case.calls) - 1), sets[k], outputs, {}, tag=f"t{r}"):
            fails.append(Failure("timing", label, None, f"timed call {r + 1} of {reps} (input set {k + 1} of "
                                 f"{len(sets)}): [{f.check}] {f.detail}"))
    for r in timing.get("settle_changed_reps") or []:
        fails.append(Failure("timing", label, None, f"timed call {r + 1} of {reps}: its outputs changed after the "
                             "unit's stream reported done: work left running past the end event"))
    tail, med = timing.get("tail_median_ms"), timing.get("median_ms")
    if tail is not None and med is not None and tail > max(TAIL_LIMIT_MS, TAIL_SHARE * med):
        fails.append(Failure("timing", label, None, f"the device was still busy {tail:.3g} ms (median) after each "
                             f"timed call's end event ({med:.3g} ms timed): work deferred to another stream or "
                             "thread is not part of the time"))
    return fails


def _hx(v) -> str:
    return hex(v) if isinstance(v, int) else str(v)


def _reference_sha(spec: UnitSpec) -> str | None:
    mod = spec.reference.rsplit(".", 1)[0]
    try:
        import importlib

        m = importlib.import_module(mod)
        return sha256_file(Path(m.__file__))
    except Exception:  # noqa: BLE001 - evidence only
        return None


def _clean(obj):
    """JSON-safe evidence: no NaN/inf (canonical JSON must be standard JSON)."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, (np.floating,)):
        return _clean(float(obj))
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


# ---------------------------------------------------------------------------
# Running a spec
# ---------------------------------------------------------------------------

def fresh_seeds(n: int = 2) -> list[int]:
    return [int.from_bytes(os.urandom(8), "little") for _ in range(n)]


@dataclass
class Description:
    """What a kind says of one judged run, besides its failures (see OpKind.describe)."""

    summary_ok: str  # the summary when nothing failed
    lines: list[str]  # the kind's own diagnostics, after the failures and what their checks mean
    checks_run: list[str]
    n_cases: int
    stream: str  # how "what the checks mean" names the unit's stream
    more_failures: list = field(default_factory=list)  # found only with the device's facts (impossible timing)
    evidence: dict = field(default_factory=dict)  # the kind's own evidence fields
    metrics: dict = field(default_factory=dict)
    worst_nmse: float | None = None


class OpKind:
    """Op specs (spec.py) as one kind of parity run; scenario.ScenarioKind is the other.  A kind is
    four steps -- prepare (inputs and what each call must show, in this process), plan (plan.json and
    inputs.npz for child.py, which dispatches on the plan's kind), judge (failures and a report per
    case, from the child's facts), describe (summary, diagnostics, the kind's evidence) -- and run_spec
    does the rest once: the plan folder, the child, its crash or timeout, the evidence."""

    noun = "parity"
    warm = True  # its plans may run in a warm worker (pool.py)
    sanitizable = True  # compute-sanitizer can rerun its plan

    def prepare(self, target, spec, seeds, ctx, prepared, files: Path, timed: bool = True) -> Prepared:
        # `prepared`: made while the build gate compiled; one made for another version of the spec, or
        # without the input sets this run's timed calls need, is not used
        if prepared is None or (prepared.unit, prepared.spec_sha256) != (spec.unit, spec.sha256) \
                or (timed and not prepared.timing_sets):
            prepared = prepare_cases(target, spec, seeds, ctx, timing_sets=timed)
        return prepared

    def plan(self, plan_dir: Path, target, spec, prepared: Prepared, library: Path, **kw) -> dict:
        return write_plan(plan_dir, spec, target.api_function(spec.unit), prepared.cases, library, **kw)

    def judge(self, target, spec, prepared: Prepared, outcome, outputs: dict, plan_dir: Path, harness: dict,
              orders: dict | None = None):
        mode = ((outcome.checker or {}).get("device") or {}).get("kind") or "cuda"
        return evaluate(spec, prepared.cases, merge.merged(outcome.results, outcome.checker, mode), outputs,
                        success=harness.get("success", "zero"), stream=target.spec.cuda.stream, orders=orders,
                        ran_through=outcome.status == "done")

    def describe(self, target, spec, prepared: Prepared, failures, reports, dev: dict, mode: str,
                 env: dict | None) -> Description:
        cases = prepared.cases
        timing, timed_cases = _timing(spec, cases, reports, dev)
        worst = _worst(spec, reports)
        n_ok = sum(1 for c in cases if c.shape.expect == "ok")
        n_open = sum(1 for c in cases if c.shape.expect == "either")
        w = f"; worst NMSE {worst[0]:.1e} ({worst[1]})" if worst else ""
        t = ""
        if timing and timing.get("gbps"):
            pct = f", {timing['pct_of_peak']:.1f}% of peak" if timing.get("pct_of_peak") else ""
            t = f"; {timing['gbps']:.1f} GB/s{pct} ({timing['case']})"
        lines = [f"reference: {spec.reference}; tolerances: " +
                 "; ".join(f"{k}: {v.describe()}" for k, v in spec.outputs.items()),
                 "cases (inputs drawn fresh at verify time):"]
        for rep in reports:
            ms = []
            for p in rep["passes"][:1]:
                for name, m in p["metrics"].items():
                    if "nmse" in m:
                        ms.append(f"{name} nmse={_f(m['nmse'])} max_abs={_f(m['max_abs'])}")
                    elif "unwritten" in m:
                        ms.append(f"{name} unwritten={m['unwritten']}")
                    else:
                        ms.append(f"{name} mismatch_rows={m.get('mismatch_rows')}")
            rc = [p["rc"] for p in rep["passes"]]
            lines.append(f"  {rep['label']:<44} [{rep['source']}] expect={rep['expect']} rc={rc} {'; '.join(ms)}")
        if timing:
            lines.append(f"timing ({timing['case']}): median {timing['median_ms']:.4f} ms, p90 "
                         f"{timing['p90_ms']:.4f} ms, {_f(timing['gbps'])} GB/s vs peak {timing['peak_gbps']}")
        mp = prepared.ctx.model_path  # "model:" shapes read the user's tensors when a model was given
        return Description(
            f"parity ok: {n_ok} cases x 2 seeds + {len(cases) - n_ok - n_open} error cases"
            f"{f' + {n_open} left open by the API' if n_open else ''} vs {spec.reference}{w}{t}",
            lines, ["rc", "error-return", "struct", "guard", "const", "sentinel", "exact", "tie-rule", "values",
                    "repeat", "timing", "impossible"] + (["stream"] if mode == "cuda" else []),
            len(cases), target.spec.cuda.stream, _impossible(reports, dev), worst_nmse=worst[0] if worst else None,
            evidence={"env": dict(env or {}), "zero_answer_passes": zero_answer_passes(spec, cases), "timing": timing,
                      "timed_cases": timed_cases,
                      "weights": {"model": str(mp), "bytes": mp.stat().st_size} if mp else {"model": None}},
            metrics={k: timing[k] for k in ("median_ms", "p90_ms", "gbps", "pct_of_peak")} if timing else {})


OP = OpKind()
# spec kind -> how it runs, for kinds other than an op (scenario.py registers its own)
KINDS: dict = {}


class _Unjudgeable(Exception):
    """Judging failed after the candidate ran (its files, however malformed, are its own doing)."""


def run_spec(target, spec, library: Path, **kw) -> GateResult:
    """Run `spec` (an op spec, or a runtime unit's scenario) against `library` and judge it (see
    _run_spec for the options).

    Whatever the candidate does happens in the child; an exception here is a
    harness fault, reported as a skipped gate (the unit stays "built"), never
    as a verdict on the candidate and never as a crashed run."""
    import traceback

    try:
        return _run_spec(target, spec, library, **kw)
    except _Unjudgeable as wrapped:
        exc = wrapped.__cause__
        detail = f"its results could not be judged: {type(exc).__name__}: {exc}"[:300]
        return GateResult("parity", False, f"parity failed [crash]: {detail}",
                          diagnostics=traceback.format_exc()[-4000:], check="crash",
                          evidence={"target": target.name, "unit": spec.unit, "gate": "parity", "ok": False,
                                    "candidate_sha256": kw.get("candidate_sha256"), "unjudgeable": detail})
    except Exception as exc:  # noqa: BLE001

        return GateResult("parity", False, f"parity skipped: harness error: {type(exc).__name__}: {exc}"[:300],
                          diagnostics=traceback.format_exc()[-4000:], skipped=True,
                          evidence={"target": target.name, "unit": spec.unit, "gate": "parity", "ok": False,
                                    "candidate_sha256": kw.get("candidate_sha256"), "harness_error": repr(exc)[:500]})


def _run_spec(target, spec, library: Path, *, workspace: Path | None = None, seeds: list[int] | None = None,
              sanitize: bool = False, timeout: float | None = None, mode: str = "cuda", timing_reps: int = 10,
              candidate_sha256: str | None = None, probe: dict | None = None, keep: bool | None = None,
              calibration: dict | None = None, ctx=None, env: dict | None = None,
              prepared: "Prepared | None" = None, regime: str | None = None,
              fresh_process: bool = False, profile_with=None, arch: str | None = None,
              screen: bool = False) -> GateResult:
    """A scenario is not timed (the perf gate skips it), makes its own ordering probes (hold/peek) and
    is not run under compute-sanitizer: `sanitize`, `timing_reps` and `probe` are op-spec options.
    `profile_with`: an executor that reruns the plan, once it completed, under a profiler
    (porter.optimize.profile); what it reads of its report stays its own, never a verdict."""
    t_start = time.monotonic()
    kind = KINDS.get(getattr(spec, "kind", None), OP)
    library = Path(library)
    base = Path(workspace) / "runs" / "parity" if workspace else Path(tempfile.gettempdir()) / "porter-parity"
    base.mkdir(parents=True, exist_ok=True)
    plan_dir = Path(tempfile.mkdtemp(prefix=f"{spec.unit}-", dir=base))
    keep = keep if keep is not None else bool(os.environ.get("PORTER_PARITY_KEEP"))
    regime = regime or target.spec.perf.regime
    harness = in_regime(harness_names(target), regime)
    san = None
    try:
        prepared = kind.prepare(target, spec, seeds, ctx, prepared, plan_dir / "files", timed=timing_reps > 0)
        if prepared.error is not None:
            return GateResult("parity", False, f"parity skipped: spec error: {prepared.error}", skipped=True)
        screened = screen and kind is OP and screen_cases(prepared.cases)
        if screened:
            prepared = dataclasses.replace(prepared, cases=screened)
        t_prepared = time.monotonic()
        plan = functools.partial(kind.plan, target=target, spec=spec, prepared=prepared, library=library,
                                 harness=harness, env=env)
        orders = plan(plan_dir, mode=mode, timing_reps=timing_reps,
                      probe=(probe if probe is not None else default_probe()) if mode == "cuda" else None)
        limit = watchdog_s(timeout or float(os.environ.get("PORTER_PARITY_TIMEOUT", DEFAULT_TIMEOUT_S)),
                           prepared.cases, timing_reps)
        t_planned = time.monotonic()
        # a warm worker serves one plan too, but the perf gate's re-time wants nothing made before its plan
        ex = (executors.fresh_executor(mode) if fresh_process else executors.executor(mode) if kind.warm
              else executors.child_executor(mode))
        if arch:  # a required architecture's run (gates.archs.across): on a GPU of that kind
            ex = executors.on_arch(ex, arch)
        outcome = ex.run(plan_dir, limit)
        t_ran = time.monotonic()
        try:  # from here on candidate code has run: whatever goes wrong judging it is its failure, never a skip
            outputs = _load_outputs(plan_dir / runner.CHECKER_DIR if outcome.checker is not None else plan_dir)
            failures, reports = kind.judge(target, spec, prepared, outcome, outputs, plan_dir, harness,
                                           orders=orders)
        except Exception as exc:  # noqa: BLE001
            raise _Unjudgeable(exc) from exc
        t_judged = time.monotonic()
        failures = _outcome_failures(outcome, {c.id: c.label for c in prepared.cases}) + failures
        if sanitize and kind.sanitizable and mode == "cuda" and outcome.status == "done":
            plan(plan_dir / "sanitize", mode="cuda", probe=None, timing_reps=0)
            o = executors.sanitizing(mode, arch).run(plan_dir / "sanitize", limit * 10)
            san = {"status": o.status, "detail": o.detail, "elapsed_s": round(o.elapsed_s, 2)}
            if san["status"] != "done":
                failures.append(Failure("sanitize", "all cases", None, san["detail"]))
        if profile_with is not None and kind.sanitizable and mode == "cuda" and outcome.status == "done":
            plan(plan_dir / "profile", mode="cuda", probe=None, timing_reps=0)
            profile_with.run(plan_dir / "profile", limit * 10)
    finally:
        if not keep:
            shutil.rmtree(plan_dir, ignore_errors=True)
    # the device as the checker saw it (the runner's words are the candidate's: a peak bandwidth it
    # inflated would hide an impossible time)
    dev = ((outcome.checker or {}).get("device") if outcome.checker is not None
           else (outcome.results or {}).get("device")) or {}
    d = kind.describe(target, spec, prepared, failures, reports, dev, mode, env)
    failures = failures + d.more_failures
    ok = not failures
    failed_checks = sorted({f.check for f in failures}, key=compare.check_rank)
    in_ws = spec.path and target.workspace in spec.path.parents
    evidence = gate_facts(
        target, spec.unit, "parity", candidate_sha256, toolchain.device_facts(dev, mode, outcome.where or None), ok=ok,
        mode=mode,
        library={"path": str(library), "sha256": sha256_file(library), "arch": list(target.arch.archs)},
        sandbox=outcome.sandbox, device=dev,
        regime={"name": regime, "model_hook": harness.get("model_ptr"), "fresh_process": fresh_process},
        spec={"file": str(spec.path.relative_to(target.workspace)) if in_ws else str(spec.path),
              "sha256": spec.sha256, "identity": spec.identity_components, "reference": spec.reference,
              "reference_sha256": _reference_sha(spec),
              "outputs": {k: v.describe() for k, v in spec.outputs.items()}},
        calibration=calibration, seeds=[f"{s & (2**64 - 1):016x}" for s in prepared.seeds], cases=reports,
        **({"screen": {"cases": len(screened)}} if screened else {}),
        checks={"run": d.checks_run + (["sanitize"] if san else []), "failed": failed_checks},
        failures=[f.line() for f in failures[:50]],
        child={"status": outcome.status, "elapsed_s": round(outcome.elapsed_s, 3), "detail": outcome.detail,
               "phase_s": (outcome.results or {}).get("phase_s")},
        # where a run's minutes go (production-size ds4 cases: a parity run of 150 s whose child took 18):
        # writing the plan, the executor (a free slot and the GPU's gate, the checker, the child), judging
        sanitize=san, harness_s={k: round(v, 3) for k, v in {
            "prepare_s": t_prepared - t_start, "plan_s": t_planned - t_prepared, "executor_s": t_ran - t_planned,
            "waited_s": outcome.waited_s, "child_s": outcome.elapsed_s, "judge_s": t_judged - t_ran,
            "total_s": time.monotonic() - t_start}.items()}, **{"timing": None, **d.evidence})
    if ok:
        summary = d.summary_ok
    else:
        first = compare.first_failure(failures)
        more = f" (+{len(failures) - 1} more; failed: {', '.join(failed_checks)})" if len(failures) > 1 else ""
        summary = f"parity failed [{first.check}]: {first.case}: {first.detail}"[:400] + more
    lines = []
    if failures:
        lines.append(f"{len(failures)} {kind.noun} failure(s), first by check order:")
        lines.extend(f"  {f.line()}" for f in sorted(failures, key=lambda x: compare.check_rank(x.check))[:20])
        lines += ["", "what the checks mean:"]
        lines.extend(f"  {c}: {compare.CHECK_DOC[c].format(stream=d.stream)}" for c in failed_checks)
        lines.append("")
    lines += d.lines
    if outcome.stderr_tail.strip():
        lines.append("child stderr (tail):")
        lines.extend("  " + ln for ln in outcome.stderr_tail.strip().splitlines()[-15:])
    if keep:
        lines.append(f"plan kept at {plan_dir}")
    metrics = {"ok": ok, "failed_checks": failed_checks, "n_failures": len(failures), "cases": d.n_cases,
               "worst_nmse": d.worst_nmse, **d.metrics}
    return GateResult("parity", ok, summary, "\n".join(lines), _clean(metrics), ParityEvidence.record(_clean(evidence)),
                      check=None if ok else first.check)


def screen_cases(cases: list[PreparedCase]) -> list[PreparedCase] | None:
    """The cases a mutation screen runs: every one the spec does not time.  The timed ones are the production
    sizes (ds4: 2048-token prefill, 64k-context decode), most of a heavy spec's run; a mutant the rest already
    refuses needs no more.  None where that would leave nothing, or drop nothing."""
    kept = [c for c in cases if not c.shape.timed]
    return kept if kept and len(kept) < len(cases) else None


def _load_outputs(plan_dir: Path) -> dict:
    try:
        with np.load(plan_dir / "outputs.npz") as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError):
        return {}


def _outcome_failures(o: runner.ChildOutcome, labels: dict | None = None) -> list[Failure]:
    where = runner.describe_step(o.last_step)
    case = (o.last_step or {}).get("case", "-")
    case = (labels or {}).get(case, case)
    if o.status == "done":
        return []
    if o.status == "timeout":
        return [Failure("timeout", case, None, o.detail)]
    if o.status == "crash":
        return [Failure("crash", case, None, o.detail)]
    if o.status == "sanitize":
        return [Failure("sanitize", case, None, o.detail)]
    if o.status == "fatal":
        f = (o.results or {}).get("fatal") or {}
        check = f.get("check") if f.get("check") in compare.CHECK_ORDER else "crash"
        return [Failure(check, case, None, f"{f.get('detail', o.detail)} {where}")]
    return [Failure("crash", case, None, f"parity child failed: {o.detail}")]


def _timing(spec, cases, reports, dev) -> tuple[dict | None, list[dict]]:
    """(the timed case with the most bytes, every timed case): each with its bytes, GB/s and roofline.
    perf judges every one (a prefill case as well as the decode one); the first is what a one-line
    summary names."""
    every: list[dict] = []
    peak, tflops = dev.get("peak_gbps"), dev.get("peak_fp32_tflops")
    for c, rep in zip(cases, reports):
        t = rep.get("timing")
        if not t or not t.get("median_ms") or not spec.bytes_moved:
            continue
        nbytes = int(spec.bytes_moved(c.shape))
        flops = int(spec.flops(c.shape)) if spec.flops else None
        gbps = nbytes / (t["median_ms"] * 1e-3) / 1e9 if t["median_ms"] > 0 else float("inf")
        roof_ms = max(nbytes / (peak * 1e9) * 1e3 if peak else 0.0,
                      flops / (tflops * 1e12) * 1e3 if flops and tflops else 0.0) or None
        rep["timing"] = dict(t, bytes=nbytes, flops=flops, gbps=gbps, roofline_ms=roof_ms)
        every.append({"case": c.shape.label, "bytes": nbytes, "flops": flops, "median_ms": t["median_ms"],
                      "p90_ms": t["p90_ms"], "min_ms": t.get("min_ms"), "reps": t["reps"], "gbps": gbps,
                      "times_ms": t.get("times_ms"), "input_sets": len(c.timing_sets),
                      "tail_median_ms": t.get("tail_median_ms"),
                      "l2_persisting_reset": t.get("l2_persisting_reset"),
                      "peak_gbps": peak, "peak_fp32_tflops": tflops, "roofline_ms": roof_ms,
                      "perf_floor": spec.perf_floor, "l2_flushed": t.get("l2_flushed"),
                      "pct_of_peak": (100.0 * gbps / peak) if gbps and peak else None, "clock": t.get("clock")})
    primary = max(every, key=lambda t: t["bytes"], default=None)
    return primary, every


def _impossible(reports, dev) -> list[Failure]:
    """A timed case faster than peak bandwidth allows for its bytes (the fastest call, not the median,
    must respect it: L2 is flushed before every call)."""
    peak = dev.get("peak_gbps")
    out = []
    for rep in reports:
        t = rep.get("timing") or {}
        if not peak or not t.get("bytes") or t.get("min_ms") is None:
            continue
        floor_ms = t["bytes"] / (peak * 1e9) * 1e3
        if t["min_ms"] < floor_ms:
            out.append(Failure("impossible", rep["label"], None,
                               f"{t['min_ms']:.4g} ms for {t['bytes']} bytes is {t['bytes'] / (max(t['min_ms'], 1e-9) * 1e6):.0f} GB/s, "
                               f"above the device's peak {peak:g} GB/s (at least {floor_ms:.4g} ms)"))
    return out


def _worst(spec, reports):
    worst = None
    for rep in reports:
        for p in rep["passes"]:
            for name, m in p["metrics"].items():
                v = m.get("nmse") if isinstance(m, dict) else None
                if v is not None and (worst is None or v > worst[0]):
                    worst = (v, f"{name}, {rep['label']}")
    return worst


def _f(v) -> str:
    return "-" if v is None else f"{v:.3g}"
