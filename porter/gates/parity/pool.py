"""Where parity plans run: the executor interface and its two implementations.

    Executor.run(plan_dir, timeout) -> runner.ChildOutcome

Both run every plan in a sandboxed process (porter.host.sandbox) that serves that
one plan only.  SpawnExecutor starts the child when the plan arrives
(runner.run_child: the slow, simple path; compute-sanitizer runs always use
it).  WarmPool keeps one pre-started worker (worker.py) per visible GPU that
has already paid for the interpreter, imports and CUDA context, hands it the
plan, and starts the next spare at once, so it warms up while the next
candidate is still being built.  Both give the same ChildOutcome for the same
behaviour of a candidate; only the time to a verdict differs.  Callers may run
plans from several threads (porter run --jobs N): WarmPool blocks until a GPU
is free.

A spare is started before its plan exists, so what it can see is fixed then:
a writable slot folder beside the previous plan (the plan folder is moved in
for the job and back after it) and, read-only, the files the previous plan
named outside its folder (a fixture GGUF, weight maps).  A plan that needs
other files, or lies on another file system, gets a worker started for it.

Which of them (or cluster.RayExecutor) runs a mode's plans is executors.py's choice: the Ray
executor's workers are WarmPools, so this module names no other executor.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from porter.gates.parity import runner

WORKER = Path(__file__).resolve().parent / "worker.py"
READY_TIMEOUT_S = 180.0

# bwrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that started it ends.  A
# spare outlives the plan (and the --jobs thread) that started it, so spares are started from this one
# thread, which lives as long as porter does: killing porter still kills every worker.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="porter-spare-spawner")


class Executor(Protocol):
    def run(self, plan_dir: Path, timeout: float) -> runner.ChildOutcome: ...


class SpawnExecutor:
    """A fresh process per plan."""

    def run(self, plan_dir: Path, timeout: float) -> runner.ChildOutcome:
        return runner.run_child(Path(plan_dir), timeout)


class SanitizingExecutor:
    """A fresh process per plan, under compute-sanitizer memcheck (parity's --sanitize rerun)."""

    def run(self, plan_dir: Path, timeout: float) -> runner.ChildOutcome:
        return runner.run_child(Path(plan_dir), timeout, argv=runner.child_argv(Path(plan_dir), sanitize=True))


class OnSlot:
    """A fresh child per plan (a perf re-time, a sanitizer rerun, a scenario), holding one of `pool`'s GPU
    slots while it runs.  Started beside the warm workers with nothing held, a re-time shared the GPU with
    another unit's timed calls under --jobs N: the slowdown it was to confirm, and that unit's, were the
    other's load."""

    def __init__(self, pool: "WarmPool", sanitize: bool = False):
        self.pool, self.sanitize = pool, sanitize

    def run(self, plan_dir: Path, timeout: float) -> runner.ChildOutcome:
        return self.pool.run_fresh(Path(plan_dir), timeout, sanitize=self.sanitize)


class Standby:
    """One pre-started sandboxed worker (parent side): started on construction, runs one plan."""

    def __init__(self, mode: str, device_index: int | None, base: Path, ro: list[str], python: str | None = None):
        self.mode, self.device_index, self.ro = mode, device_index, sorted(ro)
        self.base = Path(base)
        self.slot = Path(tempfile.mkdtemp(prefix=".slot-", dir=self.base))
        self.argv = [python or sys.executable, str(WORKER), mode]
        env = {"CUDA_VISIBLE_DEVICES": str(device_index)} if device_index is not None else {}
        # its checker warms up beside it (an op plan's verdict data is the checker's); it sees the slot,
        # into which the plan is moved, and is given the job before the worker is
        self.checker = runner.CheckerProc(mode, self.base, [str(self.slot)], env, python) \
            if mode in ("cuda", "host") else None
        if self.checker is not None:
            env = {**env, runner.linkmod.ENV_FD: str(self.checker.runner_fd)}
        # the plan folder's own path is linked to the slot inside: its parent must be the sandbox's to write
        self.wrapped = runner.sandboxed(self.argv, self.slot, mode, ro=self.ro, env=env, scratch=[str(self.base)])
        if self.checker is not None:
            _spawner.submit(self.checker.start).result()
        self.started = time.monotonic()
        with open(self.slot / "worker.stderr", "wb") as err:
            self.proc = _spawner.submit(subprocess.Popen, self.wrapped.argv, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=err, close_fds=True, start_new_session=True,
                                        env=self.wrapped.env,
                                        pass_fds=(self.checker.runner_fd,) if self.checker else ()).result()
        if self.checker is not None:
            self.checker.runner_started()
        self.hello: dict | None = None

    def ready(self) -> bool:
        if self.hello is None:
            self.hello = self._hello(READY_TIMEOUT_S) or {"ready": False}
            if self.hello.get("ready") and self.checker is not None \
                    and not self.checker.ready(time.monotonic() + READY_TIMEOUT_S):
                self.hello = {"ready": False, "error": "its checker did not start: "
                              + str((self.checker.hello or {}).get("error") or "no ready line")}
        return bool(self.hello.get("ready"))

    def _hello(self, timeout: float) -> dict | None:
        return runner.json_line(self.proc.stdout, time.monotonic() + timeout)

    def fits(self, plan_dir: Path) -> bool:
        """This spare can run the plan: it sees every outside file the plan names, and its slot is
        on the plan's file system (the plan folder is moved, not copied)."""
        try:
            same_fs = os.stat(self.slot).st_dev == os.stat(plan_dir).st_dev
        except OSError:
            return False
        # and the plan folder lies in the folder this spare made writable inside (its path is linked there)
        return same_fs and Path(plan_dir).parent == self.base and set(outside_files(plan_dir)) <= set(self.ro)

    def kill(self) -> None:
        """SIGKILL this worker's own process group (only what this object started): bwrap and with it
        the sandbox's pid namespace."""
        runner.kill_group(self.proc)

    def discard(self) -> None:
        self.kill()
        if self.checker is not None:
            self.checker.discard()
        shutil.rmtree(self.slot, ignore_errors=True)

    def run(self, plan_dir: Path, timeout: float) -> runner.ChildOutcome:
        plan_dir = Path(plan_dir)
        runner.clear_outputs(plan_dir)
        library, expected = _library(plan_dir), runner.expected_results(plan_dir)
        # unsandboxed (--unsafe-no-sandbox) the worker sees the plan folder where it is
        staged = self.slot / "job" if self.wrapped.label != "none" else plan_dir
        # the worker sees no file of the user's: the library comes in as a copy in the plan folder
        private = plan_dir / ("candidate" + (Path(library).suffix or ".so") if library else "candidate.so")
        if library:
            shutil.copyfile(library, private)
        moved = os.lstat(plan_dir).st_ino
        if staged != plan_dir:
            os.rename(plan_dir, staged)
            runner.sandbox.hand_over(staged)  # the worker writes there as the sandbox uid (porter as root)
        checked = self.checker is not None and runner.needs_checker(staged)
        if checked:
            why = self.checker.start_job(staged, time.monotonic() + READY_TIMEOUT_S)
            if why:  # before the worker has the job: no candidate code ran, the plan runs fresh instead
                if staged != plan_dir:
                    os.rename(staged, plan_dir)
                self.discard()
                o = runner.run_child(plan_dir, timeout)
                o.detail += f" (fresh child: the warm checker failed: {why})"
                return o
        t0 = time.monotonic()
        timed_out = False
        try:
            job = {"plan_dir": str(plan_dir), "staged": str(staged), "library": str(private)}
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.close()
        except OSError:
            pass  # it died: its exit status says how
        rc = self._finished(t0 + timeout)
        timed_out = rc is None
        if timed_out:
            self.kill()
            rc = self.proc.returncode
        elapsed = time.monotonic() - t0
        if checked:
            self.checker.finish(time.monotonic() + runner.CHECKER_FINISH_S)
        if staged != plan_dir:
            self._unstage(staged, plan_dir, moved)
        shutil.rmtree(self.slot, ignore_errors=True)
        runner.scrub(plan_dir)
        if checked:
            self.checker.adopt(plan_dir)
        elif self.checker is not None:
            self.checker.discard()
        o = runner.classify(plan_dir, runner.signalled(rc, self.wrapped), elapsed, timed_out, timeout,
                            self.argv + [str(plan_dir)], expected, checked=checked)
        o.sandbox = self.wrapped.label
        return o


    def _finished(self, deadline: float) -> int | None:
        """The plan's exit status, or None at the deadline.  The worker says {"done": rc} on its reply
        channel once results.json is written; then the sandbox is killed rather than waited for, because
        a CUDA process's exit (context teardown) costs 0.1-0.4 s of every verdict (H100).  Whatever else
        arrives there (the candidate can write to it) only means: wait for the real exit status."""
        said = _done_line(self.proc.stdout, deadline)
        if said is not None and self.wrapped.label != "none":
            ns = _pid_namespace_below(self.proc.pid)
            if ns is not None:
                self.kill()  # the outer bwrap: the namespace's init and every task in it get SIGKILL
                if _namespace_stopped(ns, deadline=time.monotonic() + 10):
                    return said
        try:
            return self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None

    @staticmethod
    def _unstage(staged: Path, plan_dir: Path, moved: int) -> None:
        """The plan folder back where the gate expects it, if it is still the folder moved in: the slot
        was the candidate's to write, and a link put in its place would point the parent anywhere."""
        try:
            st = os.lstat(staged)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_ino == moved:
            os.rename(staged, plan_dir)
        else:
            plan_dir.mkdir()  # empty: no results, so the outcome is a crash without results


def _done_line(stream, deadline: float) -> int | None:
    """The rc of a {"done": rc} line (the worker's, or anything the candidate wrote there first)."""
    rc = (runner.json_line(stream, deadline) or {}).get("done")
    return rc if type(rc) is int else None


def _pid_namespace_below(pid: int) -> str | None:
    """The pid namespace of the deepest first descendant of PID (the command, or bwrap's init once it is
    gone), if it is not ours: as root the sandbox nests two bwraps (sandbox.py), and the candidate's
    tasks are in the inner one's namespace.  None when /proc cannot say (no CONFIG_PROC_CHILDREN): the
    caller then waits for the exit as before."""
    ns = None
    try:
        for _depth in range(8):
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if not kids:
                break
            pid = int(kids[0])
            ns = os.readlink(f"/proc/{pid}/ns/pid")
    except (OSError, ValueError):
        pass
    return None if ns is None or ns == os.readlink("/proc/self/ns/pid") else ns


def _namespace_stopped(ns: str, deadline: float) -> bool:
    """Every task in pid namespace NS is exiting, a zombie or gone: none runs user code again, so the
    plan folder can be moved back and scrubbed without a writer racing the parent."""
    while time.monotonic() < deadline:
        if all(_task_stopped(t) for t in _namespace_tasks(ns)):
            return True
        time.sleep(0.002)
    return False


def _namespace_tasks(ns: str) -> list[str]:
    tasks = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                tasks += [f"/proc/{pid}/task/{t}" for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue  # gone meanwhile
    return tasks


PF_EXITING = 0x4


def _task_stopped(task: str) -> bool:
    try:
        stat_line = Path(task, "stat").read_text()
    except OSError:
        return True
    fields = stat_line[stat_line.rindex(")") + 2:].split()  # the name in brackets may hold spaces
    return fields[0] in ("Z", "X", "x") or bool(int(fields[6]) & PF_EXITING)


def _library(plan_dir: Path) -> str | None:
    try:
        return json.loads((plan_dir / "plan.json").read_text()).get("library")
    except (OSError, ValueError):
        return None


def outside_files(plan_dir: Path) -> list[str]:
    """What a worker must see read-only for this plan besides its own folder (the library comes as a copy)."""
    return sorted(set(runner.external_files(plan_dir)) - {_library(plan_dir)})


class DeviceGate:
    """Who may use one GPU at once.  A warm worker's plan holds it *shared*: where a pool has several slots on
    one GPU (PORTER_PARITY_WORKERS_PER_GPU), their plans run side by side and each timing they record is only
    a first reading (perf believes a slow one only after a re-time; contention never makes a call faster).
    A fresh child (a perf re-time, the known-good's baseline run under shared slots, a sanitizer rerun) holds
    it *exclusive*: it waits for the plans running there, and new ones wait for it, so the timing that
    decides is taken alone on the GPU.  A waiting exclusive holder goes before new shared ones, or a busy
    pool would starve the re-times."""

    def __init__(self):
        self._cv = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextlib.contextmanager
    def shared(self):
        with self._cv:
            while self._exclusive or self._waiting:
                self._cv.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cv:
                self._shared -= 1
                self._cv.notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        with self._cv:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    self._cv.wait()
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cv:
                self._exclusive = False
                self._cv.notify_all()


class WarmPool:
    """One pre-started worker per slot; run() blocks until a slot is free.  A slot is a GPU, or one of
    several workers sharing a GPU (DeviceGate says when they may)."""

    def __init__(self, mode: str, n_workers: int, device_indices: list[int | None] | None = None):
        self.mode = mode
        self.slots = device_indices or [None] * n_workers
        self.gates = {dev: DeviceGate() for dev in self.slots}
        self.free: queue.Queue = queue.Queue()
        for i in range(len(self.slots)):
            self.free.put(i)
        self.spares: dict[int, Standby | None] = {i: None for i in range(len(self.slots))}
        self._lock = threading.Lock()
        self.started = 0  # workers started (one per plan, plus spares that did not fit a plan)

    def _start(self, i: int, base: Path, ro: list[str]) -> Standby:
        with self._lock:
            self.started += 1
        return Standby(self.mode, self.slots[i], base, ro)

    def run(self, plan_dir: Path, timeout: float) -> runner.ChildOutcome:
        plan_dir = Path(plan_dir)
        t0 = time.monotonic()
        i = self.free.get()
        try:
            with self.gates[self.slots[i]].shared():
                waited = time.monotonic() - t0
                o = self._run_on(i, plan_dir, timeout)
                o.waited_s = waited
                return o
        finally:
            self.free.put(i)

    def _run_on(self, i: int, plan_dir: Path, timeout: float) -> runner.ChildOutcome:
        w = self.spares[i]
        self.spares[i] = None
        # a spare is killed with the thread that started it (bwrap --die-with-parent: the parent-death
        # signal follows the starting thread), e.g. a calibration's unit threads once they end
        if w is None or not w.fits(plan_dir) or w.proc.poll() is not None:
            if w is not None:
                w.discard()
            w = self._start(i, plan_dir.parent, outside_files(plan_dir))
        if not w.ready():
            err = (w.hello or {}).get("error") or "it did not start"
            w.discard()
            # no pre-started worker here: one fresh child keeps the gate honest, and says why in its detail
            o = runner.run_child(plan_dir, timeout)
            o.detail += f" (fresh child: warm worker unavailable: {err})"
            return o
        ro = outside_files(plan_dir)
        o = w.run(plan_dir, timeout)
        # the next plan's worker warms up now, overlapping the next build (not this verdict's timings)
        self.spares[i] = self._start(i, plan_dir.parent, ro)
        return o

    def run_fresh(self, plan_dir: Path, timeout: float, sanitize: bool = False) -> runner.ChildOutcome:
        """A child started for this plan alone, on a slot of this pool, holding its GPU exclusive (DeviceGate):
        it never shares the GPU with another plan's timed calls, nor they with it, however many slots the GPU has."""
        t0 = time.monotonic()
        i = self.free.get()
        try:
            dev = self.slots[i]
            with self.gates[dev].exclusive():
                waited = time.monotonic() - t0
                o = runner.run_child(Path(plan_dir), timeout,
                                     argv=runner.child_argv(Path(plan_dir), sanitize=True) if sanitize else None,
                                     env={"CUDA_VISIBLE_DEVICES": str(dev)} if dev is not None else None)
                o.waited_s = waited
                return o
        finally:
            self.free.put(i)

    def close(self) -> None:
        with self._lock:
            spares = [w for w in self.spares.values() if w is not None]
            self.spares = {i: None for i in self.spares}
        for w in spares:
            w.discard()
