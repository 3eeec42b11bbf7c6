"""Parity gate: a ported unit, called through the backend library on real GGUF
tensors, must compute what an independent CPU reference computes -- under checks
a clever wrong answer cannot pass.

    available() -> (bool, reason)
    check(target, unit, library, workspace) -> GateResult

How (details in the modules):
  spec.py     targets/<t>/parity/<unit>.py: inputs, shapes, reference, tolerances
  gate.py     inputs + references in this process (two fresh os.urandom seeds),
              the verdict check by check (compare.CHECK_ORDER)
  runner.py   the child process: time limit, crash and hang containment
  child.py    loads the library with ctypes and calls the unit on fenced cupy
              buffers (sentinel-filled outputs, guard bytes, const hashes,
              stream probe, second call in the same buffers, CUDA-event timing)
  compare.py  metrics (max abs, max rel, NMSE, exact with tie rule)
  device.py   cupy buffers, events, the stream hold; a host stand-in for CI

The gate is skipped (never "ok") where there is no GPU or no cupy, and where a
unit has no spec.  Runtime units have scenario specs (scenario.py: a sequence
of API calls); one is skipped while the other units it calls are placeholders.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from porter.gates.result import GateResult

__all__ = ["available", "check"]


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, what) when cupy is importable and sees a CUDA device; else (False, why)."""
    if os.environ.get("PORTER_PARITY", "").lower() in ("off", "0", "no"):
        return False, "parity disabled by PORTER_PARITY=off"
    if importlib.util.find_spec("cupy") is None:
        return False, "cupy is not installed (pip install 'porter[gpu]'); parity needs cupy and an NVIDIA GPU"
    probe = "import cupy; print(cupy.cuda.runtime.getDeviceCount())"
    try:
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"cannot probe for a CUDA device: {exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
        return False, f"no usable CUDA device ({last[:200]})"
    try:
        n = int(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False, "no usable CUDA device (device count unreadable)"
    if n < 1:
        return False, "no CUDA device visible"
    return True, f"{n} CUDA device(s) visible to cupy"


def candidate_sha(target, unit: str) -> str | None:
    path = target.unit_path(unit)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def check(target, unit: str, library: Path, workspace: Path | None = None, *, sanitize: bool | None = None,
          seeds: list[int] | None = None, timeout: float | None = None, mode: str = "cuda",
          candidate_sha256: str | None = None) -> GateResult:
    """Run the unit's parity spec against `library`; skipped (not ok) when it cannot run here."""
    from porter.gates.parity.gate import run_spec
    from porter.gates.parity.spec import SpecError, load_spec

    if mode == "cuda":
        ok, why = available()
        if not ok:
            return GateResult("parity", False, f"parity skipped: {why}", skipped=True)
    try:
        spec = load_spec(target, unit)
    except SpecError as exc:
        return GateResult("parity", False, f"parity skipped: spec error: {exc}", skipped=True)
    if spec is None:
        kind = "runtime unit" if unit in getattr(target, "runtime_units", []) else "no spec written yet"
        return GateResult("parity", False, f"parity skipped: no parity spec for {unit} ({kind})", skipped=True)
    from porter.gates.parity.scenario import blocked_by

    waiting = blocked_by(target, spec)
    if waiting:  # a runtime scenario calls units that are still placeholders: it cannot judge this one yet
        return GateResult("parity", False, f"parity skipped: the scenario for {unit} also calls unported "
                          f"{', '.join(waiting)}", skipped=True)
    if sanitize is None:
        sanitize = os.environ.get("PORTER_PARITY_SANITIZE", "") not in ("", "0", "off")
    from porter.calibrate import calibration_status

    return run_spec(target, spec, Path(library), workspace=workspace or target.workspace, seeds=seeds,
                    sanitize=sanitize, timeout=timeout, mode=mode,
                    candidate_sha256=candidate_sha256 or candidate_sha(target, unit),
                    calibration=calibration_status(workspace or target.workspace, target.name, spec))
