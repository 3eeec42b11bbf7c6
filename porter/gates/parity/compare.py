"""Metrics and the names of the parity checks (pure numpy: CI runs all of it).

Every way a candidate can be rejected by the parity gate has a name here, and
the gate's one-line summary starts with the name of the first check (in
CHECK_ORDER) that failed anywhere, so a reader, the next prompt and the
adversarial corpus (targets/<t>/adversarial/manifest.toml: must_fail_check)
all speak of the same thing.

Float outputs are judged like ggml's test-backend-ops: the normalised mean
squared error  NMSE = sum((out - ref)^2) / sum(ref^2)  must stay under the
spec's bound; a second bound on the worst single element relative to the
output's RMS stops one wrong element hiding in a large, mostly right output.
max abs and max rel are reported for the reader, not gated on (they depend on
the output's scale).  Integer outputs (expert ids) must match exactly, with the
tie rule the API header states; a mismatch confined to equal keys is reported
as "tie-rule", any other as "exact".
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

# The bit pattern every 4-byte element of an output holds before the call: a
# signalling NaN as float32, an absurd id as int32.  An element that still
# holds it afterwards was never written.
SENTINEL_U32 = 0x7FBADBAD

# In the order the summary ranks them: harness-level outcomes first, then
# memory discipline, then the numbers on valid inputs, then error handling on
# invalid inputs (a kernel that reads IQ2_XXS as Q8_0 and also skips the id
# check is named by the wrong numbers), then what only a second call shows.
CHECK_ORDER = (
    "timeout",       # the child ran past its time limit (hang, deadlock, endless kernel)
    "crash",         # the child died (segfault, abort) inside the candidate
    "load",          # the library does not load or lacks the unit's symbol
    "cuda-error",    # a CUDA error (illegal address, launch failure) after the call
    "rc",            # the call reported failure on inputs the API calls valid
    "struct",        # a tensor descriptor {data, bytes, owner} was changed by the call
    "guard",         # bytes just before or after a buffer were written
    "const",         # a const input (tensor or the model map, host or device copy) changed
    "stream",        # output written outside the unit's stream order (another stream, late writes)
    "sentinel",      # output elements still hold the pre-filled sentinel: never written
    "exact",         # an integer output differs from the reference
    "tie-rule",      # integer output differs only in the order of equal keys
    "values",        # a float output is outside the spec's tolerance
    "error-return",  # the call reported success on inputs the API calls an error
    "repeat",        # second call, same buffers, other inputs: the first answer came back
    "leak",          # scenario: memory a free should have returned is still in use
    "timing",        # outputs of the timed calls differ from the reference (work skipped while timed)
    "impossible",    # timed faster than the device's memory bandwidth allows for the bytes the op must move
    "sanitize",      # compute-sanitizer memcheck reported errors
)

CHECK_DOC = {
    "timeout": "did not finish within the time limit (hang, deadlock or endless kernel)",
    "crash": "the process running the candidate died (segfault/abort)",
    "load": "the backend library does not load or does not export the unit",
    "cuda-error": "a CUDA error was raised by or after the call",
    "rc": "reported failure (return code) on valid inputs",
    "error-return": "reported success on inputs the API header calls an error",
    "struct": "changed a tensor descriptor (data/bytes/owner) instead of writing into it",
    "guard": "wrote outside a buffer (guard bytes around it changed)",
    "const": "modified a const input (tensor, or the model map on host or device)",
    "stream": "did work outside {stream} order: output changed while that stream was held, or after it was synchronized",
    "sentinel": "left output elements unwritten (they still hold the NaN sentinel)",
    "exact": "integer output differs from the reference",
    "tie-rule": "integer output breaks the header's tie rule",
    "values": "float output outside tolerance",
    "repeat": "a second call with other inputs in the same buffers returned the first call's answer",
    "leak": "device memory allocated and freed through the API was not returned (free leaks)",
    "timing": "the outputs of the timed calls (same inputs, buffers reset before each) are not the reference's: "
              "every call must do the whole work",
    "impossible": "the measured time is below what the device's peak memory bandwidth allows for the bytes the op "
                  "must move: the timed calls did not do the work",
    "sanitize": "compute-sanitizer memcheck found errors",
}


def check_rank(name: str) -> int:
    return CHECK_ORDER.index(name)


@dataclass
class Failure:
    check: str
    case: str
    pass_index: int | None
    detail: str

    def __post_init__(self) -> None:
        if self.check not in CHECK_ORDER:
            raise ValueError(f"unknown parity check {self.check!r}")

    def line(self) -> str:
        where = self.case + (f" (call {self.pass_index + 1})" if self.pass_index is not None else "")
        return f"[{self.check}] {where}: {self.detail}"


def first_failure(failures: list[Failure]) -> Failure | None:
    """The failure the summary names: the first in CHECK_ORDER, then in case order."""
    if not failures:
        return None
    return min(enumerate(failures), key=lambda p: (check_rank(p[1].check), p[0]))[1]


# ---------------------------------------------------------------------------
# Float metrics
# ---------------------------------------------------------------------------

def _finite(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def float_metrics(got: np.ndarray, ref: np.ndarray) -> dict:
    """max_abs, max_rel, nmse, max_err_rms (max |err| / rms(ref)), counts.

    Non-finite outputs where the reference is finite count as errors of
    infinite size (nmse and max_err_rms become None = "not finite")."""
    g = np.asarray(got, dtype=np.float64).reshape(-1)
    r = np.asarray(ref, dtype=np.float64).reshape(-1)
    if g.shape != r.shape:
        raise ValueError(f"output has {g.size} values, reference {r.size}")
    n = r.size
    out = {"n": int(n), "n_nonfinite": 0, "max_abs": 0.0, "max_rel": 0.0, "nmse": 0.0,
           "max_err_rms": 0.0, "rms_ref": 0.0, "worst_index": None}
    if n == 0:
        return out
    bad = ~np.isfinite(g) & np.isfinite(r)
    out["n_nonfinite"] = int(bad.sum())
    rms = float(np.sqrt(np.mean(r * r)))
    out["rms_ref"] = rms
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(g - r)
    same = (g == r) | (np.isnan(g) & np.isnan(r))
    err[same] = 0.0
    err[np.isnan(err)] = np.inf
    worst = int(np.argmax(err))
    out["worst_index"] = worst
    max_abs = float(err[worst])
    out["max_abs"] = _finite(max_abs)
    floor = max(rms * 1e-6, np.finfo(np.float32).tiny)
    with np.errstate(invalid="ignore", over="ignore"):
        rel = err / np.maximum(np.abs(np.nan_to_num(r)), floor)
    out["max_rel"] = _finite(float(np.max(rel)))
    denom = float(np.sum(r * r))
    with np.errstate(over="ignore"):
        num = float(np.sum(err ** 2))
    if denom > 0:
        out["nmse"] = _finite(num / denom)
    else:
        out["nmse"] = 0.0 if num == 0 else None
    out["max_err_rms"] = _finite(max_abs / rms) if rms > 0 else (0.0 if max_abs == 0 else None)
    return out


def tolerance_violations(m: dict, nmse: float | None, max_err_rms: float | None,
                         max_abs: float | None) -> list[str]:
    """Human-readable reasons the metrics break the bounds (empty: within)."""
    why = []
    if m["n_nonfinite"]:
        why.append(f"{m['n_nonfinite']} non-finite values where the reference is finite")
    if nmse is not None and (m["nmse"] is None or m["nmse"] > nmse):
        why.append(f"NMSE {_fmt(m['nmse'])} > {nmse:.1e}")
    if max_err_rms is not None and (m["max_err_rms"] is None or m["max_err_rms"] > max_err_rms):
        why.append(f"max |err|/rms {_fmt(m['max_err_rms'])} > {max_err_rms:.1e}")
    if max_abs is not None and (m["max_abs"] is None or m["max_abs"] > max_abs):
        why.append(f"max |err| {_fmt(m['max_abs'])} > {max_abs:.1e}")
    return why


def _fmt(v) -> str:
    return "inf" if v is None else f"{v:.3e}"


# ---------------------------------------------------------------------------
# Sentinel, guards, hashes
# ---------------------------------------------------------------------------

def sentinel_bytes(nbytes: int) -> bytes:
    if nbytes % 4:
        raise ValueError("outputs are made of 4-byte elements")
    return np.full(nbytes // 4, SENTINEL_U32, dtype="<u4").tobytes()


def sentinel_count(raw: bytes | np.ndarray) -> tuple[int, int | None]:
    """(elements still holding the sentinel, index of the first)."""
    words = np.frombuffer(bytes(raw), dtype="<u4") if not isinstance(raw, np.ndarray) else raw.view("<u4")
    hit = np.flatnonzero(words == SENTINEL_U32)
    return int(hit.size), (int(hit[0]) if hit.size else None)


def byte_diff(expected: bytes, got: bytes) -> tuple[int, int | None]:
    """(bytes that differ, offset of the first)."""
    if len(expected) != len(got):
        return max(len(expected), len(got)), 0
    a = np.frombuffer(expected, dtype=np.uint8)
    b = np.frombuffer(got, dtype=np.uint8)
    d = np.flatnonzero(a != b)
    return int(d.size), (int(d[0]) if d.size else None)


def sha256(data: bytes | np.ndarray) -> str:
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).view(np.uint8).tobytes()
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------
# Exact outputs (indices) and the tie rule
# ---------------------------------------------------------------------------

@dataclass
class ExactResult:
    n_rows: int
    n_mismatch_rows: int = 0
    tie_only: bool = True  # every mismatching row differs only among equal keys
    first: str = ""  # "row 3: got [5, 2], want [2, 5]"
    details: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.n_mismatch_rows == 0


def compare_exact(got: np.ndarray, ref: np.ndarray, keys: np.ndarray | None = None) -> ExactResult:
    """Row-wise exact comparison of index outputs (rows = tokens, columns = ranks).

    With `keys` (per row, the values the indices rank, e.g. router logits or
    probabilities), a mismatching row whose chosen keys equal the reference's
    chosen keys position by position differs only in how ties were broken."""
    g = np.asarray(got).reshape(ref.shape[0], -1) if ref.ndim > 1 else np.asarray(got).reshape(1, -1)
    r = np.asarray(ref).reshape(g.shape)
    res = ExactResult(n_rows=int(r.shape[0]))
    kk = None if keys is None else np.asarray(keys).reshape(r.shape[0], -1)
    for t in range(r.shape[0]):
        if np.array_equal(g[t], r[t]):
            continue
        res.n_mismatch_rows += 1
        tie = False
        if kk is not None:
            n_keys = kk.shape[1]
            if np.all((g[t] >= 0) & (g[t] < n_keys)) and len(set(g[t].tolist())) == g.shape[1]:
                tie = bool(np.array_equal(kk[t][g[t]], kk[t][r[t]]))
        else:
            tie = False
        if not tie:
            res.tie_only = False
        line = f"row {t}: got {g[t].tolist()}, want {r[t].tolist()}" + (" (equal keys: tie order)" if tie else "")
        if not res.first:
            res.first = line
        if len(res.details) < 8:
            res.details.append(line)
    if res.n_mismatch_rows == 0:
        res.tie_only = False
    return res


def mismatch_examples(got: np.ndarray, ref: np.ndarray, shape: tuple[int, ...] | None = None,
                      limit: int = 5) -> list[str]:
    """The largest errors as 'index (i, j): got g, want r' lines (for the next prompt)."""
    g = np.asarray(got, dtype=np.float64).reshape(-1)
    r = np.asarray(ref, dtype=np.float64).reshape(-1)
    err = np.abs(g - r)
    err = np.where(np.isnan(err), np.inf, err)
    order = np.argsort(-err, kind="stable")[:limit]
    lines = []
    for i in order:
        if err[i] == 0:
            break
        idx = tuple(int(v) for v in np.unravel_index(int(i), shape)) if shape else (int(i),)
        lines.append(f"at {idx}: got {g[i]:.6g}, want {r[i]:.6g}")
    return lines
