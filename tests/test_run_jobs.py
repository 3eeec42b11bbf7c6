"""`porter run --jobs N`: several units in flight, in dependency order, and a SIGKILL with
several in flight loses nothing and doubles nothing (the crash suite's invariants)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from porter.records.ledger import Ledger

from tests.test_crash import assert_consistent, finish_run, kill_run

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None,
                                reason="nvcc not on PATH: porter run needs the CUDA toolkit for the build gate")

RUNTIME = "mini_gpu_tensor_bytes"
OPS = ["mini_gpu_add_tensor", "mini_gpu_swiglu_tensor"]  # swiglu: a prose-only answer first, then the good one
UNITS = [a for u in OPS + [RUNTIME] for a in ("--unit", u)]  # runtime named last: the order must still hold
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def this_checkout(monkeypatch):
    """`python -m porter` in a workspace folder must import this checkout's porter, not an installed one."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def test_jobs_runs_units_together_in_dependency_order(workspace, build_cache, porter_cli):
    r = finish_run(porter_cli, workspace, "--jobs", "3", *UNITS)
    assert "started" in r.stdout
    for u in OPS + [RUNTIME]:
        assert_consistent(workspace, u, porter_cli)
    recs = Ledger(workspace).records()
    runtime_done = max(i for i, x in enumerate(recs) if x.get("unit") == RUNTIME and x["kind"] == "step")
    first_op = min(i for i, x in enumerate(recs) if x.get("unit") in OPS and x["kind"] == "attempt")
    assert runtime_done < first_op, "an op started before the runtime unit it depends on ended"


@pytest.mark.parametrize("point", ["after-gate:7", "after-failure:1", "after-unit-file:2", "after-step:2"])
def test_kill_with_several_units_in_flight(workspace, build_cache, porter_cli, point):
    kill_run(porter_cli, workspace, point, "--jobs", "3", *UNITS)
    finish_run(porter_cli, workspace, "--jobs", "3", *UNITS)
    for u in OPS + [RUNTIME]:
        assert_consistent(workspace, u, porter_cli)


def test_jobs_must_be_positive(workspace, porter_cli):
    r = porter_cli(workspace, "run", "--jobs", "0", "--unit", RUNTIME)
    assert r.returncode != 0 and "porter: error: --jobs must be at least 1" in r.stderr


def test_answers_are_awaited_together(workspace, build_cache):
    """Two ops with a slow provider: the second one's answer arrives while the first is still in its gates."""
    from porter.run import RunOptions, run

    rc = run(RunOptions(workspace, "minimoe", units=["mini_gpu_add_tensor", "mini_gpu_tensor_bytes"][:1] + [OPS[1]],
                        quiet=True, jobs=2, provider={"provider": "scripted", "answer_delay_s": 2.0}))
    assert rc == 0
    recs = Ledger(workspace).records()
    first_attempts = {}
    for i, x in enumerate(recs):
        if x["kind"] == "attempt":
            first_attempts.setdefault(x["unit"], i)
    builds = [i for i, x in enumerate(recs) if x["kind"] == "gate" and x.get("gate") == "build"]
    assert len(first_attempts) == 2 and max(first_attempts.values()) < min(builds), \
        "the second unit's answer came only after the first unit's build: units ran one at a time"


def test_a_step_commit_leaves_out_another_threads_temp_files(workspace):
    """With --jobs 8 on ds4 a commit's `git add` met an evidence temp file another thread had just
    renamed away, and the run died mid-history.  Temp files are never part of a commit."""
    from porter.records import gitops

    ev = workspace / "ledger" / "evidence"
    ev.mkdir(parents=True, exist_ok=True)
    (ev / "ab.json").write_text("{}")
    tmp = ev / ".cd.json.tmp-123-456"
    tmp.write_text("{half")
    sha = gitops.commit_paths(workspace, ["ledger"], "test: evidence only\n")
    files = gitops.git(workspace, "show", "--name-only", "--format=", sha).split()
    assert "ledger/evidence/ab.json" in files and not any(".tmp-" in f for f in files)


def test_first_answers_are_asked_for_while_units_wait_for_their_dependencies(workspace, build_cache, porter_cli,
                                                                            monkeypatch):
    """--jobs 3: the ops wait for the runtime unit before their gates, but their first answers are asked for
    at once (measured at --jobs 8 with 60 s answers: waiting first held minimoe to 5.99x --jobs 1), and
    the ledger still shows every op's attempt after the runtime unit's step."""
    import threading

    import porter.run.attempt as attempt
    from porter.run import RunOptions, run
    from porter.providers.delayed import DelayedProvider

    events, lock = [], threading.Lock()
    real_complete, real_commit = DelayedProvider.complete, attempt.commit_step

    def complete(self, req):
        with lock:
            events.append(("ask", req.unit, req.attempt))
        return real_complete(self, req)

    def commit_step(ws, step, *headline):
        with lock:
            events.append(("commit", step.unit, step.attempt))
        return real_commit(ws, step, *headline)

    monkeypatch.setattr(DelayedProvider, "complete", complete)
    monkeypatch.setattr(attempt, "commit_step", commit_step)
    rc = run(RunOptions(workspace, "minimoe", units=OPS + [RUNTIME], quiet=True, jobs=3,
                        provider={"provider": "scripted", "answer_delay_s": 1.0}))
    assert rc == 0
    runtime_landed = events.index(next(e for e in events if e[:2] == ("commit", RUNTIME)))
    for op in OPS:
        assert events.index(("ask", op, 1)) < runtime_landed, events
    asks = [e for e in events if e[0] == "ask"]
    assert len(asks) == len(set(asks)), "an answer was asked for twice"
    for u in OPS + [RUNTIME]:
        assert_consistent(workspace, u, porter_cli)
    recs = Ledger(workspace).records()
    runtime_done = max(i for i, x in enumerate(recs) if x.get("unit") == RUNTIME and x["kind"] == "step")
    first_op = min(i for i, x in enumerate(recs) if x.get("unit") in OPS and x["kind"] == "attempt")
    assert runtime_done < first_op
