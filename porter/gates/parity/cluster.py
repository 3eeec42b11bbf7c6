"""Parity plans on a Ray cluster: the pool's executor interface with one warm gate worker per GPU
of the cluster, wherever it is.

    PORTER_PARITY_EXECUTOR=ray [PORTER_RAY_ADDRESS=ADDR]   (the CLI's --executor ray --ray-address)

$PORTER_RAY_SHIP_CODE=0: the workers import the porter installed on their hosts instead of this
checkout's, sent with the job (Ray's runtime_env) by default.

Why Ray: a maintained scheduler that already knows GPUs as resources, places one actor per GPU
on whichever host has one free, moves objects between hosts, and says when a worker or a node
died; porter adds nothing of that kind itself.

What crosses the network, and which way:
  orchestrator -> worker  the plan folder (plan.json, inputs.npz: inputs drawn here from fresh
                          seeds), the built library and the files the plan names (a fixture GGUF,
                          weight maps), each file once per worker host (content-addressed)
  worker -> orchestrator  the child's raw files (results.json, outputs.npz, progress, the tails
                          of its stdout/stderr), its exit status and time, and the worker host's
                          own facts (name, GPU, driver), asked outside the sandbox
Never a key, a reference output or a verdict: the orchestrator judges the raw outputs against
references it kept, classifies the exit itself, and alone writes the ledger, git and signatures.

On the worker host each job runs exactly as locally: pool.WarmPool with one slot (the actor's
GPU, which Ray names in CUDA_VISIBLE_DEVICES), so the candidate runs in the same sandbox, in a
worker pre-started while the previous job ran.  A heavy plan (IN_PLACE_MIN_BYTES) given to a worker
on the orchestrator's own host is neither sent nor returned: that worker runs a fresh child in the
plan's own folder, once it has checked the folder's plan.json is the one the orchestrator hashed.
A worker or node lost mid-job (the actor died, its node died, or it did not answer within the run's
limit and a grace) is replaced and the job run again on another worker; the job's result is used
once, so nothing is recorded twice.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from porter.host import arch as gpu_arch
from porter.digest import sha256_file
from porter.errors import PorterError
from porter.gates.parity import runner

ADDRESS_ENV = "PORTER_RAY_ADDRESS"
# files of the child sent back, and their bounds (a candidate may write gigabytes into its folder)
RETURNED = {"results.json": runner.RESULTS_MAX_BYTES, "outputs.npz": 8 << 30, "progress.jsonl": 64 << 10,
            "child.stdout": 4000, "child.stderr": 4000,
            # the checker's record and the outputs it read: what an op plan's verdict is made of
            f"{runner.CHECKER_DIR}/checker.json": runner.RESULTS_MAX_BYTES, f"{runner.CHECKER_DIR}/outputs.npz": 8 << 30}
TAILS = {"progress.jsonl", "child.stdout", "child.stderr"}  # their last bytes, as runner reads them
TRIES = 3  # runs of one job on successive workers before it is given up as a harness fault
# beyond the run's own limit: shipping the files, and a worker's start when no spare fitted (its hello may
# take pool.READY_TIMEOUT_S before the fresh child's own limit begins)
GRACE_S = 180.0 + 120.0
NO_WORKER_S = 600.0  # no live worker for this long (all lost, none placed again): the job is given up
SHIPPED_KEEP = 64  # files kept in the object store: the fixture and weights stay, old libraries go
# a node's GPU architecture as a Ray custom resource ("arch:sm_121": its GPU count, in Ray's own
# "accelerator_type:H100" style), read by a worker whose GPU nvidia-smi cannot name: a node started
# with `ray start --resources '{"arch:sm_121": 4}'`, or the CI's fake GPUs
ARCH_RESOURCE = "arch:"
# a plan folder this large runs in place on a worker of the orchestrator's own host (a fresh child there)
# instead of being sent: about what a warm worker saves (a CUDA context, ~1 s) in object-store traffic
IN_PLACE_MIN_BYTES = 64 << 20


class WorkersLost(PorterError):
    """A job whose workers were all lost: a harness fault (the gate is skipped), never a verdict."""


def ray_available() -> tuple[bool, str]:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False, "ray is not installed (pip install 'porter[ray]')"
    return True, "ray"


def available() -> tuple[bool, str]:
    """parity.available() under --executor ray: the cluster has GPUs (each worker host's cupy is its
    own to have: a worker whose host cannot open its GPU takes no job, see GateWorker.hello)."""
    ok, why = ray_available()
    if not ok:
        return False, why
    try:
        connect()
        resource, n = cluster_slots("cuda")
    except Exception as exc:  # noqa: BLE001 - no cluster at the address: parity cannot run
        return False, f"no Ray cluster: {type(exc).__name__}: {exc}"[:300]
    return (True, f"{n} GPU(s) on the Ray cluster") if n else (False, "the Ray cluster has no GPU")


def connect(address: str | None = None):
    """ray, connected to the cluster at `address` ($PORTER_RAY_ADDRESS; none: a Ray of this machine).
    Workers import this checkout's porter: the package is sent with the job (runtime_env), so a
    host never runs another version of it (its dependencies, cupy and bubblewrap are the host's)."""
    ok, why = ray_available()
    if not ok:
        raise PorterError(f"--executor ray: {why}", exit_code=2)
    import ray

    if not ray.is_initialized():
        address = address or os.environ.get(ADDRESS_ENV) or None
        package = str(Path(__file__).resolve().parents[2])
        ray.init(address=address, log_to_driver=False, include_dashboard=False if address is None else None,
                 runtime_env={"py_modules": [package]} if os.environ.get("PORTER_RAY_SHIP_CODE", "1") != "0" else None)
    return ray


def cluster_slots(mode: str) -> tuple[str, int]:
    """(resource, count): one worker per GPU of the cluster; in host mode without GPUs, per CPU."""
    import ray

    res = ray.cluster_resources()
    gpus = int(res.get("GPU", 0))
    if mode == "cuda" or gpus:
        return "GPU", gpus
    return "CPU", int(res.get("CPU", 0))


class GateWorker:
    """The actor: one GPU's warm worker on its host.  Jobs arrive one at a time (Ray's default)."""

    def __init__(self, mode: str):
        from porter.gates.parity import pool

        self.mode = mode
        self.base = Path(tempfile.mkdtemp(prefix="porter-ray-worker-"))
        (self.base / "files").mkdir()
        (self.base / "jobs").mkdir()
        self.pool = pool.WarmPool(mode, 1)  # device None: the GPU Ray gave this process (CUDA_VISIBLE_DEVICES)
        self.where = None

    def hello(self) -> dict:
        from porter.host import toolchain

        import ray

        if self.where is None:
            gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
            # a host whose cupy cannot open its GPU takes no job: every verdict there would be the host's fault
            usable, why = toolchain.cuda_device_here() if self.mode == "cuda" else (True, "host stand-in")
            self.where = dict(toolchain.where_facts("ray", self.mode), node=ray.get_runtime_context().get_node_id(),
                              pid=os.getpid(), gpus=gpus,
                              arch=(_gpu_arch(gpus) if self.mode == "cuda" else None) or _advertised_arch(),
                              usable=usable, why=why)
        return self.where

    def _shared(self, sha: str, name: str, ref) -> str:
        """The file `sha` on this host, fetched from the object store the first time."""
        import ray

        dest = self.base / "files" / sha / name
        if not dest.is_file():
            data = ray.get(ref)  # bytes, or a read-only array over the object store's copy
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".part")
            with open(tmp, "wb") as f:
                f.write(memoryview(data))
            os.replace(tmp, dest)
        return str(dest)

    def run(self, job: dict) -> dict:
        if job.get("in_place"):
            return self._run_in_place(job)
        plan_dir = Path(tempfile.mkdtemp(prefix=job["name"] + "-", dir=self.base / "jobs"))
        try:
            for rel, data in job["files"].items():
                p = plan_dir / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
            moved = {orig: self._shared(sha, name, ref) for orig, (sha, name, ref) in job["shared"].items()}
            _rewrite_plan(plan_dir / "plan.json", job["orig_dir"], str(plan_dir), moved)
            env = {k: " ".join(_moved(x, job["orig_dir"], str(plan_dir), moved) for x in v.split())
                   if k == "LD_PRELOAD" else v for k, v in (job.get("env") or {}).items()}
            if job.get("sanitize"):  # compute-sanitizer around a fresh child, as locally
                o = runner.run_child(plan_dir, job["timeout"], env=env,
                                     argv=runner.child_argv(plan_dir, sanitize=True))
            elif env.get("LD_PRELOAD"):
                # a preloaded library is in the child from its first instruction: a fresh child, as locally
                o = runner.run_child(plan_dir, job["timeout"], env=env)
            else:
                o = self.pool.run(plan_dir, job["timeout"])
            return self._reply(o, files=_returned(plan_dir, env.get("PORTER_LAUNCH_TRACE")))
        finally:
            shutil.rmtree(plan_dir, ignore_errors=True)

    def _run_in_place(self, job: dict) -> dict:
        """A job of the orchestrator's own host: its plan folder as it is, and nothing sent either way.
        Only where the folder's plan.json is the one the orchestrator hashed (the same filesystem, the
        same plan); otherwise it asks for the files."""
        plan_dir = Path(job["orig_dir"])
        plan = plan_dir / "plan.json"
        if not plan.is_file() or plan.is_symlink() or sha256_file(plan) != job.get("plan_sha256"):
            return {"need_files": True}
        # a fresh child, where the plan is: the warm worker stages a plan by moving its folder into its
        # slot, and a worker lost mid-job would leave the orchestrator's folder moved away
        return self._reply(runner.run_child(plan_dir, job["timeout"]), in_place=True)

    def _reply(self, o: runner.ChildOutcome, **more) -> dict:
        """What goes back to the orchestrator of one run: the raw exit, never a verdict."""
        return {"rc": o.returncode, "elapsed_s": o.elapsed_s, "timed_out": o.status == "timeout", "argv": o.argv,
                "sandbox": o.sandbox, "where": self.hello(), "local_detail": o.detail, **more}

    def close(self) -> None:
        self.pool.close()
        shutil.rmtree(self.base, ignore_errors=True)


