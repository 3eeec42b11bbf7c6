"""A warm parity worker: one process that keeps Python, numpy, cupy and a CUDA
context open and runs one parity plan after another.

    python worker.py MODE        (started by pool.WarmWorker; MODE: cuda | host)

Starting the fresh child costs most of a parity verdict (interpreter, imports,
CUDA context); this process pays that once.  What it must not give up is the
fresh child's isolation, so:
  - each job loads a private copy of the candidate library (a new dlopen
    handle: no static state of an earlier job, even of the same library);
  - a job that does not end cleanly (non-zero exit code, a CUDA error left
    after a call, a failed health check of the device afterwards) makes the
    worker exit after its reply: the next job runs in a new process with a new
    CUDA context.  A segfault or abort kills the worker itself, and a hang is
    killed by the parent (its own process group);
  - after MAX_JOBS jobs the worker retires anyway (loaded libraries and their
    device allocations are never unloaded).

Protocol: one JSON line per job on stdin ({"plan_dir": ..., "deadline_s": ...}),
one JSON line per reply on the original stdout ({"rc": ..., "retire": ...}); the
job's own stdout/stderr go to PLAN_DIR/child.stdout and child.stderr as with
the fresh child.  EOF on stdin, or the parent dying, ends the worker.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import child as childmod  # noqa: E402  (sibling module, loaded by path on purpose)
import device as devmod  # noqa: E402

MAX_JOBS = int(os.environ.get("PORTER_WORKER_MAX_JOBS", "50"))
MIN_FREE_MEMORY = 0.5  # retire when less than this share of device memory is free (libraries are never unloaded)


def _watch_parent(parent: int, state: dict) -> None:
    """Exit when the parent is gone, or when a job overruns its deadline by far (the parent kills
    a hang itself; this covers a parent that was SIGKILLed while the job hung)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(70)
        dl = state.get("deadline")
        if dl is not None and time.monotonic() > dl:
            os._exit(71)


def _redirect(plan_dir: Path) -> tuple[int, int]:
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, name in ((1, "child.stdout"), (2, "child.stderr")):
        f = os.open(plan_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    return saved


def _restore(saved: tuple[int, int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, old in zip((1, 2), saved):
        os.dup2(old, fd)
        os.close(old)


def _left_cuda_error(plan_dir: Path) -> bool:
    try:
        res = json.loads((plan_dir / "results.json").read_text())
    except (OSError, ValueError):
        return True
    return any(p.get("launch_error") for c in res.get("cases", []) for p in c.get("passes", []))


def _healthy(dev) -> bool:
    """The context still works: synchronize, and a small allocation round-trips."""
    try:
        dev.synchronize()
        ptr = dev.malloc(64)
        dev.write(ptr, b"\x5a" * 64)
        ok = dev.read(ptr, 64) == b"\x5a" * 64
        dev.free(ptr)
        return ok
    except Exception:  # noqa: BLE001 - any failure here means: retire
        return False


def _low_memory(dev) -> bool:
    try:
        return dev.free_fraction() < MIN_FREE_MEMORY
    except Exception:  # noqa: BLE001
        return True


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else "cuda"
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing but replies on the reply channel
    state: dict = {"deadline": None}
    threading.Thread(target=_watch_parent, args=(os.getppid(), state), daemon=True).start()
    try:
        dev = devmod.make_device(mode) if mode != "call" else None
        facts = dev.facts() if dev is not None else {}
    except Exception as exc:  # noqa: BLE001
        reply.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"[:300]}) + "\n")
        return 3
    reply.write(json.dumps({"ready": True, "pid": os.getpid(), "device": facts.get("name")}) + "\n")
    for n, line in enumerate(sys.stdin):
        job = json.loads(line)
        plan_dir = Path(job["plan_dir"])
        plan = json.loads((plan_dir / "plan.json").read_text())
        private = plan_dir / f"candidate-{os.getpid()}-{n}{Path(plan['library']).suffix or '.so'}"
        shutil.copyfile(plan["library"], private)
        state["deadline"] = time.monotonic() + float(job.get("deadline_s", 600)) + 30
        t0 = time.monotonic()
        saved = _redirect(plan_dir)
        environ = dict(os.environ)
        try:
            rc = childmod.run_plan(plan_dir, dev=dev, library=str(private))
        finally:
            _restore(saved)
            os.environ.clear()
            os.environ.update(environ)  # a plan's env (known-good variant knobs) is its own
        state["deadline"] = None
        retire = rc != 0 or n + 1 >= MAX_JOBS
        why = "exit status" if rc != 0 else "job limit" if retire else None
        if not retire and dev is not None and _left_cuda_error(plan_dir):
            retire, why = True, "a CUDA error was left after a call"
        if not retire and dev is not None and not _healthy(dev):
            retire, why = True, "device health check failed"
        if not retire and dev is not None and _low_memory(dev):
            retire, why = True, "device memory held by earlier candidates"
        reply.write(json.dumps({"rc": rc, "retire": retire, "why": why, "elapsed_s": time.monotonic() - t0}) + "\n")
        if retire:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
