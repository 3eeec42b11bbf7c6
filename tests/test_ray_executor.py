"""Parity on a Ray cluster (--executor ray): a cluster of two raylets on this machine, each with one
fake GPU, runs host-mode parity (no GPU needed) for a scripted minimoe port.

What must hold: the verdicts and the ledger's story are the local pool's; a worker killed in the
middle of a job costs a rerun of that job elsewhere, and nothing is lost or recorded twice; the
evidence names the host and the executor each verdict ran on; the raw outputs come back and are
judged here (a worker cannot say "ok").
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import tomllib
from pathlib import Path

import pytest

from conftest import gates_with
from porter.digest import sha256_bytes
from porter.gates.extract import extract_unit_source
from porter.gates.result import GateResult
from porter.records.ledger import Ledger
from porter.target import load_target

from tests.test_parity_compare import FAKE_BACKEND

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'porter[ray]'): the Ray executor's "
                          "tests need a local Ray cluster")
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = [pytest.mark.skipif(CC is None, reason="no C compiler (cc) for the host stand-in backend"),
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="porter run needs nvcc on PATH")]

OPS = ["mini_gpu_swiglu_tensor", "mini_gpu_matmul_q8_0_tensor", "mini_gpu_router_topk_tensor",
       "mini_gpu_embed_rows_tensor"]  # the units the host stand-in backend implements
# a scripted answer the manifest expects perf to refuse is built as a stand-in parity must refuse,
# so the run's verdicts include a parity failure judged from a worker's outputs
FAULTS = {"bad/matmul_q8_0_serial.md": "FIRST_BLOCK"}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    # each node advertises its (fake) GPU's architecture as porter reads it of a node whose GPU nvidia-smi
    # cannot name (cluster.ARCH_RESOURCE): two kinds, so jobs that require one must go to its node
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1, "include_dashboard": False,
                                                      "resources": {"arch:sm_90": 1}})
    c.add_node(num_cpus=1, num_gpus=1, resources={"arch:sm_121": 1})  # a second raylet: a second "host"
    yield c
    from porter.gates.parity import executors

    executors.shutdown()
    ray.shutdown()
    c.shutdown()


class HostBuild:
    """The build gate's stand-in: each candidate becomes the C host backend (with the fault its
    scripted answer stands for), so host-mode parity runs the real gate on it without a GPU."""

    def __init__(self, target, out: Path, slow_s: float = 0.0):
        self.out, self.slow_s = out, slow_s
        self.faults = {}
        for a in tomllib.loads((target.scripted_dir / "manifest.toml").read_text())["answer"]:
            if a["file"] in FAULTS:
                code = extract_unit_source((target.scripted_dir / a["file"]).read_text(), a["unit"], target)
                self.faults[sha256_bytes(code.encode())] = FAULTS[a["file"]]

    def run(self, candidate, ctx):
        hack = self.faults.get(candidate.sha256)
        lib = self.out / f"lib_{hack or 'good'}_{self.slow_s}.so"
        if not lib.is_file():
            src = self.out / "backend.c"
            # a slow library load: a job is surely in flight when the test kills its worker
            slow = (f"\n#include <unistd.h>\n__attribute__((constructor)) static void slow_load(void) "
                    f"{{ usleep({int(self.slow_s * 1e6)}); }}\n") if self.slow_s else ""
            src.write_text(FAKE_BACKEND + slow)
            flags = [f"-DHACK_{hack}"] if hack else []
            subprocess.run([CC, "-O1", "-shared", "-fPIC", *flags, "-o", str(lib), str(src), "-lm"], check=True)
        ctx.library = lib
        return GateResult("build", True, "built (host stand-in)",
                          evidence={"candidate_sha256": candidate.sha256, "library": str(lib)})


class HostParity:
    """The real parity gate, in host mode without timing (the CI stand-in device)."""

    def run(self, candidate, ctx):
        from dataclasses import replace

        from porter.gates import parity

        ctx.parity = replace(ctx.parity, mode="host", timing_reps=0)
        return parity.run(candidate, ctx)


def _port(workspace, monkeypatch, tmp_path, executor: str, address: str | None = None, slow_s: float = 0.0):
    from porter.gates import parity, registry
    from porter.gates.parity import executors, pool
    from porter.run import RunOptions, run

    executors.shutdown()
    if executor == "ray":
        monkeypatch.setenv("PORTER_PARITY_EXECUTOR", "ray")
        monkeypatch.setenv("PORTER_RAY_ADDRESS", address)
    else:
        monkeypatch.setenv("PORTER_PARITY_EXECUTOR", "warm")
    target = load_target(workspace, "minimoe")
    out = tmp_path / f"host-build-{executor}"
    out.mkdir()
    monkeypatch.setattr(registry, "ACTIVE", gates_with(build=HostBuild(target, out, slow_s), parity=HostParity()))
    monkeypatch.setattr(parity, "available", lambda: (True, "host stand-in"))
    rc = run(RunOptions(workspace, "minimoe", units=list(OPS), max_attempts=3, quiet=True, jobs=2,
                        provider={"provider": "scripted"}))
    return rc, pool


def _story(ws) -> dict:
    """Per unit, what the ledger says happened, without what differs between two honest runs (seeds,
    times, hashes of evidence): each attempt's gate verdicts in order, and the steps' states."""
    story: dict = {}
    for r in Ledger(ws).records():
        u = r.get("unit")
        if u not in OPS:
            continue
        if r["kind"] == "gate":
            story.setdefault(u, []).append(("gate", r["attempt"], r["gate"], r["ok"], r.get("skipped", False)))
        elif r["kind"] in ("attempt", "failure", "step", "exhausted"):
            story.setdefault(u, []).append((r["kind"], r.get("attempt"), r.get("state")))
    return story


def _parity_evidence(ws) -> list[dict]:
    from porter.records.evidence import load_evidence

    return [load_evidence(ws, r["evidence"]) for r in Ledger(ws).records()
            if r["kind"] == "gate" and r["gate"] == "parity" and r["unit"] in OPS]


def _kill_first_job_worker(executors, seen: list) -> threading.Thread:
    """SIGKILL the Ray worker (the actor's process) of the first parity job seen in flight."""
    def watch():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not seen:
            ex = executors._executors.get("host")
            flying = dict(getattr(ex, "in_flight", {}) or {})
            for job, where in flying.items():
                if where.get("pid"):
                    os.kill(where["pid"], signal.SIGKILL)
                    seen.append((job, where))
                    return
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_ray_port_has_the_local_pools_verdicts_and_a_killed_worker_costs_one_rerun(
        cluster, tmp_path, monkeypatch, build_cache, porter_cli):
    from tests.conftest import make_workspace
    from tests.test_crash import assert_consistent

    local_ws = make_workspace(tmp_path / "local")
    rc, _ = _port(local_ws, monkeypatch, tmp_path, "local")
    assert rc == 0
    local = _story(local_ws)
    assert any(("gate", a, "parity", False, False) in v for v in local.values() for a in (1, 2, 3)), \
        "the stand-in's fault was not refused by parity: the comparison would show nothing"

    ray_ws = make_workspace(tmp_path / "ray")
    seen: list = []
    from porter.gates.parity import executors

    from porter.gates.parity import cluster as ray_cluster

    # every plan counts as heavy: the head node's worker runs in place, the second raylet's is sent the files
    monkeypatch.setattr(ray_cluster, "IN_PLACE_MIN_BYTES", 0)
    watcher = _kill_first_job_worker(executors, seen)
    rc, pool = _port(ray_ws, monkeypatch, tmp_path, "ray", cluster.address, slow_s=1.5)
    watcher.join(timeout=1)
    ex = executors._executors["host"]
    assert rc == 0
    assert ex.in_place, "no job ran in place on the orchestrator's node"
    assert seen, "no parity job was seen in flight on the cluster"
    assert len(ex.lost) == 1 and ex.retried == [seen[0][0]], (ex.lost, ex.retried)
    assert _story(ray_ws) == local  # same verdicts, same records, nothing lost or doubled
    for u in OPS:
        assert_consistent(ray_ws, u, porter_cli)  # each step committed once, every attempt concluded
    hosts = {(e["toolchain"]["executor"], e["toolchain"]["host"]) for e in _parity_evidence(ray_ws)}
    assert hosts == {("ray", os.uname().nodename)}
    assert {e["toolchain"]["executor"] for e in _parity_evidence(local_ws)} == {"local"}
    assert {e["sandbox"] for e in _parity_evidence(ray_ws)} == {e["sandbox"] for e in _parity_evidence(local_ws)}


def test_run_and_calibrate_take_the_clusters_gpus_as_their_jobs(cluster, monkeypatch, workspace):
    """`porter run/calibrate --executor ray --ray-address ADDR`: parity goes to the cluster, and --jobs
    (not given) is its GPU count; a --jobs given is kept."""
    import porter.calibration.command as command
    import porter.run as porter_run
    from porter.cli import main
    from porter.gates.parity import executors

    seen = {}
    monkeypatch.setattr(porter_run, "run", lambda opts: seen.setdefault("run", []).append(opts.jobs) or 0)
    monkeypatch.setattr(command, "calibrate", lambda target, libs, opts, out=print:
                        seen.setdefault("calibrate", []).append(opts.jobs) or {"rows": [], "seconds": 0.0})
    # set (not deleted) first: what the CLI writes into os.environ is put back after the test
    monkeypatch.setenv("PORTER_PARITY_EXECUTOR", "warm")
    monkeypatch.setenv("PORTER_RAY_ADDRESS", cluster.address)
    executors.shutdown()
    try:
        assert main(["-C", str(workspace), "run", "--executor", "ray", "--ray-address", cluster.address]) == 0
        assert main(["-C", str(workspace), "run", "--executor", "ray", "--jobs", "5"]) == 0
        assert main(["-C", str(workspace), "calibrate", "--mode", "host", "--no-ledger", "--executor", "ray"]) == 0
    finally:
        executors.shutdown()
    assert seen == {"run": [2, 5], "calibrate": [2]}
    assert os.environ["PORTER_PARITY_EXECUTOR"] == "ray"


def test_cluster_size_is_the_default_jobs(cluster, monkeypatch):
    import argparse

    from porter.gates.parity import executors

    executors.shutdown()
    # set (not deleted) first: what the CLI writes into os.environ is put back after the test
    monkeypatch.setenv("PORTER_PARITY_EXECUTOR", "warm")
    monkeypatch.setenv("PORTER_RAY_ADDRESS", cluster.address)
    args = argparse.Namespace(executor=None, ray_address=cluster.address)
    assert executors.use_executor(args, "host") == 2  # two raylets, one fake GPU each
    assert os.environ["PORTER_PARITY_EXECUTOR"] == "ray"
    from porter.gates import parity

    parity.available.cache_clear()
    try:  # parity can run: the cluster has GPUs, whatever this machine has
        assert parity.available() == (True, "2 GPU(s) on the Ray cluster")
    finally:
        parity.available.cache_clear()
    assert executors.use_executor(argparse.Namespace(executor="local", ray_address=None), "host") is None
    executors.shutdown()


# ---------------------------------------------------------------------------
# the orchestrator's side, without a cluster
# ---------------------------------------------------------------------------

def _plan(tmp_path, n_cases=2, name="plan") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "plan.json").write_text(json.dumps({"mode": "host", "cases": [
        {"id": f"c{i}", "passes": [{}, {}]} for i in range(n_cases)]}))
    return d