def _gpu_arch(visible: str | None) -> str | None:
    """"sm_121" for the GPU Ray gave this worker (nvidia-smi lists every GPU: ask for that one)."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if not exe or not visible:
        return None
    try:
        out = subprocess.run([exe, "-i", visible.split(",")[0], "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    major, _, minor = out.partition(".")
    return f"sm_{major}{minor}" if major.isdigit() and minor.isdigit() else None


def _advertised_arch() -> str | None:
    """The one architecture this worker's node advertises (ARCH_RESOURCE), or None (none, or several:
    then which GPU is this worker's cannot be told from the node)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    for n in ray.nodes():
        if n.get("NodeID") == node:
            kinds = [k[len(ARCH_RESOURCE):] for k in (n.get("Resources") or {}) if k.startswith(ARCH_RESOURCE)]
            return kinds[0] if len(kinds) == 1 else None
    return None


class FreeWorkers:
    """The idle workers.  A job takes the first idle one of the architecture it needs (any one when it
    needs none); one of another kind stays idle for the jobs that need it."""

    def __init__(self):
        self._cond = threading.Condition()
        self._idle: list = []

    def put(self, actor) -> None:
        with self._cond:
            self._idle.append(actor)
            self._cond.notify_all()

    def empty(self) -> bool:
        with self._cond:
            return not self._idle

    def get(self, fits=None, timeout: float | None = None):
        """An idle worker for which fits(worker) holds; queue.Empty after `timeout` seconds without one."""
        def first():
            return next((a for a in self._idle if fits is None or fits(a)), None)

        with self._cond:
            if timeout:
                self._cond.wait_for(lambda: first() is not None, timeout)
            found = first()
            if found is None:
                raise queue.Empty
            self._idle.remove(found)
            return found

    def get_nowait(self, fits=None):
        return self.get(fits, 0)


