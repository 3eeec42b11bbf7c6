"""Scenario specs: a runtime unit is checked by what a sequence of API calls does.

An op unit is one call with a reference output (spec.py).  A runtime unit --
alloc, view, free, write, read, copy, synchronize, the model-map calls -- has
no output of its own: what it promises shows only across calls (a write at an
odd offset is what a later read at that offset returns, and nothing else
changed; work enqueued before synchronize is visible after it).  A spec module
that defines ``SCENARIO = Scenario(...)`` instead of ``SPEC = UnitSpec(...)``
says, per case and per seed, which calls to make and what each must show:

    def build(case, ctx, rng) -> Script:
        s = Script()
        s.call("mini_gpu_init", expect="ok")
        s.call("mini_gpu_tensor_alloc", 4099, save="a", expect="ok")
        s.call("mini_gpu_tensor_write", T("a"), 0, HostIn(image), 4099, expect="ok")
        s.read("mini_gpu_tensor_read", "a", 17, 300, want=image[17:317])
        ...
        return s

    SCENARIO = Scenario(unit="mini_gpu_tensor_read", cases=[Case("odd offsets")], build=build)

This module is the language only; porter.gates.parity.scenario runs a scenario
and judges what its calls did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from porter.spec import SpecError, identity

KIND = "scenario"
HOLD_MS = 250  # long enough that work queued behind the hold is surely still pending when a no-op sync returns


# ---------------------------------------------------------------------------
# Arguments of a call (bound to the header's parameter types)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class T:
    """A tensor handle saved by an earlier call (save="name")."""

    name: str


@dataclass(frozen=True)
class _Null:
    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()


@dataclass
class HostIn:
    """Host bytes a call reads (const void *data): a fresh copy per call."""

    data: np.ndarray

    def __post_init__(self):
        self.data = np.ascontiguousarray(self.data).reshape(-1).view(np.uint8).copy()


@dataclass
class HostOut:
    """A host buffer a call writes (void *data): pre-filled with random bytes the call must overwrite."""

    nbytes: int
    prefill: np.ndarray | None = None


@dataclass(frozen=True)
class Str:
    text: str


@dataclass(frozen=True)
class ModelMap:
    """The address of a GGUF file mmapped read-only by the child (const void *model_map)."""

    path: str


@dataclass(frozen=True)
class ModelFd:
    """A file descriptor of the same GGUF file, opened read-only by the child (int fd)."""

    path: str


# ---------------------------------------------------------------------------
# A script: the calls of one case for one seed, and what each must show
# ---------------------------------------------------------------------------

@dataclass
class Expect:
    kind: str  # rc | bytes | value | ptr_delta | leak | floats | desc | printed: _EXPECTATIONS judges each
    step: str
    check: str = ""
    why: str = ""
    params: dict = field(default_factory=dict)


class Script:
    """Steps for the child and expectations for the judge, built by a scenario's `build`."""

    def __init__(self, rng: np.random.Generator | None = None):
        self.rng = rng or np.random.default_rng()
        self.steps: list[dict] = []
        self.expects: list[Expect] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.calls: dict[str, tuple[str, tuple]] = {}  # step id -> (function, args) for validation and messages

    def _id(self) -> str:
        return f"s{len(self.steps)}"

    # -- calls ---------------------------------------------------------------
    def call(self, fn: str, *args, save: str | None = None, expect: str | None = "ok", why: str = "") -> str:
        """Call `fn`; expect "ok" (success by the API's convention, non-NULL for a pointer; for a
        void function: no CUDA error left behind), "error" (the failure code / NULL), or None
        (nothing judged)."""
        sid = self._id()
        plan_args = []
        for i, a in enumerate(args):
            plan_args.append(self._arg(sid, i, a))
        step = {"id": sid, "op": "call", "fn": fn, "args": plan_args}
        if save:
            step["save"] = save
        self.steps.append(step)
        self.calls[sid] = (fn, args)
        if expect is not None:
            if expect not in ("ok", "error"):
                raise ValueError("expect is 'ok', 'error' or None")
            self.expects.append(Expect("rc", sid, why=why, params={"want": expect}))
        return sid

    def _arg(self, sid: str, i: int, a) -> dict:
        if isinstance(a, T):
            return {"k": "tensor", "name": a.name}
        if a is NULL:
            return {"k": "null"}
        if isinstance(a, HostIn):
            key = f"{sid}.in{i}"
            self.arrays[key] = a.data
            return {"k": "in", "npz": key}
        if isinstance(a, HostOut):
            key = f"{sid}.prefill{i}"
            pre = a.prefill if a.prefill is not None else self.rng.integers(0, 256, a.nbytes, dtype=np.uint8)
            self.arrays[key] = np.ascontiguousarray(pre, dtype=np.uint8).reshape(-1)
            return {"k": "out", "n": int(a.nbytes), "npz": key}
        if isinstance(a, Str):
            return {"k": "str", "v": a.text}
        if isinstance(a, ModelMap):
            return {"k": "map", "path": a.path}
        if isinstance(a, ModelFd):
            return {"k": "fd", "path": a.path}
        if isinstance(a, (bool, np.bool_)):
            return {"k": "scalar", "v": bool(a)}
        if isinstance(a, (int, np.integer)):
            return {"k": "scalar", "v": int(a)}
        if isinstance(a, (float, np.floating)):
            return {"k": "scalar", "v": float(a)}
        raise ValueError(f"argument {i} of step {sid}: unsupported {type(a).__name__}")

    def value(self, step: str, want: int, check: str = "exact", why: str = "") -> None:
        """The integer return value of `step` must equal `want`."""
        self.expects.append(Expect("value", step, check, why, {"want": int(want)}))

    def read(self, fn: str, tensor: str, offset: int, nbytes: int, want: np.ndarray, *, region=None,
             check: str = "exact", why: str = "", expect: str = "ok") -> str:
        """Call the API's read function into a fresh host buffer and compare it with `want`.
        `region` (lo, hi) within the read: differences inside are `check`, outside are
        "guard" (bytes a call was not given changed); None: the whole read is `check`."""
        sid = self.call(fn, T(tensor), int(offset), HostOut(int(nbytes)), int(nbytes), expect=expect, why=why)
        if expect != "error":  # a refused read is judged by its return code alone
            self.expects.append(Expect("bytes", sid, check, why, {"want": _u8(want), "region": region, "arg": 2}))
        return sid

    def floats(self, step: str, want: np.ndarray, *, nmse: float, max_err_rms: float, why: str = "",
               arg: int = 2) -> None:
        """The host buffer argument `arg` of `step`, as float32, within tolerance of `want`."""
        self.expects.append(Expect("floats", step, "values", why, {"want": np.asarray(want, np.float64),
                                                                   "nmse": nmse, "max_err_rms": max_err_rms,
                                                                   "arg": arg}))

    # -- observations outside the API ----------------------------------------
    def peek(self, tensor: str, offset: int, nbytes: int, want: np.ndarray, *, region=None, check: str = "stream",
             why: str = "") -> str:
        """Raw bytes of a tensor through its descriptor (the target's conventions fix its layout),
        read on a stream ordered after nothing the unit enqueued: what is really there now."""
        sid = self._id()
        self.steps.append({"id": sid, "op": "peek", "tensor": tensor, "offset": int(offset), "n": int(nbytes)})
        self.expects.append(Expect("bytes", sid, check, why, {"want": _u8(want), "region": region}))
        return sid

    def descriptor(self, tensor: str, *, bytes_: int | None = None, owner: int | None = None,
                   data_from: tuple[str, int] | None = None, why: str = "") -> str:
        """The descriptor {data, bytes, owner} of a tensor: checked as "struct"."""
        sid = self._id()
        self.steps.append({"id": sid, "op": "desc", "tensor": tensor})
        self.expects.append(Expect("desc", sid, "struct", why, {"bytes": bytes_, "owner": owner,
                                                               "data_from": data_from}))
        return sid

    def host_bytes(self, ptr_step: str, offset: int, nbytes: int, want: np.ndarray, *, check: str = "exact",
                   why: str = "") -> str:
        """Read host memory at the pointer `ptr_step` returned (e.g. a managed tensor's contents)."""
        sid = self._id()
        self.steps.append({"id": sid, "op": "host", "ptr_step": ptr_step, "offset": int(offset), "n": int(nbytes)})
        self.expects.append(Expect("bytes", sid, check, why, {"want": _u8(want), "region": None}))
        return sid

    def ptr_delta(self, step_a: str, step_b: str, delta: int, why: str = "") -> None:
        """Pointer returned by step_b minus pointer returned by step_a must be `delta`."""
        self.expects.append(Expect("ptr_delta", step_b, "exact", why, {"a": step_a, "delta": int(delta)}))

    def hold(self) -> str:
        """Occupy the unit's stream (CUDA) so work enqueued next stays pending until synchronized."""
        sid = self._id()
        self.steps.append({"id": sid, "op": "hold", "ms": HOLD_MS})
        return sid

    def release(self) -> str:
        sid = self._id()
        self.steps.append({"id": sid, "op": "release"})
        return sid

    def mem(self) -> str:
        """Device memory in use now (cudaMemGetInfo; host mode: the C heap)."""
        sid = self._id()
        self.steps.append({"id": sid, "op": "mem"})
        return sid

    def no_leak(self, before: str, after: str, slack: int, why: str = "") -> None:
        self.expects.append(Expect("leak", after, "leak", why, {"before": before, "slack": int(slack)}))

    def printed(self, step: str, text: str, why: str = "") -> None:
        """The child's stdout or stderr holds `text` (written by `step`, e.g. a report with this label)."""
        self.expects.append(Expect("printed", step, "exact", why, {"text": text}))

    def functions(self) -> set[str]:
        return {fn for fn, _ in self.calls.values()}


