"""How a scenario (porter.spec.scenario) is run and judged.

The scenario runs through gate.run_spec as its second kind (ScenarioKind) and
in the same parity child (child.py hands a plan of kind "scenario" to
scenario_child.py): the same process isolation, time limit and crash
containment as an op spec, and the same evidence builder.  The child only
calls and records (return values, host buffers the calls wrote, raw tensor
bytes read through the target's descriptor, device memory in use); every
judgement is made here, by the check names of compare.CHECK_ORDER:

  rc / error-return   a valid call failed / an invalid call (bad size, range
                      outside a tensor) was not refused with the API's failure code
  cuda-error          a CUDA error left behind by a call that should have worked
  struct              a descriptor does not hold what the call returned
  guard               bytes outside the range a call was given changed
  stream              work enqueued before synchronize/end/cleanup was not
                      complete after it (read on a stream ordered after nothing)
  sentinel            a read reported success and left the host buffer as it was
  exact               bytes, sizes or pointers differ from what the calls imply
  values              float results (e.g. reads through an F16 expansion) out of tolerance
  leak                device memory not returned by free
"""


from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from porter.gates.parity import compare, gate
from porter.spec import identity  # noqa: F401
from porter.gates.parity.compare import Failure
from porter.spec import Context, SpecError
from porter.target.placeholder import is_placeholder
from porter.spec.scenario import (  # noqa: F401 - the language, re-exported for the code that runs it
    KIND, HOLD_MS, T, _Null, HostIn, HostOut, Str, ModelMap, ModelFd, Expect, Script, _u8, Case, Behaviour,
    Scenario, is_scenario, c_kind, ret_kind, bind, validate,
)

# ---------------------------------------------------------------------------
# Preparing and running (parent side)
# ---------------------------------------------------------------------------

@dataclass
class PreparedRun:
    id: str  # "c<i>.p<pass>"
    case: Case
    index: int
    pass_index: int
    script: Script
    functions: dict

    @property
    def label(self) -> str:
        return self.case.label


def prepare(target, scenario: Scenario, ctx, seeds: list[int]) -> list[PreparedRun]:
    runs = []
    for i, case in enumerate(scenario.cases):
        for p, seed in enumerate(seeds[:2]):
            rng = np.random.default_rng([seed & (2**64 - 1), i])
            where = f"{scenario.unit} case {case.label!r}"
            try:
                script = scenario.build(case, ctx, rng)
            except SpecError:
                raise
            except Exception as exc:  # noqa: BLE001 - a spec bug, reported as such
                raise SpecError(f"{where}: building the script failed: {type(exc).__name__}: {exc}") from exc
            if not isinstance(script, Script):
                raise SpecError(f"{where}: build must return a Script")
            if scenario.unit not in script.functions():
                raise SpecError(f"{where}: the script never calls {scenario.unit}")
            runs.append(PreparedRun(f"c{i}.p{p}", case, i, p, script, bind(target, script, where)))
    return runs


def write_plan(plan_dir: Path, scenario: Scenario, runs: list[PreparedRun], library: Path, *, mode: str,
               harness: dict, env: dict | None = None) -> None:
    arrays: dict[str, np.ndarray] = {}
    functions: dict[str, dict] = {}
    cases = []
    for r in runs:
        functions.update(r.functions)
        for k, v in r.script.arrays.items():
            arrays[f"{r.id}.{k}"] = v
        cases.append({"id": r.id, "label": r.case.label, "pass": r.pass_index, "steps": r.script.steps})
    plan = {"version": 1, "kind": KIND, "mode": mode, "library": str(Path(library).resolve()),
            "unit": scenario.unit, "harness": harness, "functions": functions, "cases": cases,
            "env": {str(k): str(v) for k, v in (env or {}).items()}}
    plan_dir.mkdir(parents=True, exist_ok=True)
    (plan_dir / "plan.json").write_text(json.dumps(plan, indent=1))
    np.savez(plan_dir / "inputs.npz", **arrays)


