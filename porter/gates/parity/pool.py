"""Where parity plans run: the executor interface and its two implementations.

    executor(mode).run(plan_dir, timeout) -> runner.ChildOutcome

SpawnExecutor starts a fresh child per plan (runner.run_child: the slow, simple
path; compute-sanitizer runs always use it).  WarmPool keeps one warm worker
(worker.py) per visible GPU and hands each plan to a free one; a worker that
crashed, hung, hit a CUDA error or reached its job limit is replaced at once,
so its successor starts while the next candidate is still being built.  Both
give the same ChildOutcome for the same behaviour of a candidate; only the
time to a verdict differs.  Callers may run plans from several threads (porter
run --jobs N): WarmPool blocks until a worker is free.

An engine that spreads plans over several hosts would be one more class with
this run() method; the plan folder is the whole job.

$PORTER_PARITY_EXECUTOR: "warm" (default) or "spawn".  $PORTER_PARITY_WORKERS:
how many warm workers (default: one per visible CUDA device, one in host mode).
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

from porter.gates.parity import runner

WORKER = Path(__file__).resolve().parent / "worker.py"
READY_TIMEOUT_S = 180.0


class Executor(Protocol):
    def run(self, plan_dir: Path, timeout: float) -> runner.ChildOutcome: ...


class SpawnExecutor:
    """A fresh process per plan."""

    def run(self, plan_dir: Path, timeout: float) -> runner.ChildOutcome:
        return runner.run_child(Path(plan_dir), timeout)


class WarmWorker:
    """One worker process (parent side).  Started on construction; ready() waits for its hello."""

    def __init__(self, mode: str, device_index: int | None, python: str | None = None):
        env = dict(os.environ)
        if device_index is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(device_index)
        self.mode, self.device_index = mode, device_index
        self.argv = [python or sys.executable, str(WORKER), mode]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True, env=env)
        self.hello: dict | None = None
        self.jobs = 0

    def _read_line(self, timeout: float) -> dict | None:
        """One reply line, or None on EOF/timeout (then self.timed_out says which)."""
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            self.timed_out = not sel.select(timeout)
        finally:
            sel.close()
        if self.timed_out:
            return None
        line = self.proc.stdout.readline()
        if not line:
            return None
        try:
            return json.loads(line)
        except ValueError:
            return None

    def ready(self) -> bool:
        if self.hello is None:
            self.hello = self._read_line(READY_TIMEOUT_S) or {"ready": False}
        return bool(self.hello.get("ready"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL this worker's own process group (only what this object started)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def run(self, plan_dir: Path, timeout: float) -> tuple[runner.ChildOutcome, bool]:
        """(outcome, keep): keep is False when this worker must not take another job."""
        plan_dir = Path(plan_dir)
        runner.clear_outputs(plan_dir)
        argv = self.argv + [str(plan_dir)]
        t0 = time.monotonic()
        try:
            self.proc.stdin.write((json.dumps({"plan_dir": str(plan_dir), "deadline_s": timeout}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            return runner.ChildOutcome("harness", None, 0.0, "the warm parity worker was gone", argv=argv), False
        reply = self._read_line(timeout)
        elapsed = time.monotonic() - t0
        self.jobs += 1
        if reply is None:
            timed_out = self.timed_out
            if timed_out:
                self.kill()
            try:
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
                rc = self.proc.returncode
            return runner.classify(plan_dir, rc, elapsed, timed_out, timeout, argv), False
        o = runner.classify(plan_dir, int(reply["rc"]), elapsed, False, timeout, argv)
        keep = not reply.get("retire")
        if not keep:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        return o, keep


class WarmPool:
    """One warm worker per slot (per GPU); run() blocks until a worker is free."""

    def __init__(self, mode: str, n_workers: int, device_indices: list[int | None] | None = None):
        self.mode = mode
        self.slots = device_indices or [None] * n_workers
        self.idle: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._all: set[WarmWorker] = set()
        self.respawns = 0
        for idx in self.slots:
            self.idle.put(self._spawn(idx))

    def _spawn(self, idx) -> WarmWorker:
        w = WarmWorker(self.mode, idx)
        with self._lock:
            self._all.add(w)
        return w

    def run(self, plan_dir: Path, timeout: float) -> runner.ChildOutcome:
        w: WarmWorker = self.idle.get()
        replaced = False
        try:
            if not w.alive() or not w.ready():
                err = (w.hello or {}).get("error") or "it did not start"
                w.kill()
                w, replaced = self._spawn(w.device_index), True
                if not w.ready():
                    # no warm worker here: one fresh child keeps the gate honest, and says why in its detail
                    o = runner.run_child(Path(plan_dir), timeout)
                    o.detail += f" (fresh child: warm worker unavailable: {err})"
                    return o
            o, keep = w.run(plan_dir, timeout)
            if not keep:
                with self._lock:
                    self._all.discard(w)
                w, replaced = self._spawn(w.device_index), True  # starts now, overlapping the next build
            return o
        finally:
            if replaced:
                self.respawns += 1
            self.idle.put(w)

    def close(self) -> None:
        with self._lock:
            workers, self._all = list(self._all), set()
        for w in workers:
            try:
                w.proc.stdin.close()
            except OSError:
                pass
        for w in workers:
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                w.kill()


_executors: dict[str, Executor] = {}
_exec_lock = threading.Lock()


def visible_gpus() -> list[int]:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [int(x) for x in vis.split(",") if x.strip().isdigit()]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split()
        return [int(x) for x in out if x.isdigit()] or [0]
    except (OSError, subprocess.SubprocessError):
        return [0]


def executor(mode: str) -> Executor:
    """The process-wide executor for `mode` (made on first use, closed at exit)."""
    kind = os.environ.get("PORTER_PARITY_EXECUTOR", "warm").lower()
    if kind == "spawn":
        return SpawnExecutor()
    with _exec_lock:
        ex = _executors.get(mode)
        if ex is None:
            n = os.environ.get("PORTER_PARITY_WORKERS")
            if mode == "cuda":
                gpus = visible_gpus() or [None]
                slots = gpus[: int(n)] if n else gpus
                # CUDA_VISIBLE_DEVICES renumbers: a worker gets the physical index of its GPU
                ex = WarmPool(mode, len(slots), slots)
            else:
                ex = WarmPool(mode, int(n or 1))
            _executors[mode] = ex
            atexit.register(ex.close)
        return ex


def shutdown() -> None:
    with _exec_lock:
        for ex in _executors.values():
            ex.close()
        _executors.clear()