def _rewrite_plan(path: Path, orig_dir: str, local_dir: str, moved: dict[str, str]) -> None:
    """plan.json as written on the orchestrator, with its paths valid on this host: the plan
    folder's own and every shared file's (the harness rewrites it before any candidate runs)."""
    def fix(v):
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return _moved(v, orig_dir, local_dir, moved) if isinstance(v, str) else v

    path.write_text(json.dumps(fix(json.loads(path.read_text()))))


def _moved(v: str, orig_dir: str, local_dir: str, moved: dict[str, str]) -> str:
    """One path as it is on this host."""
    if v in moved:
        return moved[v]
    if v == orig_dir or v.startswith(orig_dir + "/"):
        return local_dir + v[len(orig_dir):]
    return v


def _returned(plan_dir: Path, trace: str | None = None) -> dict[str, bytes]:
    """The child's files to send back: regular files only (runner.scrub ran), each bounded."""
    out = {}
    for name, limit in RETURNED.items():
        p = plan_dir / name
        try:
            if not p.is_file() or p.is_symlink():
                continue
            size = p.stat().st_size
            if name in TAILS:
                with open(p, "rb") as f:
                    f.seek(max(0, size - limit))
                    out[name] = f.read(limit)
            elif size <= limit:
                out[name] = p.read_bytes()
        except OSError:
            continue
    if trace and "/" not in trace and (plan_dir / trace).is_file() and not (plan_dir / trace).is_symlink():
        out[trace] = (plan_dir / trace).read_bytes()[: 64 << 20]
    return out