class ScenarioContext:
    """What scenario builders may use: the target's fixture GGUF, and a folder for GGUF files they write."""

    def __init__(self, target, files_dir: Path):
        self.target = target
        self.files_dir = Path(files_dir)
        self._fixture = None

    @property
    def fixture(self):
        if self._fixture is None:
            self._fixture = Context.for_target(self.target)
        return self._fixture

    def new_file(self, name: str) -> Path:
        self.files_dir.mkdir(parents=True, exist_ok=True)
        return self.files_dir / name


# ---------------------------------------------------------------------------
# Judging (parent side)
# ---------------------------------------------------------------------------

def _succeeded(rk: str, ret, success: str) -> bool:
    if rk in ("handle", "ptr"):
        return bool(ret)
    if ret is None:
        return True
    return ret == 0 if success == "zero" else ret != 0


def _short_call(script: Script, sid: str) -> str:
    fn, args = script.calls.get(sid, ("?", ()))
    parts = []
    for a in args:
        if isinstance(a, T):
            parts.append(a.name)
        elif isinstance(a, HostIn):
            parts.append(f"<{a.data.size} bytes>")
        elif isinstance(a, HostOut):
            parts.append(f"<buffer {a.nbytes}>")
        elif isinstance(a, Str):
            parts.append(repr(a.text))
        elif isinstance(a, ModelMap):
            parts.append("<mmapped gguf>")
        elif isinstance(a, ModelFd):
            parts.append("<fd>")
        else:
            parts.append(repr(a))
    return f"{fn}({', '.join(parts)})"


def _step_label(script: Script, step: dict) -> str:
    if step["op"] == "call":
        return _short_call(script, step["id"])
    if step["op"] == "peek":
        return f"raw bytes [{step['offset']}, {step['offset'] + step['n']}) of {step['tensor']}"
    if step["op"] == "host":
        return f"host bytes [{step['offset']}, {step['offset'] + step['n']}) at the pointer of {step['ptr_step']}"
    return step["op"]


def _bytes_failures(e: Expect, got: np.ndarray, prefill: np.ndarray | None, what: str, add) -> None:
    want = e.params["want"]
    if got.size != want.size:
        add(e.check or "exact", f"{what}: {got.size} bytes came back, {want.size} expected")
        return
    # under 4 bytes a wrong read matches a random pre-fill too often (1 in 256 for one byte) to call it
    # "nothing written": there the mismatch is reported as exact, never as the wrong check
    if prefill is not None and want.size >= 4 and np.array_equal(got, prefill) and not np.array_equal(want, prefill):
        add("sentinel", f"{what}: reported success but the host buffer still holds its pre-fill (nothing written)")
        return
    diff = np.flatnonzero(got != want)
    if not diff.size:
        return
    lo, hi = e.params.get("region") or (0, want.size)
    inside = diff[(diff >= lo) & (diff < hi)]
    outside = diff[(diff < lo) | (diff >= hi)]
    if outside.size:
        add("guard", f"{what}: {outside.size} bytes outside [{lo}, {hi}) changed (first at byte {int(outside[0])}: "
                     f"got {int(got[outside[0]])}, want {int(want[outside[0]])})" + (f" -- {e.why}" if e.why else ""))
    if inside.size:
        i = int(inside[0])
        add(e.check or "exact", f"{what}: {inside.size} of {hi - lo} bytes differ (first at byte {i}: got "
                                f"{int(got[i])}, want {int(want[i])})" + (f" -- {e.why}" if e.why else ""))