def _u8(a) -> np.ndarray:
    if isinstance(a, (bytes, bytearray)):
        return np.frombuffer(bytes(a), dtype=np.uint8).copy()
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).copy()


# ---------------------------------------------------------------------------
# The spec kind
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    label: str
    dims: dict = field(default_factory=dict)
    why: str = ""

    def facts(self) -> dict:
        return {"label": self.label, "dims": dict(self.dims), "source": "scenario", "expect": "ok"}


@dataclass(frozen=True)
class Behaviour:
    """What a scenario's checks describe (evidence's spec.outputs entry)."""

    text: str

    def describe(self) -> str:
        return self.text


@dataclass
class Scenario:
    unit: str
    cases: list[Case]
    build: Callable[[Case, Any, np.random.Generator], Script]
    checks: str = ""  # one line: what the scenario proves (evidence and diagnostics)
    reference: str = ""
    notes: str = ""
    path: Path | None = None
    kind: str = KIND
    uses: tuple[str, ...] = ()  # other units the scenario calls (default: found by building case 0)

    def __post_init__(self):
        if not self.reference:
            self.reference = f"scenario:{self.unit}"

    @property
    def sha256(self) -> str:
        """The scenario's identity: its file, the helpers it loads and the harness it is judged by
        (porter.spec.identity)."""
        return identity.digest(identity.of(self))

    @property
    def identity_components(self) -> dict[str, str]:
        return identity.of(self)

    @property
    def outputs(self) -> dict:
        return {"behaviour": Behaviour(self.checks or "API behaviour across calls")}

    # op-spec attributes other code may read
    bytes_moved = None
    shapes = ()

    # the hook spec.py's load_spec calls on any spec kind it does not know
    def validate_against(self, target) -> None:
        validate(self, target)