class _FakeActor:
    def __init__(self, reply):
        self.reply = reply
        self.run = self
        self.jobs: list[dict] = []

    def remote(self, job):
        self.jobs.append(job)
        return self.reply(job) if callable(self.reply) else self.reply


def _executor(replies: list, archs: list | None = None):
    """A RayExecutor over stand-in actors: each get() answers the next reply (an exception is raised);
    `archs`: each actor's GPU architecture, as its hello says."""
    from porter.gates.parity.cluster import FreeWorkers, RayExecutor

    ex = RayExecutor.__new__(RayExecutor)
    ex.mode, ex._lock, ex._closed = "host", threading.Lock(), False
    ex.free, ex.workers, ex.pending, ex.in_flight, ex.lost, ex.retried = FreeWorkers(), {}, set(), {}, [], []
    ex.unusable, ex.in_place, ex.node = [], [], "node-here"
    ex._shipped = __import__("collections").OrderedDict()
    for i, r in enumerate(replies):
        a = _FakeActor(r)
        ex.workers[a] = {"host": "h", "pid": 1, "arch": archs[i] if archs else None}
        ex.free.put(a)

    class FakeRay:
        @staticmethod
        def get(ref, timeout=None):
            if isinstance(ref, BaseException):
                raise ref
            return ref

        @staticmethod
        def kill(actor):
            pass

    ex.ray = FakeRay
    ex._add_worker = lambda: None  # no cluster to place a replacement on
    return ex