def _read_text(path: Path, limit: int = 1 << 20) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def judge(runs: list[PreparedRun], results: dict | None, outputs: dict, success: str = "zero",
          printed: str = ""):
    failures: list = []
    reports = []
    by_id = {c["id"]: c for c in (results or {}).get("cases", [])}
    for r in runs:
        crec = by_id.get(r.id)
        metrics: dict = {}
        if r.pass_index == 0:
            reports.append({"id": f"c{r.index}", **r.case.facts(), "passes": []})
        rep = reports[-1]
        if crec is None:
            rep["passes"].append({"seed_index": r.pass_index, "steps": 0, "metrics": metrics})
            continue
        j = _Judging(r, crec, {s["id"]: s for s in crec.get("steps", [])}, {s["id"]: s for s in r.script.steps},
                     outputs, printed, success, metrics, failures)
        n_checked = 0
        for e in r.script.expects:
            rec = j.recs.get(e.step)
            if rec is None:
                continue  # never reached: the outcome (crash, timeout) names it
            n_checked += 1
            _EXPECTATIONS[e.kind](j, e, rec, _step_label(r.script, j.steps[e.step]))
        rep["passes"].append({"seed_index": r.pass_index, "steps": len(crec.get("steps", [])),
                              "checked": n_checked, "metrics": metrics})
    return failures, reports


@dataclass
class _Judging:
    """One pass of one case, as judge() reads it: the run, what each step recorded, the outputs."""
    r: PreparedRun
    crec: dict
    recs: dict
    steps: dict
    outputs: dict
    printed: str
    success: str
    metrics: dict
    failures: list

    def add(self, check: str, detail: str) -> None:
        self.failures.append(Failure(check, self.r.case.label, self.r.pass_index, detail))


def _why(e) -> str:
    return f" ({e.why})" if e.why else ""


def _expect_rc(j: _Judging, e, rec: dict, label: str) -> None:
    rk = j.r.functions[j.r.script.calls[e.step][0]]["ret"]
    ok = _succeeded(rk, rec.get("ret"), j.success)
    if e.params["want"] == "ok" and not ok:
        j.add("rc", f"{label} failed (returned {_ret_text(rk, rec.get('ret'))}) on a valid call{_why(e)}")
    elif e.params["want"] == "error" and ok:
        j.add("error-return", f"{label} returned {_ret_text(rk, rec.get('ret'))} (success) on an "
                              f"invalid call{_why(e)}")
    if e.params["want"] == "ok" and rec.get("err"):
        j.add("cuda-error", f"CUDA error left after {label}: {rec['err']}")


def _expect_bytes(j: _Judging, e, rec: dict, label: str) -> None:
    if not _producer_ok(j.r, e.step, j.recs, j.success):
        return  # the call itself failed: judged by rc
    if rec.get("refused"):
        j.add("struct", f"{label}: {rec['refused']}")
        return
    key = f"{j.r.id}.{e.step}" + (f".out{e.params['arg']}" if "arg" in e.params else "")
    if key not in j.outputs:
        j.add("crash", f"{label}: no bytes came back")
        return
    prefill = j.r.script.arrays.get(f"{e.step}.prefill{e.params['arg']}") if "arg" in e.params else None
    _bytes_failures(e, np.asarray(j.outputs[key], dtype=np.uint8), prefill, label, j.add)


def _expect_floats(j: _Judging, e, rec: dict, label: str) -> None:
    if not _producer_ok(j.r, e.step, j.recs, j.success):
        return
    key = f"{j.r.id}.{e.step}.out{e.params['arg']}"
    want = e.params["want"]
    got = np.frombuffer(np.asarray(j.outputs.get(key, np.zeros(0, np.uint8))).tobytes(), dtype="<f4")
    if got.size != want.size:
        j.add("values", f"{label}: {got.size} floats came back, {want.size} expected")
        return
    m = compare.float_metrics(got, want)
    j.metrics[e.step] = {k: m[k] for k in ("max_abs", "nmse", "max_err_rms", "n_nonfinite")}
    why = compare.tolerance_violations(m, e.params["nmse"], e.params["max_err_rms"], None)
    if why:
        ex = compare.mismatch_examples(got, want, want.shape, limit=1)
        j.add("values", f"{label}: {'; '.join(why)}" + (f" (e.g. {ex[0]})" if ex else "")
              + (f" -- {e.why}" if e.why else ""))