def is_scenario(spec) -> bool:
    return getattr(spec, "kind", None) == KIND


# ---------------------------------------------------------------------------
# Header binding
# ---------------------------------------------------------------------------

_SCALARS = {"uint32_t": "u32", "uint64_t": "u64", "int32_t": "i32", "int64_t": "i64", "int": "i32", "size_t": "u64",
            "unsigned": "u32", "unsigned int": "u32", "float": "f32", "double": "f64", "bool": "bool", "_Bool": "bool"}


def c_kind(type_text: str) -> str:
    """Binding kind of a header type: tensor, cvoid, void, cstr, u32/u64/i32/i64/f32/f64/bool, or unknown."""
    t = " ".join(type_text.replace("*", " * ").split())
    if t.endswith("*"):
        base = t[:-1].strip()
        if base.endswith("_tensor"):
            return "tensor"
        return {"const void": "cvoid", "void": "void", "const char": "cstr", "char": "cstr"}.get(base, "unknown")
    return _SCALARS.get(t, "unknown")


def ret_kind(type_text: str) -> str:
    t = " ".join(type_text.replace("*", " * ").split())
    if t == "void":
        return "none"
    if t.endswith("*"):
        return "handle" if t[:-1].strip().endswith("_tensor") else "ptr"
    k = _SCALARS.get(t, "unknown")
    return k if k != "unknown" else "unknown"