def _reply(files: dict, rc=0) -> dict:
    return {"rc": rc, "elapsed_s": 0.1, "timed_out": False, "argv": ["python", "worker.py"], "sandbox": "bubblewrap",
            "files": {k: v.encode() if isinstance(v, str) else v for k, v in files.items()},
            "where": {"host": "gpu-host-7", "executor": "ray", "secret": "x"}}


def test_the_outcome_is_classified_here_from_the_raw_files(tmp_path):
    """A worker host's reply is files and an exit status: a results file saying 'complete' without a
    record of every call is a crash, whatever else the reply says."""
    plan = _plan(tmp_path)
    one_case = json.dumps({"complete": True, "cases": [{"id": "c0", "passes": [{"pass": 0}, {"pass": 1}]}]})
    ex = _executor([_reply({"results.json": one_case}) | {"local_detail": "completed"}])
    o = ex.run(plan, 5.0)
    assert o.status == "crash" and "reported nothing for case c1" in o.detail
    assert o.where == {"host": "gpu-host-7", "executor": "ray"}  # only the facts evidence names


def test_files_the_worker_was_not_asked_for_are_not_written(tmp_path):
    plan = _plan(tmp_path, 1)
    full = json.dumps({"complete": True, "cases": [{"id": "c0", "passes": [{"pass": 0}, {"pass": 1}]}]})
    ex = _executor([_reply({"checker/checker.json": _CHECKED, "results.json": full, "plan.json": "{}",
                            "../escape": "x"})])
    assert ex.run(plan, 5.0).status == "done"
    assert json.loads((plan / "plan.json").read_text())["cases"]  # the orchestrator's plan, untouched
    assert not (tmp_path / "escape").exists()