def _expect_value(j: _Judging, e, rec: dict, label: str) -> None:
    got = rec.get("ret")
    if got != e.params["want"]:
        j.add(e.check or "exact", f"{label} returned {got}, want {e.params['want']}{_why(e)}")


def _expect_printed(j: _Judging, e, rec: dict, label: str) -> None:
    if e.params["text"] not in j.printed:
        j.add("exact", f"{label} printed nothing with {e.params['text']!r} on stdout or stderr{_why(e)}")


def _expect_ptr_delta(j: _Judging, e, rec: dict, label: str) -> None:
    a = j.recs.get(e.params["a"])
    if a is None or not a.get("ret") or not rec.get("ret"):
        return  # a NULL pointer is judged by its own rc expectation
    d = int(rec["ret"]) - int(a["ret"])
    if d != e.params["delta"]:
        j.add("exact", f"{label} is {d:+d} bytes from {_step_label(j.r.script, j.steps[e.params['a']])}, "
                       f"want {e.params['delta']:+d}{_why(e)}")


def _expect_leak(j: _Judging, e, rec: dict, label: str) -> None:
    b = j.recs.get(e.params["before"])
    if b is None or b.get("mem") is None or rec.get("mem") is None:
        return
    grown = int(rec["mem"]) - int(b["mem"])
    j.metrics["mem_growth_bytes"] = grown
    if grown > e.params["slack"]:
        j.add("leak", f"{grown / 2**20:.1f} MiB more memory in use after the free loop than before "
                      f"(allowed {e.params['slack'] / 2**20:.0f} MiB)" + (f" -- {e.why}" if e.why else ""))


def _expect_desc(j: _Judging, e, rec: dict, label: str) -> None:
    d = rec.get("desc")
    if not d:
        return
    p = e.params
    bad = []
    if p.get("bytes") is not None and d["bytes"] != p["bytes"]:
        bad.append(f"bytes={d['bytes']} (want {p['bytes']})")
    if p.get("owner") is not None and d["owner"] != p["owner"]:
        bad.append(f"owner={d['owner']} (want {p['owner']})")
    if p.get("data_from"):
        src, off = p["data_from"]
        s = next((x for x in j.crec.get("steps", []) if x.get("op") == "desc" and x.get("tensor") == src), None)
        if s and s.get("desc") and d["data"] - s["desc"]["data"] != off:
            bad.append(f"data = {src}.data{d['data'] - s['desc']['data']:+d} (want {off:+d})")
    if bad:
        j.add("struct", f"descriptor of {j.steps[e.step]['tensor']}: {', '.join(bad)}{_why(e)}")


# one judge per expectation kind a script can declare (Script.expect_*)
_EXPECTATIONS = {"rc": _expect_rc, "bytes": _expect_bytes, "floats": _expect_floats, "value": _expect_value,
                 "printed": _expect_printed, "ptr_delta": _expect_ptr_delta, "leak": _expect_leak,
                 "desc": _expect_desc}


def _producer_ok(r: PreparedRun, sid: str, recs: dict, success: str) -> bool:
    if sid not in r.script.calls:
        return True
    rk = r.functions[r.script.calls[sid][0]]["ret"]
    return rk == "none" or _succeeded(rk, recs[sid].get("ret"), success)


def _ret_text(rk: str, ret) -> str:
    if rk in ("handle", "ptr"):
        return "NULL" if not ret else "a pointer"
    return str(ret)


