"""Which executor runs a mode's parity plans, made once per process.

    executor(mode).run(plan_dir, timeout) -> runner.ChildOutcome

It sits above both implementations: pool.py (SpawnExecutor, WarmPool) and cluster.py (RayExecutor,
whose workers are WarmPools), so neither of them imports the other's chooser.

$PORTER_PARITY_EXECUTOR: "warm" (default), "spawn", or "ray" (cluster.RayExecutor:
one such warm worker per GPU of a Ray cluster, $PORTER_RAY_ADDRESS).  $PORTER_PARITY_WORKERS:
how many workers (default: one per visible CUDA device, one in host mode; with Ray, one per GPU
of the cluster).  $PORTER_PARITY_WORKERS_PER_GPU (`porter calibrate --per-gpu K`): K warm workers
share each GPU, for the runs whose timing is not what they are for (mutation testing, the seed
sweep): their plans run side by side and every timing that decides a verdict is taken by a fresh
child holding the GPU alone (pool.DeviceGate).  Default 1: one plan per GPU at a time.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import threading

from porter.errors import PorterError
from porter.host import arch as gpu_arch
from porter.gates.parity.cluster import RayExecutor
from porter.gates.parity.pool import Executor, OnSlot, SanitizingExecutor, SpawnExecutor, WarmPool

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


PER_GPU_ENV = "PORTER_PARITY_WORKERS_PER_GPU"


def workers_per_gpu() -> int:
    """How many warm workers share one GPU ($PORTER_PARITY_WORKERS_PER_GPU, default 1)."""
    raw = os.environ.get(PER_GPU_ENV, "1").strip() or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise PorterError(f"{PER_GPU_ENV} must be a whole number of at least 1, not {raw!r}")
    return int(raw)


def executor(mode: str) -> Executor:
    """The process-wide executor for `mode` (made on first use, closed at exit)."""
    kind = os.environ.get("PORTER_PARITY_EXECUTOR", "warm").lower()
    if kind == "spawn":
        return SpawnExecutor()
    with _exec_lock:
        ex = _executors.get(mode)
        if ex is None:
            n = os.environ.get("PORTER_PARITY_WORKERS")
            if kind == "ray":
                ex = RayExecutor(mode, n_workers=int(n) if n else None)
            elif mode == "cuda":
                gpus = visible_gpus() or [None]
                slots = [g for g in (gpus[: int(n)] if n else gpus) for _ in range(workers_per_gpu())]
                # CUDA_VISIBLE_DEVICES renumbers: a worker gets the physical index of its GPU
                ex = WarmPool(mode, len(slots), slots)
            else:
                ex = WarmPool(mode, int(n or 1))
            _executors[mode] = ex
            atexit.register(ex.close)
        return ex


def fresh_executor(mode: str) -> Executor:
    """Where a re-time runs (the perf gate's, of a result too fast to believe): a child started for this
    plan alone, nothing of it made before the plan existed.  Under a Ray cluster the orchestrator may have
    no GPU: there the plan goes to the cluster, whose workers each serve one plan in their own process."""
    if os.environ.get("PORTER_PARITY_EXECUTOR", "warm").lower() == "ray":
        return executor(mode)
    return child_executor(mode)


def child_executor(mode: str) -> Executor:
    """A child started for each plan, on this machine: on a slot of the warm pool where there is one (the
    GPU is never shared with another plan's timed calls), else a plain spawn."""
    kind = os.environ.get("PORTER_PARITY_EXECUTOR", "warm").lower()
    ex = executor(mode) if kind not in ("ray", "spawn") else None
    return OnSlot(ex) if isinstance(ex, WarmPool) else SpawnExecutor()


def executor_arguments(p) -> None:
    """--executor and --ray-address, for every command that runs parity plans (run, calibrate,
    the trace, the parity bench)."""
    p.add_argument("--executor", choices=("local", "ray"), default=None,
                   help="where parity plans run: 'local' (this machine's GPUs, the default) or 'ray' "
                   "(one sandboxed worker per GPU of a Ray cluster; pip install 'porter[ray]')")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="the Ray cluster to use (e.g. ray://head:10001 or head:6379; implies --executor ray; "
                   "default: $RAY_ADDRESS, else a Ray started on this machine)")


def use_executor(args, mode: str = "cuda") -> int | None:
    """Apply --executor/--ray-address for this process (and the children it starts, as
    --unsafe-no-sandbox does); returns the number of parity workers when they are a cluster's
    (the default --jobs there), else None."""
    kind = getattr(args, "executor", None) or ("ray" if getattr(args, "ray_address", None) else None)
    if kind != "ray":
        return None
    os.environ["PORTER_PARITY_EXECUTOR"] = "ray"
    if getattr(args, "ray_address", None):
        os.environ["PORTER_RAY_ADDRESS"] = args.ray_address
    ex = executor(mode)
    # the library is built here and loaded on the cluster's GPUs: unless --arch named them, build for every
    # architecture the workers have (porter.host.arch reads $PORTER_ARCH), not for this machine's GPUs
    archs = ex.archs() if mode == "cuda" else []
    if archs and not os.environ.get("PORTER_ARCH"):
        os.environ["PORTER_ARCH"] = ",".join(archs)
    return ex.size


def shutdown() -> None:
    with _exec_lock:
        for ex in _executors.values():
            ex.close()
        _executors.clear()


def sanitizing(mode: str, arch: str | None = None) -> Executor:
    """Where --sanitize reruns a plan: beside the plans of `mode` (a Ray executor's worker hosts have
    the GPU; this machine may have none), on a GPU of `arch` where one is required."""
    ex = executor(mode)
    if hasattr(ex, "sanitizing"):
        return ex.sanitizing(arch)
    return OnSlot(ex, sanitize=True) if isinstance(ex, WarmPool) else SanitizingExecutor()


def served_archs(mode: str) -> tuple[str, ...]:
    """The GPU kinds parity plans of `mode` can run on: a Ray cluster's workers' (each worker names its
    own), else this machine's GPUs: the local pool serves no other kind, and the host stand-in none."""
    if os.environ.get("PORTER_PARITY_EXECUTOR", "warm").lower() == "ray":
        return tuple(executor(mode).archs())
    return gpu_arch.detected() if mode == "cuda" else ()


def on_arch(ex: Executor, arch: str) -> Executor:
    """`ex` with its plans placed on a worker whose GPU is `arch`: a Ray executor picks such a worker;
    a local one runs on this machine's GPU, which served_archs() said is that kind (the child's own
    report of its GPU is checked against `arch` by gates.archs.across)."""
    return ex.on_arch(arch) if isinstance(ex, RayExecutor) else ex