def test_a_lost_worker_reruns_the_job_once_and_three_lost_give_a_harness_fault(tmp_path):
    from ray.exceptions import ActorDiedError

    from porter.gates.parity.cluster import WorkersLost

    full = json.dumps({"complete": True, "cases": [{"id": "c0", "passes": [{"pass": 0}, {"pass": 1}]}]})
    ex = _executor([ActorDiedError(), _reply({"checker/checker.json": _CHECKED, "results.json": full})])
    assert ex.run(_plan(tmp_path, 1), 5.0).status == "done"
    assert len(ex.lost) == 1 and ex.retried == ["plan"]
    ex = _executor([ActorDiedError()] * 3)
    with pytest.raises(WorkersLost):  # run_spec reports it as "parity skipped: harness error", never a verdict
        ex.run(_plan(tmp_path, 1, "again"), 5.0)


def test_plan_paths_are_rewritten_for_the_worker_host(tmp_path):
    from porter.gates.parity.cluster import _rewrite_plan

    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"library": "/ws/lib.so", "cases": [{"map": {"file": "/ws/fixture.gguf"}},
                                                                {"dir": "/runs/p-1/files/w.bin"}],
                             "note": "/runs/p-10/x"}))
    _rewrite_plan(p, "/runs/p-1", "/tmp/job", {"/ws/lib.so": "/cache/aa/lib.so", "/ws/fixture.gguf": "/cache/bb/f"})
    got = json.loads(p.read_text())
    assert got == {"library": "/cache/aa/lib.so", "cases": [{"map": {"file": "/cache/bb/f"}},
                                                            {"dir": "/tmp/job/files/w.bin"}],
                   "note": "/runs/p-10/x"}  # a sibling folder with the same prefix is not the plan's