class ScenarioKind:
    """Runtime scenarios as a kind of parity run (gate.OpKind says what a kind is): always a fresh
    child, never timed or run under compute-sanitizer (a scenario makes its own ordering probes)."""

    noun = "scenario"
    warm = False
    sanitizable = False

    def prepare(self, target, scenario: Scenario, seeds, ctx, prepared, files: Path, timed: bool = True) -> gate.Prepared:
        # `timed`: a scenario makes no timed calls either way
        seeds = list(seeds) if seeds else gate.fresh_seeds(2)
        if len(seeds) < 2:
            raise ValueError("parity needs at least two seeds")
        ctx = ctx or ScenarioContext(target, files)
        try:
            return gate.Prepared(scenario.unit, scenario.sha256, seeds, prepare(target, scenario, ctx, seeds), ctx)
        except SpecError as exc:
            return gate.Prepared(scenario.unit, scenario.sha256, seeds, [], None, str(exc))

    def plan(self, plan_dir: Path, target, spec: Scenario, prepared, library: Path, *, mode: str, harness: dict,
             env: dict | None, probe=None, timing_reps: int = 0) -> None:
        write_plan(plan_dir, spec, prepared.cases, library, mode=mode, harness=harness, env=env)

    def judge(self, target, spec: Scenario, prepared, outcome, outputs: dict, plan_dir: Path, harness: dict,
              orders: dict | None = None):
        printed = "".join(_read_text(plan_dir / n) for n in ("child.stdout", "child.stderr"))
        return judge(prepared.cases, outcome.results, outputs, success=harness.get("success", "zero"),
                     printed=printed)

    def describe(self, target, spec: Scenario, prepared, failures, reports, dev: dict, mode: str,
                 env: dict | None) -> gate.Description:
        runs = prepared.cases
        n_steps = sum(len(r.script.steps) for r in runs)
        lines = [f"scenario: {spec.checks or spec.unit}"]
        lines.extend(f"  {rep['label']:<52} steps run per seed: {[p.get('steps') for p in rep['passes']]}"
                     for rep in reports)
        return gate.Description(
            f"parity ok: scenario, {len(spec.cases)} cases x 2 seeds, {n_steps} steps, "
            f"{sum(len(r.script.expects) for r in runs)} expectations held ({spec.reference})", lines,
            ["rc", "error-return", "cuda-error", "struct", "guard", "sentinel", "exact", "values", "leak"]
            + (["stream"] if mode == "cuda" or any(s["op"] == "peek" for r in runs for s in r.script.steps) else []),
            len(spec.cases), "the unit stream", evidence={"kind": KIND})


KIND_OF_RUN = ScenarioKind()


def scenario_uses(target, scenario_or_spec) -> list[str]:
    """The other units a scenario calls (its declared `uses`, else what its first case's script calls);
    [] for an op spec or a scenario that does not build (reported when it runs)."""
    if not is_scenario(scenario_or_spec):
        return []
    uses = list(getattr(scenario_or_spec, "uses", ()) or ())
    if not uses:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            try:
                case = scenario_or_spec.cases[0]
                script = scenario_or_spec.build(case, ScenarioContext(target, Path(tmp)), np.random.default_rng(0))
                uses = sorted(script.functions())
            except Exception:  # noqa: BLE001 - a broken scenario is reported when it runs
                return []
    return [u for u in uses if u != scenario_or_spec.unit]


def blocked_by(target, scenario_or_spec) -> list[str]:
    """Units (other than the scenario's own) whose workspace file is still porter's placeholder:
    the scenario cannot say anything about its unit until they are ported."""
    return placeholders_among(target, scenario_uses(target, scenario_or_spec))


def placeholders_among(target, units) -> list[str]:
    """The units of `units` whose workspace file is still porter's placeholder."""
    out = []
    for u in units:
        try:
            p = target.unit_path(u)
        except Exception:  # noqa: BLE001
            continue
        if p.is_file() and is_placeholder(p.read_text(errors="replace")):
            out.append(u)
    return out


gate.KINDS[KIND] = KIND_OF_RUN  # gate.run_spec runs a spec of this kind with it
