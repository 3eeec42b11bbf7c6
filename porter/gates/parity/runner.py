"""Runs the parity child in its own process group with a time limit.

A candidate may hang (an endless kernel, a deadlock), segfault in host code,
abort, or kill its CUDA context; none of that may take the harness down.  The
child runs as `python child.py PLAN_DIR` in a new session; on timeout the
whole process group is killed (SIGKILL) -- only the processes this module
started.  The outcome says what happened in one line, naming the case and the
step the child had reached (from its progress file).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CHILD = Path(__file__).resolve().parent / "child.py"

SANITIZER_EXIT = 86  # --error-exitcode given to compute-sanitizer
EXIT_MEANING = {2: "bad plan", 3: "CUDA error", 4: "library did not load", 5: "harness error in the child"}


@dataclass
class ChildOutcome:
    status: str  # "done" | "timeout" | "crash" | "fatal" | "sanitize" | "harness"
    returncode: int | None
    elapsed_s: float
    detail: str  # one line
    results: dict | None = None
    last_step: dict | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    argv: list[str] = field(default_factory=list)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def last_progress(plan_dir: Path) -> dict | None:
    try:
        lines = (plan_dir / "progress.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def describe_step(step: dict | None) -> str:
    if not step:
        return "before the child reported any step"
    parts = []
    if "case" in step:
        parts.append(f"case {step['case']}")
    if "pass_" in step:
        parts.append(f"call {int(step['pass_']) + 1}")
    what = step.get("step", "?")
    return f"at step '{what}'" + (f" ({', '.join(parts)})" if parts else "")


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def child_argv(plan_dir: Path, sanitize: bool = False, python: str | None = None) -> list[str]:
    argv = [python or sys.executable, str(CHILD), str(plan_dir)]
    if sanitize:
        tool = shutil.which("compute-sanitizer") or "compute-sanitizer"
        argv = [tool, "--tool", "memcheck", "--error-exitcode", str(SANITIZER_EXIT), "--print-limit", "20",
                "--target-processes", "all"] + argv
    return argv


def run_child(plan_dir: Path, timeout: float, *, argv: list[str] | None = None,
              env: dict | None = None) -> ChildOutcome:
    """Run the child on PLAN_DIR; never raises for anything the candidate does."""
    plan_dir = Path(plan_dir)
    argv = argv or child_argv(plan_dir)
    out_path, err_path = plan_dir / "child.stdout", plan_dir / "child.stderr"
    clear_outputs(plan_dir)
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env, cwd=plan_dir)
        except OSError as exc:
            return ChildOutcome("harness", None, 0.0, f"cannot start the parity child: {exc.strerror}", argv=argv)
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group: only what we started
            except ProcessLookupError:
                pass
            rc = proc.wait()
    return classify(plan_dir, rc, time.monotonic() - t0, timed_out, timeout, argv)


def clear_outputs(plan_dir: Path) -> None:
    for name in ("results.json", "progress.jsonl"):
        (plan_dir / name).unlink(missing_ok=True)


def classify(plan_dir: Path, rc: int | None, elapsed: float, timed_out: bool, timeout: float,
             argv: list[str]) -> ChildOutcome:
    """What happened to one run of the child code, from its exit status and its files (fresh or warm)."""
    out_path, err_path = plan_dir / "child.stdout", plan_dir / "child.stderr"
    step = last_progress(plan_dir)
    results = None
    try:
        results = json.loads((plan_dir / "results.json").read_text())
    except (OSError, ValueError):
        results = None
    o = ChildOutcome("done", rc, elapsed, "", results, step, _tail(out_path), _tail(err_path), argv)
    if timed_out:
        o.status = "timeout"
        o.detail = f"no result after {timeout:.0f} s: killed {describe_step(step)}"
    elif rc is None:
        o.status = "harness"
        o.detail = "the parity worker gave no exit status"
    elif rc == SANITIZER_EXIT and argv[0].endswith("compute-sanitizer"):
        o.status = "sanitize"
        errs = [ln.strip(" =") for ln in (o.stdout_tail + o.stderr_tail).splitlines() if "ERROR SUMMARY" in ln or "Invalid" in ln]
        o.detail = "; ".join(errs[:3]) or "compute-sanitizer reported errors"
    elif rc < 0:
        o.status = "crash"
        o.detail = f"the child died of {signal_name(-rc)} {describe_step(step)}"
    elif rc == 0 and results is not None and results.get("complete"):
        o.status = "done"
        o.detail = f"completed in {elapsed:.2f} s"
    elif results is not None and results.get("fatal"):
        o.status = "fatal"
        f = results["fatal"]
        o.detail = f"{f.get('check')}: {f.get('detail')} {describe_step(f.get('at') or step)}"
    elif rc in (5, 2):
        o.status = "harness"
        o.detail = f"parity child failed ({EXIT_MEANING.get(rc)}): {o.stderr_tail.strip().splitlines()[-1:] or ''}"
    else:
        o.status = "crash"
        o.detail = f"the child exited with status {rc} without results {describe_step(step)}"
    return o
