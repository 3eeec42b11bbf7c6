"""Parity specs: what a unit is called with and what it must compute.

A target keeps one spec per op unit in targets/<t>/parity/<unit>.py (see the
README there).  A spec module defines ``SPEC = UnitSpec(...)``:

  unit       the API function (must exist in the target's header)
  reference  dotted name of the independent CPU reference it is compared with
  outputs    {param: Tol(...) | Exact(...)}: which tensors are compared, how
  shapes     [Shape(...)]: named sizes, where the weights come from
             ("fixture:<tensor>" = the real tensor of the fixture GGUF, at its
             real offset in the real file; "synthetic" = random valid blocks of
             the same type in a random map), expect "ok" or "error"
  build      build(shape, ctx, rng) -> Call: one call's arguments (by the
             header's parameter names) and the reference outputs.  It is
             called once per seed; the harness checks that both seeds give
             the same layout (same buffers, same scalars), because the second
             call reuses the first call's buffers.
  bytes_moved(shape) -> int: bytes a call must at least move (for GB/s)
  inputs     the distributions and magnitudes the inputs are drawn from, and why
             (one place per spec or per family helper; the calibration table shows it)

A Shape's `edge` names the numerical edge the case sits at (scores past exp's
range, rows near zero at the real eps, ...); the calibration table counts them.

Arguments, by the header's parameter types:
  const mini_gpu_tensor *  In(array)                  const input, checked unchanged
  mini_gpu_tensor *        Out(dtype, shape)          pre-filled with the sentinel, compared
                           InOut(array)               in place: initial contents, compared after
                           Same("other_param")        the same tensor object as another parameter
  const void *             Map(u8 array) | ctx.fixture_map()   the model map
  integers, float          Python numbers
  bool                     True/False (or 0/1)
  bool *                   Flag(): an out-flag in host memory (false before the call, not compared)

Bad tensor arguments, for shapes with expect="error" only (validate_call refuses them in an ok
shape, one line naming the parameter): whatever the header calls a bad argument must make the unit
report failure, and a port that drops its argument guards can write past a caller's buffer.
  either tensor kind       Null()                     a NULL tensor pointer (no descriptor at all)
                           In(a, data_null=True)      a descriptor whose data pointer is NULL (also
                           Out(dt, sh, data_null=True), InOut(a, data_null=True))
                           In(a, claim_bytes=k)       a descriptor claiming k bytes, fewer than the
                           Out(dt, sh, claim_bytes=k) buffer holds (InOut too): the real buffer stays
                                                      full size, so a unit that ignores the claim
                                                      writes inside memory the harness owns and is
                                                      refused by its return code, not by a crash; the
                                                      checker also refuses ("guard") any write past
                                                      the claim (past nothing, for data_null)
The plan carries them (a buffer's "data_null" / "claim_bytes", a NULL binding), the parity child
builds the descriptor from them before every call, and the verdict stays the checker's and the
parent's (gate.evaluate: an error case passes on a failure return, with guards and const inputs
intact).  A claim is a fact of the case's layout, so the two-seeds-same-layout rule covers it.

Weights by tensor name: a shape with source "model:<name>[,<name>...]" names
real GGUF tensors (ds4's names, e.g. blk.3.ffn_gate_exps.weight); its builder
asks ctx.weights(shape, [Want(...), ...], rng) for them.  With a user model
(PORTER_PARITY_MODEL, or Context(model_path=...)) the bytes are the real
tensors' (of their real types); without one they are synthetic tensors of the
census type and layout the spec names.  Large maps (the routed experts: 256
experts of several MB) are sparse files: only the experts a case selects hold
bytes, the rest reads as zeros.

Every spec is checked against the header (porter.target.cparse) before it runs:
every parameter bound exactly once, with an argument of its kind.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from porter.errors import PorterError
from porter.host.keyed_lock import key_lock
from porter.spec import identity
from porter.spec import weights as W

SPEC_DIR = "parity"
MODEL_ENV = "PORTER_PARITY_MODEL"  # the user's GGUF: "model:" shapes read their tensors from it


class SpecError(PorterError):
    """A parity spec is malformed or disagrees with the API header (the harness's fault, not the candidate's)."""


# ---------------------------------------------------------------------------
# Tolerances
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Tol:
    """Float output bounds: NMSE (ggml test-backend-ops style), worst element vs RMS, absolute."""

    nmse: float | None = 1e-8
    max_err_rms: float | None = 1e-3
    max_abs: float | None = None  # 0.0 = bit-exact

    def describe(self) -> str:
        parts = []
        if self.nmse is not None:
            parts.append(f"NMSE <= {self.nmse:.0e}")
        if self.max_err_rms is not None:
            parts.append(f"max|err|/rms <= {self.max_err_rms:.0e}")
        if self.max_abs is not None:
            parts.append("bit-exact" if self.max_abs == 0 else f"max|err| <= {self.max_abs:.0e}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Exact:
    """Integer output compared exactly.  `keys` names the input whose values rank the
    indices (ties among equal keys are reported as the check 'tie-rule')."""

    tie_rule: str = ""
    keys: str | None = None

    def describe(self) -> str:
        return "exact" + (f" (tie rule: {self.tie_rule})" if self.tie_rule else "")


# ---------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------

_DTYPES = {"f32": np.dtype("<f4"), "i32": np.dtype("<i4")}


def _dtype_name(a: np.ndarray) -> str:
    for name, dt in _DTYPES.items():
        if a.dtype == dt:
            return name
    raise SpecError(f"tensor arguments are float32 or int32, not {a.dtype}")


class _Descriptor:
    """What a tensor argument's descriptor says besides its real buffer: by default {data: the buffer,
    bytes: its size}.  An error case may lie in it (the header's bad arguments): `data_null` hands the
    unit a descriptor whose data pointer is NULL, `claim_bytes` one that holds fewer bytes than the
    buffer really has.  The buffer stays full size either way, so a unit that ignores the claim writes
    inside memory the harness owns and is refused by its return code (and by the checker, which sees
    the bytes past the claim change), never by a crash."""

    def _check_descriptor(self) -> None:
        self.data_null = bool(self.data_null)
        if self.claim_bytes is not None:
            if isinstance(self.claim_bytes, bool) or not isinstance(self.claim_bytes, (int, np.integer)):
                raise SpecError(f"claim_bytes is a byte count, not {type(self.claim_bytes).__name__}")
            self.claim_bytes = int(self.claim_bytes)
            if not 0 <= self.claim_bytes < self.nbytes:
                raise SpecError(f"claim_bytes={self.claim_bytes}: a claim is fewer bytes than the buffer's "
                                f"{self.nbytes} (and not negative)")

    @property
    def lies(self) -> str:
        """What the descriptor says that is not so, in words ("" when it tells the truth)."""
        parts = (["its data pointer is NULL"] if self.data_null else []) + (
            [f"it claims {self.claim_bytes} of the buffer's {self.nbytes} bytes"] if self.claim_bytes is not None else [])
        return " and ".join(parts)

    def descriptor(self) -> dict:
        """The plan's record of the lie (empty when there is none)."""
        return {**({"data_null": True} if self.data_null else {}),
                **({"claim_bytes": self.claim_bytes} if self.claim_bytes is not None else {})}


@dataclass
class _Given(_Descriptor):
    """A tensor argument whose initial contents the spec gives (In, InOut): two classes, not one with a
    flag, because the header's const-ness decides which of them a parameter may take."""

    array: np.ndarray
    data_null: bool = False
    claim_bytes: int | None = None

    def __post_init__(self):
        self.array = np.ascontiguousarray(self.array)
        self.dtype = _dtype_name(self.array)
        self._check_descriptor()

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


@dataclass
class In(_Given):
    """Const input: checked unchanged after the call."""


@dataclass
class InOut(_Given):
    """In place: initial contents, compared after the call."""


@dataclass
class Out(_Descriptor):
    dtype: str
    shape: tuple[int, ...]
    data_null: bool = False
    claim_bytes: int | None = None

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise SpecError(f"unknown output dtype {self.dtype!r}")
        self.shape = tuple(int(s) for s in self.shape)
        self._check_descriptor()

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * 4


@dataclass(frozen=True)
class Null:
    """A NULL pointer for a tensor parameter (`const T_tensor *` or `T_tensor *`): no descriptor at all."""


@dataclass(frozen=True)
class Same:
    param: str


@dataclass(frozen=True)
class Flag:
    """A `bool *` out-parameter: the child passes a host bool (false before the call)."""


@dataclass
class Map:
    """A host model map: the bytes a const void *model_map points at.  `file` set when
    the bytes are a file on disk (the fixture): the child then reads it itself."""

    array: np.ndarray
    file: str | None = None

    @property
    def size(self) -> int:
        return int(self.array.size)


@dataclass
class Call:
    """One call of the unit: arguments by parameter name, reference outputs by output name."""

    args: dict[str, Any]
    expect: dict[str, np.ndarray] = field(default_factory=dict)
    keys: dict[str, np.ndarray] = field(default_factory=dict)  # for Exact outputs: per-row ranking keys
    note: str = ""


EXPECTS = ("ok", "error", "either")


@dataclass(frozen=True)
class Shape:
    label: str
    dims: Mapping[str, Any]
    source: str = "synthetic"  # or "fixture:<tensor name>[,<tensor name>...]"
    # "error": the call must return non-zero.  "either": the API leaves the call open (a size past a
    # limit the header does not set, which the source refuses and another backend may handle): a non-zero
    # return passes as an error case does, a zero return is judged on its values as an ok case is
    expect: str = "ok"
    timed: bool = False  # time this case (real sizes) for the GB/s evidence
    why: str = ""
    # why an all-zero answer is the right one for this case (n = 0, everything masked): calibration
    # refuses a spec with any OTHER ok case an all-zero answer passes (gate.zero_answer_passes)
    zero_answer: str = ""
    # the numerical edge this case sits at, and what a fragile kernel does there (e.g. "scores
    # shifted by +200: exp overflows without the max subtracted"); counted in the calibration table
    edge: str = ""

    def __post_init__(self):
        if self.expect not in EXPECTS:
            raise SpecError(f"shape {self.label!r}: expect is 'ok', 'error' or 'either'")
        if self.expect == "either" and (self.timed or not self.why):
            raise SpecError(f"shape {self.label!r}: an 'either' case says why the API leaves it open (why=) "
                            "and is not timed (a refusal has no time to judge)")

    @property
    def judges_values(self) -> bool:
        """A call of this case that returns 0 is judged on its values (ok, and either)."""
        return self.expect in ("ok", "either")

    @property
    def fixture_tensors(self) -> list[str]:
        if not self.source.startswith("fixture:"):
            return []
        return [t.strip() for t in self.source[len("fixture:"):].split(",") if t.strip()]

    @property
    def model_tensors(self) -> list[str]:
        """The GGUF tensor names of a "model:<name>,..." source (real tensors when a model is given)."""
        if not self.source.startswith("model:"):
            return []
        return [t.strip() for t in self.source[len("model:"):].split(",") if t.strip()]

    def facts(self) -> dict:
        return {"label": self.label, "dims": {k: _plain(v) for k, v in self.dims.items()},
                "source": self.source, "expect": self.expect, **({"edge": self.edge} if self.edge else {})}


def inputs_facts(spec) -> dict:
    """What the calibration table shows of a spec's inputs: the declared distributions, how many
    ok cases it runs and which of them sit at a numerical edge."""
    shapes = [s for s in getattr(spec, "shapes", ()) if s.expect == "ok"]
    return {"inputs": getattr(spec, "inputs", "") or "", "cases": len(shapes),
            "edges": [s.label for s in shapes if s.edge]}


def _plain(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v


@dataclass
class UnitSpec:
    unit: str
    reference: str
    outputs: dict[str, Tol | Exact]
    shapes: list[Shape]
    build: Callable[[Shape, "Context", np.random.Generator], Call]
    bytes_moved: Callable[[Shape], int] | None = None  # the least bytes the op must move (roofline; perf)
    flops: Callable[[Shape], int] | None = None  # arithmetic the op must do, for compute-bound ops (perf floor)
    perf_floor: float | None = None  # least fraction of the roofline a timed case must reach (perf.py default)
    # which distributions and magnitudes the inputs are drawn from, and why (one place per spec or
    # per family helper); shown beside the spec in the calibration table
    inputs: str = ""
    notes: str = ""
    path: Path | None = None

    @property
    def sha256(self) -> str:
        """The spec's identity (porter.spec.identity): its file, the helpers and reference
        modules it loads, and the harness code and settings its verdict depends on."""
        return identity.digest(identity.of(self))

    @property
    def identity_components(self) -> dict[str, str]:
        return identity.of(self)


# ---------------------------------------------------------------------------
# The fixture and synthetic maps
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: str  # GGML type name, e.g. "Q8_0"
    shape: tuple[int, ...]  # row-major (numpy) order
    offset: int  # absolute byte offset in the file (= in the model map)
    nbytes: int


class Context:
    """What spec builders may use: the fixture (real tensors of the real file) and helpers."""

    def __init__(self, fixture_path: Path | None, model_path: Path | None = None):
        self.fixture_path = Path(fixture_path) if fixture_path else None
        self.model_path = Path(model_path) if model_path else None  # the user's GGUF, for "model:" shapes
        self._map: np.ndarray | None = None
        self._tensors: dict[str, TensorInfo] | None = None
        self._meta: dict[str, Any] | None = None
        self._cache: dict = {}
        self._model = None
        self._scratch = None
        # prepare() builds a spec's calls on several threads over one Context: the fixture's tables and the
        # scratch folder are made once (two folders would leave a call's weight map in the one dropped)
        self._lock = threading.RLock()

    @classmethod
    def for_target(cls, target, model_path: Path | None = None) -> "Context":
        path = target.fixture_path
        if path is not None and not path.is_file():
            ensure_fixture(target)
        model = model_path or os.environ.get(MODEL_ENV) or None
        return cls(path, model)

    def weights(self, shape: "Shape", wants: list, rng: np.random.Generator):
        """(Map, [Placed]) for a "model:<names>" shape: the user's tensors by name when a
        model is given, else synthetic tensors of each Want's type (porter.spec.weights)."""
        names = shape.model_tensors
        if not names:
            raise SpecError(f"shape {shape.label!r}: ctx.weights needs a source 'model:<tensor>,...'")
        with self._lock:
            if self.model_path is not None and self._model is None:
                self._model = W.ModelFile(self.model_path)
            if self._scratch is None:
                self._scratch = tempfile.TemporaryDirectory(prefix="porter-weights-")
        try:
            data, file, placed = W.place(wants, names, rng, self._model, Path(self._scratch.name))
        except W.WeightsError as exc:
            raise SpecError(f"shape {shape.label!r}: {exc}") from None
        return Map(data, file=file), placed

    def _load(self) -> None:
        if self._tensors is not None:
            return
        with self._lock:
            if self._tensors is None:
                self._load_locked()

    def _load_locked(self) -> None:
        if self.fixture_path is None or not self.fixture_path.is_file():
            raise SpecError(f"no fixture GGUF at {self.fixture_path}")
        import gguf

        r = gguf.GGUFReader(str(self.fixture_path))
        tensors = {}
        for t in r.tensors:
            shape = tuple(int(s) for s in reversed([int(x) for x in t.shape]))
            tensors[t.name] = TensorInfo(t.name, t.tensor_type.name, shape, int(t.data_offset), int(t.n_bytes))
        self._meta = {}
        for key, f in r.fields.items():
            try:
                if f.types and f.types[0] == gguf.GGUFValueType.STRING:
                    self._meta[key] = bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
                elif len(f.data) == 1:
                    v = f.parts[f.data[0]]
                    self._meta[key] = v.tolist()[0] if hasattr(v, "tolist") else v
            except (IndexError, TypeError, ValueError):
                continue
        self._map = np.fromfile(self.fixture_path, dtype=np.uint8)
        self._map.flags.writeable = False
        self._tensors = tensors  # last: a thread that sees it set finds the map and metadata there

    def tensor(self, name: str) -> TensorInfo:
        self._load()
        try:
            return self._tensors[name]
        except KeyError:
            raise SpecError(f"the fixture has no tensor {name!r}") from None

    def meta(self, key: str):
        self._load()
        try:
            return self._meta[key]
        except KeyError:
            raise SpecError(f"the fixture has no metadata key {key!r}") from None

    def fixture_map(self) -> Map:
        self._load()
        return Map(self._map, file=str(self.fixture_path))

    def cached(self, key, make):
        """Memoise something derived from the fixture (e.g. dequantized real weights); made once however
        many of prepare()'s threads ask for it together."""
        with self._lock:
            if key not in self._cache:
                self._cache[key] = make()
            return self._cache[key]

    @staticmethod
    def synthetic_map(blobs: list[np.ndarray], rng: np.random.Generator, lead: int = 160,
                      gap: int = 96, align: int = 32) -> tuple[Map, list[int]]:
        """A model map of random bytes holding `blobs` at 32-aligned, non-zero offsets
        (the offsets depend only on the blob sizes, so both seeds share a layout;
        the bytes around each blob are random, so reading the wrong offset shows)."""
        offsets, pos = [], lead
        for b in blobs:
            pos = (pos + align - 1) // align * align
            offsets.append(pos)
            pos += int(np.asarray(b).nbytes) + gap
        size = (pos + align - 1) // align * align
        m = rng.integers(0, 256, size, dtype=np.uint8)
        for off, b in zip(offsets, blobs):
            raw = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
            m[off:off + raw.size] = raw
        return Map(m), offsets


def ensure_fixture(target) -> Path:
    """Write the target's fixture GGUF (runs/fixtures/...) with its own script if it is missing."""
    path, script = target.fixture_path, target.fixture_script
    if path is None or script is None:
        raise SpecError(f"target {target.name} declares no fixture")
    if path.is_file():
        return path
    # specs run side by side (calibrate --jobs, porter run --jobs) and each may be the first to need the
    # fixture: one thread of this process writes it, and only a whole file ever appears at `path` (a reader
    # of a half-written GGUF saw tensors of the wrong size)
    with key_lock(f"fixture:{path}"):
        if path.is_file():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        proc = subprocess.run([sys.executable, str(script), str(tmp)], capture_output=True, text=True,
                              cwd=target.workspace, timeout=300)
        if proc.returncode != 0 or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SpecError(f"fixture script {script.name} failed: {tail[0]}")
        os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------
# Loading and validation
# ---------------------------------------------------------------------------

def spec_dir(target) -> Path:
    return target.dir / SPEC_DIR


def _module_name(path: Path, target_name: str) -> str:
    return f"porter_parity_spec_{target_name}_{path.stem}"


def _load_module(path: Path, target_name: str):
    name = _module_name(path, target_name)
    mod_spec = importlib.util.spec_from_file_location(name, path)
    if mod_spec is None or mod_spec.loader is None:
        raise SpecError(f"cannot import parity spec {path}")
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = mod
    try:
        mod_spec.loader.exec_module(mod)
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken spec file is one clear error
        raise SpecError(f"parity spec {path.name} does not import: {type(exc).__name__}: {exc}") from exc
    return mod


def _spec_module_attr(target, unit: str, name: str, default):
    path = spec_dir(target) / f"{unit}.py"
    if not path.is_file():
        return default
    mod = sys.modules.get(_module_name(path, target.name)) or _load_module(path, target.name)
    return getattr(mod, name, default)


def spec_known_good_env(target, unit: str) -> list[dict[str, str]]:
    """The spec file's KNOWN_GOOD_ENV: settings of the known-good's env knobs that choose another
    kernel for this op (its DISPATCH table names them); calibration runs each (variants.py)."""
    env = _spec_module_attr(target, unit, "KNOWN_GOOD_ENV", [])
    if not isinstance(env, list) or not all(isinstance(e, dict) and e and all(
            isinstance(k, str) and isinstance(v, str) for k, v in e.items()) for e in env):
        raise SpecError(f"parity spec {unit}.py: KNOWN_GOOD_ENV is a list of non-empty {{knob: value}} string tables")
    return [dict(e) for e in env]


def spec_unreachable(target, unit: str) -> dict[str, str]:
    """The spec file's UNREACHABLE: {kernel: why} for kernels the op's upstream function can name
    (its slice holds them) but no input of this op launches.  The launch trace reports them apart
    from the kernels no case reached, and flags one that a case did launch."""
    out = _spec_module_attr(target, unit, "UNREACHABLE", {})
    if not isinstance(out, dict) or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in out.items()):
        raise SpecError(f"parity spec {unit}.py: UNREACHABLE is a {{kernel name: why}} table of strings")
    return dict(out)


def sibling(spec_file: str, name: str):
    """Import a helper module kept beside the specs (a file starting with '_', never a spec itself)."""
    path = Path(spec_file).resolve().parent / f"{name}.py"
    # keyed by content too: a helper edited since it was first loaded runs again (the spec's identity,
    # pinned when it loads, names the helper's bytes, so they must be the bytes that ran)
    key = f"porter_parity_helper_{path.parent.parent.name}_{name}_{identity.file_sha(path)[:16]}"
    if key in sys.modules:
        return sys.modules[key]
    mod_spec = importlib.util.spec_from_file_location(key, path)
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules[key] = mod
    mod_spec.loader.exec_module(mod)
    return mod


def load_specs(target) -> dict[str, UnitSpec]:
    """Every spec of the target, by unit; each validated against the API header."""
    out: dict[str, UnitSpec] = {}
    d = spec_dir(target)
    if not d.is_dir():
        return out
    for path in sorted(d.glob("*.py")):
        if path.name.startswith("_"):
            continue
        mod = _load_module(path, target.name)
        specs = getattr(mod, "SPECS", None) or ([mod.SPEC] if hasattr(mod, "SPEC") else []) \
            or ([mod.SCENARIO] if hasattr(mod, "SCENARIO") else [])
        if not specs:
            raise SpecError(f"parity spec {path.name} defines no SPEC or SCENARIO")
        for s in specs:
            _validate_any(s, path, target)
            if s.unit in out:
                raise SpecError(f"two parity specs for {s.unit} ({out[s.unit].path.name}, {path.name})")
            out[s.unit] = s
    return out


def load_spec(target, unit: str) -> UnitSpec | None:
    d = spec_dir(target)
    path = d / f"{unit}.py"
    if path.is_file():
        mod = _load_module(path, target.name)
        s = getattr(mod, "SPEC", None) or getattr(mod, "SCENARIO", None)
        if s is not None and getattr(s, "unit", None) == unit:
            _validate_any(s, path, target)
            return s
    return load_specs(target).get(unit)


def _validate_any(s, path: Path, target) -> None:
    """A UnitSpec (one call) or a scenario (a sequence of calls, porter.gates.parity.scenario: it
    validates itself, so this module does not import that one)."""
    if not isinstance(s, UnitSpec) and callable(getattr(s, "validate_against", None)):
        s.path = path
        s.validate_against(target)
    elif not isinstance(s, UnitSpec):
        raise SpecError(f"parity spec {path.name}: SPEC is not a UnitSpec (nor SCENARIO a Scenario)")
    else:
        s.path = path
        validate_spec(s, target.api_function(s.unit))
    try:  # a spec whose identity would miss a file it loads is refused here, not found out in calibration
        identity.pin(s)
    except identity.IdentityError as exc:
        raise SpecError(f"parity spec {path.name}: {exc}") from None


def param_kind(type_text: str) -> str:
    """Kind of a header parameter type (canonical spelling from porter.target.cparse)."""
    t = " ".join(type_text.replace("*", " * ").split())
    if t.endswith("*"):
        base = t[:-1].strip()
        if base.endswith("_tensor"):
            return "tensor"
        if base == "const void":
            return "map"
        if base == "bool":
            return "flag"
        return "pointer"
    scalar = {"uint32_t": "u32", "uint64_t": "u64", "int32_t": "i32", "int64_t": "i64", "int": "i32",
              "unsigned": "u32", "unsigned int": "u32", "float": "f32", "double": "f64", "size_t": "u64",
              "bool": "bool", "_Bool": "bool"}
    return scalar.get(t, "unknown")


def header_params(api_fn) -> list[dict]:
    """[{name, kind, const}] of an ApiFunction (kind: tensor/map/u32/u64/i32/i64/f32/f64)."""
    out = []
    for p in api_fn.params:
        t = " ".join(p.type.replace("*", " * ").split())
        kind = param_kind(t)
        const = t.startswith("const ") and kind == "tensor"
        out.append({"name": p.name, "kind": kind, "const": const, "type": p.type})
    return out


def validate_spec(spec: UnitSpec, api_fn) -> None:
    params = {p["name"]: p for p in header_params(api_fn)}
    bad = [p for p in params.values() if p["kind"] in ("pointer", "unknown")]
    if bad:
        raise SpecError(f"{spec.unit}: parameter {bad[0]['name']} ({bad[0]['type']}) has no parity binding kind")
    for name, tol in spec.outputs.items():
        if name not in params:
            raise SpecError(f"{spec.unit}: output {name!r} is not a parameter of the header")
        if params[name]["kind"] != "tensor" or params[name]["const"]:
            raise SpecError(f"{spec.unit}: output {name!r} is not a non-const tensor parameter")
        if not isinstance(tol, (Tol, Exact)):
            raise SpecError(f"{spec.unit}: output {name!r} needs Tol(...) or Exact(...)")
    if not spec.shapes:
        raise SpecError(f"{spec.unit}: no shapes")
    labels = [s.label for s in spec.shapes]
    if len(set(labels)) != len(labels):
        raise SpecError(f"{spec.unit}: duplicate shape labels")
    if not any(s.expect == "ok" for s in spec.shapes):
        raise SpecError(f"{spec.unit}: no shape with expect='ok'")


def validate_call(spec: UnitSpec, api_fn, shape: Shape, call: Call) -> None:
    """Every header parameter bound once, with an argument of its kind."""
    params = header_params(api_fn)
    names = [p["name"] for p in params]
    extra = sorted(set(call.args) - set(names))
    missing = [n for n in names if n not in call.args]
    where = f"{spec.unit} shape {shape.label!r}"
    if extra:
        raise SpecError(f"{where}: arguments not in the header: {', '.join(extra)}")
    if missing:
        raise SpecError(f"{where}: header parameters without an argument: {', '.join(missing)}")
    for p in params:
        a, k = call.args[p["name"]], p["kind"]
        if k == "tensor":
            if isinstance(a, Null):
                ok = True
            elif p["const"]:
                ok = isinstance(a, In) or (isinstance(a, InOut) and any(
                    isinstance(b, Same) and b.param == p["name"] for b in call.args.values()))
            else:
                ok = isinstance(a, (Out, InOut, Same))
            if isinstance(a, Same):
                tgt = call.args.get(a.param)
                ok = ok and a.param in call.args and not isinstance(tgt, (Same, Null))
        elif k == "map":
            ok = isinstance(a, Map)
        elif k == "flag":
            ok = isinstance(a, Flag)
        elif k in ("u32", "u64", "i32", "i64"):
            ok = isinstance(a, (int, np.integer)) and not isinstance(a, bool)
            if ok:
                lo, hi = {"u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1), "i32": (-2**31, 2**31 - 1),
                          "i64": (-2**63, 2**63 - 1)}[k]
                ok = lo <= int(a) <= hi
        elif k == "bool":  # C bool (ds4_gpu_rope_tail_tensor's `inverse`): True/False or 0/1
            ok = isinstance(a, (bool, np.bool_)) or (isinstance(a, (int, np.integer)) and int(a) in (0, 1))
        elif k in ("f32", "f64"):
            ok = isinstance(a, (int, float, np.floating, np.integer)) and not isinstance(a, bool)
        else:
            ok = False
        if not ok:
            raise SpecError(f"{where}: parameter {p['name']} ({p['type']}) got {type(a).__name__}")
        bad = "a NULL pointer" if isinstance(a, Null) else \
            f"a descriptor where {a.lies}" if isinstance(a, _Descriptor) and a.lies else ""
        if bad and shape.expect != "error":
            raise SpecError(f"{where}: parameter {p['name']} gets {bad}: bad arguments belong in a shape "
                            "with expect='error'")
    if shape.judges_values:
        for name in spec.outputs:
            if name not in call.expect:
                raise SpecError(f"{where}: no reference for output {name!r}")