_ACCEPTS = {
    "tensor": (T, _Null),
    "cvoid": (HostIn, ModelMap, _Null),
    "void": (HostOut, _Null),
    "cstr": (Str, _Null),
}


def bind(target, script: Script, where: str) -> dict:
    """{function: {ret, params}} for the plan; every call checked against the header."""
    fns = {}
    for sid, (name, args) in script.calls.items():
        try:
            api_fn = target.api_function(name)
        except Exception as exc:  # noqa: BLE001 - an unknown function is a spec error
            raise SpecError(f"{where}: step {sid} calls {name}, which the API header does not declare ({exc})") \
                from None
        params = [c_kind(p.type) for p in api_fn.params]
        if len(args) != len(params):
            raise SpecError(f"{where}: step {sid}: {name} takes {len(params)} arguments, got {len(args)}")
        for p, k, a in zip(api_fn.params, params, args):
            if k in _ACCEPTS:
                ok = isinstance(a, _ACCEPTS[k])
            elif k in ("u32", "u64", "i32", "i64"):
                ok = isinstance(a, (int, np.integer, ModelFd)) and not isinstance(a, bool)
                if ok and isinstance(a, ModelFd):
                    ok = k in ("i32", "i64")
                elif ok:
                    lo, hi = {"u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1), "i32": (-2**31, 2**31 - 1),
                              "i64": (-2**63, 2**63 - 1)}[k]
                    ok = lo <= int(a) <= hi
            elif k == "bool":
                ok = isinstance(a, (bool, np.bool_))
            elif k in ("f32", "f64"):
                ok = isinstance(a, (int, float, np.floating)) and not isinstance(a, bool)
            else:
                raise SpecError(f"{where}: {name} parameter {p.name} ({p.type}) has no scenario binding")
            if not ok:
                raise SpecError(f"{where}: step {sid}: {name} parameter {p.name} ({p.type}) got {a!r:.60}")
        rk = ret_kind(api_fn.return_type)
        if rk == "unknown":
            raise SpecError(f"{where}: {name} returns {api_fn.return_type}, which has no scenario binding")
        fns[name] = {"ret": rk, "params": params}
    for e in script.expects:
        if e.kind == "rc" and e.params["want"] == "error" and fns[script.calls[e.step][0]]["ret"] == "none":
            raise SpecError(f"{where}: step {e.step}: {script.calls[e.step][0]} returns void: it cannot refuse")
    return fns


def validate(scenario: Scenario, target) -> None:
    """Static checks at load time (each case's script is bound when it is built)."""
    target.api_function(scenario.unit)
    if not scenario.cases:
        raise SpecError(f"{scenario.unit}: a scenario needs at least one case")
    labels = [c.label for c in scenario.cases]
    if len(set(labels)) != len(labels):
        raise SpecError(f"{scenario.unit}: duplicate case labels")
