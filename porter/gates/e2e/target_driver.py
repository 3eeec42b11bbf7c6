"""What a target's e2e driver provides, and its loader.

A target's [e2e] driver names a Python file in its folder (e.g. "e2e/driver.py"), imported by path
(porter.target.code), never by a module name inside porter.  It must define:

  prefill_pair(target, scratch, library, model) -> (reference, [candidate, ...], setup)
      One prefill of the same prompt on the reference backend and, [e2e] runs times, on the engine
      linked with `library` (the workspace's backend), each a porter.gates.e2e.compare.PrefillOutputs.
      `setup` names what the calibrated rule holds for (model, prompt, stages, engine source hashes):
      a rule calibrated for another setup skips the gate.  Raise compare.ReferenceFailure when the
      reference cannot run (the gate is skipped) and PorterError when the candidate cannot build or
      run (the gate fails: a crash is a verdict).  Keep each engine run in one function, so that it
      can be wrapped (sandboxed) as a whole.
  calibrate(target, scratch, *, mode, model, library, log) -> porter.gates.e2e.calibration.Calibration
      Every backend of the target's e2e/variants.toml through the gate's prefill.

and may define COMMANDS = {name: (help, fn(target, args, scratch) -> exit code)}: more subcommands of
`python3 -m porter.commands.e2e` (args: its parsed options).
"""

from __future__ import annotations

from porter.errors import PorterError
from porter.target.code import load_file

REQUIRED = ("prefill_pair", "calibrate")


def load_driver(target):
    """The module of the target's [e2e] driver, checked for the functions the gate calls."""
    spec = target.spec.e2e
    if spec is None:
        raise PorterError(f"target {target.name} declares no [e2e]")
    path = target.dir / spec.driver
    try:
        mod = load_file(path)
    except PorterError:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken driver is the target's fault, one clear error
        raise PorterError(f"e2e driver {path} does not import: {type(exc).__name__}: {exc}") from exc
    missing = [n for n in REQUIRED if not callable(getattr(mod, n, None))]
    if missing:
        raise PorterError(f"e2e driver {path} defines no {', '.join(missing)} (see porter.gates.e2e.target_driver)")
    return mod


def commands(driver) -> dict:
    """The driver's extra subcommands: {name: (help, fn)}."""
    return dict(getattr(driver, "COMMANDS", {}) or {})