PRELOAD = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void mark(void) {
    const char *path = getenv("PORTER_LAUNCH_TRACE");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) { fputs("preloaded_in_the_worker_child\n", f); fclose(f); }
}
"""


def test_the_launch_trace_runs_on_the_cluster(cluster, tmp_path, monkeypatch):
    """`porter dev trace --executor ray`: the interposer goes with the plan, the worker host's child
    starts with it preloaded, and the trace file it writes comes back into the kept plan folder."""
    from porter.gates.parity import executors
    from porter.gates.parity.gate import run_spec
    from porter.spec import Context, load_spec

    (tmp_path / "pre.c").write_text(PRELOAD)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(tmp_path / "pre.so"), str(tmp_path / "pre.c")], check=True)
    (tmp_path / "b.c").write_text(FAKE_BACKEND)
    subprocess.run([CC, "-O1", "-shared", "-fPIC", "-o", str(tmp_path / "lib.so"), str(tmp_path / "b.c"), "-lm"],
                   check=True)
    target = load_target(Path(__file__).resolve().parents[1], "minimoe")
    executors.shutdown()
    monkeypatch.setenv("PORTER_PARITY_EXECUTOR", "ray")
    monkeypatch.setenv("PORTER_RAY_ADDRESS", cluster.address)
    monkeypatch.setenv("PORTER_LAUNCH_TRACE", "launch.trace")
    # LD_PRELOAD reaches every process this test starts, each marking launch.trace in its own folder:
    # started from the repository's root, they once left (and committed) one there
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LD_PRELOAD", str(tmp_path / "pre.so"))
    try:
        res = run_spec(target, load_spec(target, "mini_gpu_swiglu_tensor"), tmp_path / "lib.so", workspace=tmp_path,
                       mode="host", timing_reps=0, keep=True, ctx=Context(None))
    finally:
        monkeypatch.delenv("LD_PRELOAD")
    assert res.ok, res.summary
    assert res.evidence["toolchain"]["executor"] == "ray"
    traces = list((tmp_path / "runs" / "parity").glob("mini_gpu_swiglu_tensor-*/launch.trace"))
    assert [t.read_text() for t in traces] == ["preloaded_in_the_worker_child\n"]
    executors.shutdown()


def test_the_build_is_for_every_architecture_of_the_cluster_unless_named(monkeypatch):
    """The orchestrator builds, the workers load: a library for this machine's GPU (or the target's
    default) would not load on a GB10 worker (sm_121) of an H100 (sm_90) orchestrator."""
    import argparse

    from porter.gates.parity import executors

    ex = _executor([])
    ex.workers = {object(): {"arch": "sm_121"}, object(): {"arch": "sm_90"}, object(): {"arch": None}}
    assert ex.archs(wait_s=0) == ["sm_90", "sm_121"]
    ex.size = 3
    monkeypatch.setattr(executors, "executor", lambda mode: ex)
    monkeypatch.setenv("PORTER_PARITY_EXECUTOR", "warm")
    monkeypatch.setenv("PORTER_ARCH", "")
    args = argparse.Namespace(executor="ray", ray_address=None)
    assert executors.use_executor(args, "cuda") == 3
    assert os.environ["PORTER_ARCH"] == "sm_90,sm_121"
    monkeypatch.setenv("PORTER_ARCH", "sm_120")  # --arch named: kept
    executors.use_executor(args, "cuda")
    assert os.environ["PORTER_ARCH"] == "sm_120"


def test_what_crosses_the_network_is_the_plan_its_files_and_no_key(tmp_path, monkeypatch):
    """A job for a worker host: the plan folder, the files the plan names (each sent once, by content),
    the child's allowed variables; never the signing key, an API key or another file of the user's."""
    from porter.gates.parity import runner

    home = tmp_path / "porter-home"
    home.mkdir(exist_ok=True)
    key = home / "signing_key"
    key.write_bytes(b"SIGNING-KEY-BYTES-0123456789")
    monkeypatch.setenv("PORTER_SIGNING_KEY", str(key))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-SECRET-TOKEN")
    monkeypatch.setenv("PORTER_PARITY_HOST_PEAK_GBPS", "12")
    fixture = tmp_path / "fixture.gguf"
    fixture.write_bytes(b"GGUF-fixture")
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\x7fELF-library")
    plan = tmp_path / "plan"
    plan.mkdir()
    (plan / "plan.json").write_text(json.dumps({"mode": "host", "library": str(lib),
                                                "cases": [{"id": "c0", "passes": [{"map": {"file": str(fixture)}}]}]}))
    (plan / "inputs.npz").write_bytes(b"inputs")
    ex = _executor([])
    put = []
    ex.ray.put = staticmethod(lambda data: put.append(data) or f"ref{len(put)}")
    job = ex._job(plan, 5.0)
    again = ex._job(plan, 5.0)
    assert sorted(job["files"]) == ["inputs.npz", "plan.json"]
    assert sorted(job["shared"]) == sorted([str(lib), str(fixture)])
    assert sorted(bytes(x) for x in put) == [b"GGUF-fixture", b"\x7fELF-library"], "each file is sent once"
    assert again["shared"] == job["shared"]
    assert set(job["env"]) <= set(runner.PASSED_ENV) and job["env"]["PORTER_PARITY_HOST_PEAK_GBPS"] == "12"
    blob = repr(job).encode() + b"".join(bytes(x) for x in put)
    assert b"SIGNING-KEY" not in blob and b"SECRET-TOKEN" not in blob and str(home).encode() not in blob


_FULL_ONE_CASE = json.dumps({"complete": True, "cases": [{"id": "c0", "passes": [{"pass": 0}, {"pass": 1}]}]})
# an op plan's record of what was checked comes from its checker (runner.CHECKER_DIR), not the runner
_CHECKED = json.dumps({"complete": True, "cases": [], "violation": None})


def _in_place_reply(job) -> dict:
    """What a worker of the orchestrator's host does with an in-place job: the child's files where the plan is."""
    assert job["in_place"] and "files" not in job and "shared" not in job, "an in-place job sends no files"
    (Path(job["orig_dir"]) / "results.json").write_text(_FULL_ONE_CASE)
    (Path(job["orig_dir"]) / "checker").mkdir(exist_ok=True)
    (Path(job["orig_dir"]) / "checker" / "checker.json").write_text(_CHECKED)
    return {"rc": 0, "elapsed_s": 0.1, "timed_out": False, "argv": ["python"], "sandbox": "bubblewrap",
            "in_place": True, "where": {"host": "h", "executor": "ray"}}


def _on_this_host(ex):
    for hello in ex.workers.values():
        hello["node"] = ex.node
    return ex


def test_a_heavy_plan_runs_in_place_on_a_worker_of_this_host_and_nothing_is_sent(tmp_path, monkeypatch):
    # ds4's decode-logits plans (over 500 MB of inputs) went through the object store on every run, and Ray
    # on one machine's two GPUs was slower than the local pool (docs/ray.md)
    from porter.digest import sha256_file
    from porter.gates.parity import cluster

    monkeypatch.setattr(cluster, "IN_PLACE_MIN_BYTES", 1)
    plan = _plan(tmp_path, 1)
    ex = _on_this_host(_executor([_in_place_reply]))
    ex.ray.put = staticmethod(lambda data: pytest.fail("an in-place job put something in the object store"))
    o = ex.run(plan, 5.0)
    (actor,) = ex.workers
    assert o.status == "done" and ex.in_place == ["plan"]
    assert actor.jobs[0]["plan_sha256"] == sha256_file(plan / "plan.json")


def test_a_worker_that_cannot_see_the_plan_is_sent_it(tmp_path, monkeypatch):
    from porter.gates.parity import cluster

    monkeypatch.setattr(cluster, "IN_PLACE_MIN_BYTES", 1)
    replies = iter([{"need_files": True}, _reply({"checker/checker.json": _CHECKED, "results.json": _FULL_ONE_CASE})])
    ex = _on_this_host(_executor([lambda job: next(replies)]))
    assert ex.run(_plan(tmp_path, 1), 5.0).status == "done"
    (actor,) = ex.workers
    assert actor.jobs[0]["in_place"] and sorted(actor.jobs[1]["files"]) == ["plan.json"] and ex.in_place == []


def test_light_plans_other_hosts_and_sanitize_reruns_are_sent(tmp_path, monkeypatch):
    from porter.gates.parity import cluster

    shipped = lambda: _reply({"checker/checker.json": _CHECKED, "results.json": _FULL_ONE_CASE})  # noqa: E731
    ex = _on_this_host(_executor([shipped()]))  # a plan under IN_PLACE_MIN_BYTES
    assert ex.run(_plan(tmp_path, 1, "light"), 5.0).status == "done" and "files" in next(iter(ex.workers)).jobs[0]
    monkeypatch.setattr(cluster, "IN_PLACE_MIN_BYTES", 1)
    ex = _executor([shipped()])  # a worker of another host
    assert ex.run(_plan(tmp_path, 1, "elsewhere"), 5.0).status == "done" and "files" in next(iter(ex.workers)).jobs[0]
    ex = _on_this_host(_executor([shipped()]))
    ex.run(_plan(tmp_path, 1, "sanitized"), 5.0, sanitize=True)
    assert next(iter(ex.workers)).jobs[0]["sanitize"] is True and "files" in next(iter(ex.workers)).jobs[0]
    assert ex.in_place == []


def test_the_worker_runs_in_place_only_the_plan_the_orchestrator_hashed(tmp_path):
    from porter.gates.parity.cluster import GateWorker

    plan = _plan(tmp_path, 1)
    job = {"name": "plan", "in_place": True, "orig_dir": str(plan), "plan_sha256": "0" * 64, "timeout": 5.0}
    assert GateWorker._run_in_place(None, job) == {"need_files": True}  # another plan, or another machine's
    (plan / "plan.json").rename(plan / "real.json")
    (plan / "plan.json").symlink_to(plan / "real.json")
    from porter.digest import sha256_file

    job["plan_sha256"] = sha256_file(plan / "real.json")
    assert GateWorker._run_in_place(None, job) == {"need_files": True}  # never through a link


def test_sanitize_reruns_go_to_a_worker_host_and_its_verdict_is_read_here(tmp_path, monkeypatch):
    """--sanitize under --executor ray: compute-sanitizer runs where the GPU is (this machine may have
    none, and a missing tool here would be blamed on the candidate); its exit status is judged here."""
    from porter.gates.parity import executors, pool, runner

    reply = _reply({}, rc=runner.SANITIZER_EXIT) | {"argv": ["/opt/cuda/bin/compute-sanitizer", "--tool", "memcheck"],
                                                    "files": {"child.stdout": b"========= Invalid __global__ read\n"}}
    ex = _executor([reply])
    actor = next(iter(ex.workers))
    monkeypatch.setattr(executors, "executor", lambda mode: ex)
    o = executors.sanitizing("cuda").run(_plan(tmp_path, 1), 5.0)
    assert actor.jobs and actor.jobs[0]["sanitize"] is True
    assert o.status == "sanitize" and "Invalid __global__ read" in o.detail
    monkeypatch.setattr(executors, "executor", lambda mode: pool.SpawnExecutor())
    assert isinstance(executors.sanitizing("cuda"), pool.SanitizingExecutor)


def test_a_worker_whose_host_cannot_open_its_gpu_gets_no_job(tmp_path):
    """A GPU host without a working cupy (or driver) would fail every candidate it ran: it is left out,
    and with no usable worker the job is a harness fault (gate skipped), not a refusal of the candidate."""
    from porter.gates.parity.cluster import WorkersLost

    ex = _executor([])
    ex._accept(object(), {"host": "gb10-1", "gpus": "0", "usable": False, "why": "cupy is not installed"})
    assert not ex.workers and ex.free.empty()
    assert ex.unusable == ["gb10-1 (GPU 0): cupy is not installed"]
    with pytest.raises(WorkersLost, match="gb10-1 \\(GPU 0\\): cupy is not installed"):
        ex.run(_plan(tmp_path, 1), 5.0)
    good = object()
    ex._accept(good, {"host": "h100-1", "usable": True})
    assert ex.workers == {good: {"host": "h100-1", "usable": True}}


# ---- required architectures (issue 32): a job that needs a GPU kind runs on a worker of that kind ----

def test_a_job_needing_an_architecture_goes_to_a_worker_of_it(tmp_path):
    """Placement by architecture: of two idle workers the job requiring sm_121 takes the sm_121 one (the
    sm_90 one stays idle for others); with no worker of a kind alive and none coming, the job is a harness
    fault naming the kind, never a verdict from a GPU of another kind."""
    from porter.gates.parity.cluster import WorkersLost

    full = json.dumps({"complete": True, "cases": [{"id": "c0", "passes": [{"pass": 0}, {"pass": 1}]}]})
    ex = _executor([_reply({"checker/checker.json": _CHECKED, "results.json": full}),
                    _reply({"checker/checker.json": _CHECKED, "results.json": full})], archs=["sm_90", "sm_121"])
    h100, gb10 = list(ex.workers)
    assert ex.run(_plan(tmp_path, 1, "a"), 5.0, arch="sm_121").status == "done"
    assert gb10.jobs and not h100.jobs
    assert ex.on_arch("sm_90").run(_plan(tmp_path, 1, "b"), 5.0).status == "done"
    assert len(h100.jobs) == 1 and len(gb10.jobs) == 1
    with pytest.raises(WorkersLost, match="no usable Ray worker of sm_120"):
        ex.run(_plan(tmp_path, 1, "c"), 5.0, arch="sm_120")
    assert ex.run(_plan(tmp_path, 1, "d"), 5.0).status == "done"  # no kind required: any idle worker


def test_required_architectures_run_on_their_own_nodes_of_the_cluster(cluster, tmp_path, monkeypatch):
    """Two raylets advertising two (fake) architectures: the gate runs once on each required kind, each run
    on the node of that kind, and a required kind no node has is recorded as not measured."""
    from porter.gates import archs
    from porter.gates.parity import executors
    from porter.gates.parity.gate import run_spec
    from porter.spec import Context, load_spec

    (tmp_path / "b.c").write_text(FAKE_BACKEND)
    subprocess.run([CC, "-O1", "-shared", "-fPIC", "-o", str(tmp_path / "lib.so"), str(tmp_path / "b.c"), "-lm"],
                   check=True)
    target = load_target(Path(__file__).resolve().parents[1], "minimoe")
    spec = load_spec(target, "mini_gpu_swiglu_tensor")
    executors.shutdown()
    monkeypatch.setenv("PORTER_PARITY_EXECUTOR", "ray")
    monkeypatch.setenv("PORTER_RAY_ADDRESS", cluster.address)
    ex = executors.executor("host")
    assert executors.served_archs("host") == ("sm_90", "sm_121")
    node_of = {k[len("arch:"):]: n["NodeID"] for n in ray.nodes() if n["Alive"] for k in n["Resources"]
               if k.startswith("arch:")}
    placed = {}
    real_run = ex.run

    def run(plan_dir, timeout, sanitize=False, arch=None):
        o = real_run(plan_dir, timeout, sanitize=sanitize, arch=arch)
        placed[arch] = o.where.get("node")
        return o

    monkeypatch.setattr(ex, "run", run)
    res = archs.across(("sm_90", "sm_120", "sm_121"), executors.served_archs("host"),
                       lambda a: run_spec(target, spec, tmp_path / "lib.so", workspace=tmp_path, mode="host",
                                          timing_reps=0, ctx=Context(None), arch=a), gate="parity")
    executors.shutdown()
    assert placed == {"sm_90": node_of["sm_90"], "sm_121": node_of["sm_121"]}
    # both reachable kinds passed, the third has no GPU: not a pass (the run commits it built)
    assert not res.ok and res.skipped and "sm_120 not measured" in res.summary, res.summary
    assert archs.verdicts(res.evidence) == {"sm_90": True, "sm_121": True}
    assert res.evidence["archs"]["sm_120"] == {"measured": False,
                                               "why": "no GPU of sm_120 reachable (GPUs here: sm_90, sm_121)"}