def _folder_bytes(plan_dir: Path) -> int:
    return sum(p.stat().st_size for p in plan_dir.rglob("*") if p.is_file() and not p.is_symlink())


def _lost_errors() -> tuple:
    from ray import exceptions as e

    return tuple(getattr(e, n) for n in ("NodeDiedError", "WorkerCrashedError", "ObjectLostError",
                                         "OwnerDiedError", "ActorUnavailableError") if hasattr(e, n))


class RayExecutor:
    """pool.Executor over the cluster's GPUs: run() blocks until a worker is free, like WarmPool."""

    def __init__(self, mode: str, address: str | None = None, n_workers: int | None = None):
        ray = connect(address)
        self.ray = ray
        self.mode = mode
        resource, n = cluster_slots(mode)
        n = min(n, n_workers) if n_workers else n
        if n < 1:
            raise PorterError(f"--executor ray: the cluster has no {resource} for parity workers "
                              f"({ray.cluster_resources()})", exit_code=2)
        opts = {"num_gpus": 1, "num_cpus": 0} if resource == "GPU" else {"num_cpus": 1}
        self._actor_class = ray.remote(max_restarts=0, **opts)(GateWorker)
        self.free = FreeWorkers()
        self._lock = threading.Lock()
        self.workers: dict = {}  # actor -> its hello (host, node, pid), once it answered
        self.pending: set = set()  # actors asked for, not placed yet (a replacement waits for a free GPU)
        self.in_flight: dict = {}  # job name -> the hello of the worker running it
        self.lost: list[str] = []  # one line per lost worker (job, where, why)
        self.retried: list[str] = []  # jobs run again after a lost worker
        self.unusable: list[str] = []  # workers whose host could not open its GPU (never given a job)
        self._shipped: OrderedDict = OrderedDict()  # (path, size, mtime, inode) -> (sha, name, ObjectRef)
        self._closed = False
        self.in_place: list[str] = []  # jobs a worker of this host ran in their own plan folder
        try:  # this process's Ray node: its workers share this host's files
            self.node = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - a client connection (ray://) has no node here
            self.node = None
        # what the worker host's harness reads of the orchestrator's environment, fixed at the actor's start
        # (executors.shutdown() makes new workers after a change, as the bench does between its paths)
        from porter.host import sandbox

        self._actor_env = {k: os.environ[k] for k in (sandbox.UNSAFE_ENV, "PORTER_PARITY_HOST_PEAK_GBPS")
                           if k in os.environ}
        for _ in range(n):
            self._add_worker()
        self.size = n

    def archs(self, wait_s: float = 120.0) -> list[str]:
        """The GPU architectures of the cluster's workers (lowest first), once the first ones are placed:
        a library must load on every one of them, so the build is for all of them."""
        deadline = time.monotonic() + wait_s
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.2)
        found = {w.get("arch") for w in list(self.workers.values())} - {None}
        return sorted(found, key=gpu_arch.order)

    # -- workers ------------------------------------------------------------
    def _add_worker(self) -> None:
        """A new actor, handed out once Ray has placed it and it answered (a node may have no room
        now: the thread waits for one, and the others keep working)."""
        actor = self._actor_class.options(runtime_env={"env_vars": self._actor_env}).remote(self.mode) \
            if self._actor_env else self._actor_class.remote(self.mode)
        with self._lock:
            self.pending.add(actor)

        def placed():
            try:
                hello = self.ray.get(actor.hello.remote())
            except BaseException:  # noqa: BLE001 - died before its first job, or Ray shut down (SystemExit)
                hello = None
            self._accept(actor, hello)

        threading.Thread(target=placed, name="porter-ray-place", daemon=True).start()

    def _accept(self, actor, hello: dict | None) -> None:
        """A placed actor joins the free workers, unless it died first or its host cannot run parity."""
        with self._lock:
            self.pending.discard(actor)
            if hello is not None and hello.get("usable", True) and not self._closed:
                self.workers[actor] = hello
                self.free.put(actor)
                return
            if hello is not None:
                self.unusable.append(f"{hello.get('host')} (GPU {hello.get('gpus')}): {hello.get('why')}")
        try:
            self.ray.kill(actor)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def _drop(self, actor) -> None:
        if not self._closed:
            self._add_worker()  # first: a job waiting in _take never sees no worker alive and none coming
        with self._lock:
            self.workers.pop(actor, None)
        try:
            self.ray.kill(actor)
        except Exception:  # noqa: BLE001 - already gone
            pass

    # -- files --------------------------------------------------------------
    def _ship(self, path: str) -> tuple[str, str, object]:
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
        with self._lock:
            if key in self._shipped:
                self._shipped.move_to_end(key)
                return self._shipped[key]
        sha = sha256_file(Path(path))
        # a fixture GGUF or weight map can be gigabytes: mapped, so it goes into the object store without a
        # copy in this process's memory
        data = np.memmap(path, dtype=np.uint8, mode="r") if st.st_size else b""
        entry = (sha, Path(path).name, self.ray.put(data))
        with self._lock:
            self._shipped[key] = entry
            while len(self._shipped) > SHIPPED_KEEP:
                self._shipped.popitem(last=False)
        return entry

    def _job(self, plan_dir: Path, timeout: float) -> dict:
        files = {}
        for p in sorted(plan_dir.rglob("*")):
            if p.is_file() and not p.is_symlink():
                files[str(p.relative_to(plan_dir))] = p.read_bytes()
        shared = {f: self._ship(f) for f in runner.plan_files(plan_dir)}
        env = runner.child_env()
        if env.get("LD_PRELOAD"):  # the launch trace's interposer: sent in the plan folder, preloaded there
            preload = []
            for lib in env["LD_PRELOAD"].split():
                rel = f"preload/{Path(lib).name}"
                files[rel] = Path(lib).read_bytes()
                preload.append(f"{plan_dir}/{rel}")
            env["LD_PRELOAD"] = " ".join(preload)
        return {"name": plan_dir.name, "orig_dir": str(plan_dir), "files": files, "shared": shared,
                "timeout": timeout, "env": env}

    # -- the executor interface ----------------------------------------------
    def sanitizing(self, arch: str | None = None) -> "_Sanitizing":
        return _Sanitizing(self, arch)

    def on_arch(self, arch: str) -> "_OnArch":
        return _OnArch(self, arch)

    def run(self, plan_dir: Path, timeout: float, sanitize: bool = False,
            arch: str | None = None) -> runner.ChildOutcome:
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        plan_dir = Path(plan_dir)
        runner.clear_outputs(plan_dir)
        expected = runner.expected_results(plan_dir)  # from the plan as the orchestrator wrote it
        name, shipped = plan_dir.name, None
        # a worker on this host runs a heavy plan where it is: a weight-heavy plan's inputs (over 500 MB
        # for ds4's decode logits) otherwise went through the object store on every run, and Ray on one
        # machine's GPUs was slower than the local pool (docs/ray.md).  Not for --sanitize or the launch
        # trace, whose tools and preloaded library are set up per job.
        local = dict(name=name, in_place=True, orig_dir=str(plan_dir), plan_sha256=sha256_file(plan_dir / "plan.json"),
                     timeout=timeout) if (self.node and not sanitize and not runner.child_env().get("LD_PRELOAD")
                                          and (plan_dir / "plan.json").is_file()
                                          and _folder_bytes(plan_dir) >= IN_PLACE_MIN_BYTES) else None
        for attempt in range(TRIES):
            actor = self._take(name, arch)
            where = self.workers.get(actor, {})
            with self._lock:
                self.in_flight[name] = where
            try:
                res = None
                if local is not None and where.get("node") == self.node:
                    if attempt:
                        runner.clear_outputs(plan_dir)  # a lost worker's partial files are not this run's
                    res = self.ray.get(actor.run.remote(local), timeout=timeout + GRACE_S)
                if res is None or res.get("need_files"):
                    shipped = shipped or dict(self._job(plan_dir, timeout), sanitize=sanitize)
                    res = self.ray.get(actor.run.remote(shipped), timeout=timeout + GRACE_S)
            except RayTaskError:
                self.free.put(actor)  # a harness bug on the worker host, not a lost worker
                raise
            except (RayActorError, GetTimeoutError, *_lost_errors()) as exc:
                line = (f"{name}: worker {where.get('host')} pid {where.get('pid')} lost "
                        f"({type(exc).__name__}); run again" + (" elsewhere" if attempt + 1 < TRIES else ""))
                self.lost.append(line)
                self._drop(actor)
                continue
            finally:
                with self._lock:
                    self.in_flight.pop(name, None)
            self.free.put(actor)
            if attempt:
                self.retried.append(name)
            if res.get("in_place"):
                self.in_place.append(name)
            return self._outcome(plan_dir, res, timeout, expected)
        raise WorkersLost(f"parity job {name}: {TRIES} workers lost in a row ({self.lost[-1]})")

    def _fits(self, arch: str | None):
        """Whether a worker can take a job needing `arch` (None: any worker)."""
        return None if arch is None else (lambda actor: self.workers.get(actor, {}).get("arch") == arch)

    def _take(self, name: str, arch: str | None = None):
        """A free worker (of `arch`, where the job needs one); waits while others run (--jobs above the
        cluster's GPUs), but not forever once none is alive."""
        idle_since = time.monotonic()
        wait = 0.0  # look once without waiting: no worker alive and none coming fails at once
        fits = self._fits(arch)
        while True:
            try:
                return self.free.get(fits, timeout=wait) if wait else self.free.get_nowait(fits)
            except queue.Empty:
                wait = 10.0
                with self._lock:
                    alive = any(fits is None or fits(a) for a in self.workers)
                    coming = bool(self.pending)
                if alive:
                    idle_since = time.monotonic()
                elif not coming or time.monotonic() - idle_since > NO_WORKER_S:
                    why = (self.unusable or self.lost or ["none was placed"])[-1]
                    kind = f" of {arch}" if arch else ""
                    raise WorkersLost(f"parity job {name}: no usable Ray worker{kind} ({why})") from None

    def _outcome(self, plan_dir: Path, res: dict, timeout: float, expected: dict) -> runner.ChildOutcome:
        """The worker's raw files in the plan folder (a job run in place wrote them there itself), and the
        outcome classified HERE from them."""
        if not res.get("in_place"):
            for name in list(RETURNED) + [os.environ.get("PORTER_LAUNCH_TRACE") or ""]:
                if name:
                    (plan_dir / name).unlink(missing_ok=True)
            for name, data in (res.get("files") or {}).items():
                if name in RETURNED or name == os.environ.get("PORTER_LAUNCH_TRACE"):
                    (plan_dir / name).parent.mkdir(exist_ok=True)
                    (plan_dir / name).write_bytes(data)
        o = runner.classify(plan_dir, res.get("rc"), float(res.get("elapsed_s") or 0.0), bool(res.get("timed_out")),
                            timeout, list(res.get("argv") or []), expected, checked=runner.needs_checker(plan_dir))
        o.sandbox = res.get("sandbox") or "unknown"
        o.where = {k: v for k, v in (res.get("where") or {}).items() if k in ("host", "executor", "gpu", "driver", "node")}
        return o

    def close(self) -> None:
        with self._lock:
            self._closed = True
            actors, waiting = list(self.workers), list(self.pending)
            self.workers.clear()
        for a in actors:
            try:
                self.ray.get(a.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - best effort: the actor may be gone
                pass
        for a in actors + waiting:
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001
                pass



class _Sanitizing:
    """RayExecutor's --sanitize reruns: on a worker host (of `arch`, where required), under its
    compute-sanitizer."""

    def __init__(self, ex: RayExecutor, arch: str | None = None):
        self.ex = ex
        self.arch = arch

    def run(self, plan_dir: Path, timeout: float) -> runner.ChildOutcome:
        return self.ex.run(plan_dir, timeout, sanitize=True, arch=self.arch)


class _OnArch:
    """RayExecutor's plans for one required architecture: each on a worker whose GPU is that kind."""

    def __init__(self, ex: RayExecutor, arch: str):
        self.ex = ex
        self.arch = arch

    def run(self, plan_dir: Path, timeout: float) -> runner.ChildOutcome:
        return self.ex.run(plan_dir, timeout, arch=self.arch)
