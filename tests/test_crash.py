"""SIGKILL `porter run` after each durable write; the next run repairs, goes on and finishes.

PORTER_TEST_KILL_AT=<point>[:<n>] makes the loop kill itself right after the
n-th write named <point> (porter.run.kill.KILL_POINTS).  After every kill the next
run must leave: an intact ledger chain, no step lost or committed twice, every
attempt with a verdict or an explicit "reconcile" record, a clean work tree,
the unit built, and `porter status` reporting nothing tampered.
"""

from __future__ import annotations

import json
import shutil
import signal

import pytest

from porter.records import gitops
from porter.records.ledger import Ledger
from porter.run.kill import KILL_POINTS

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None,
                                reason="nvcc not on PATH: porter run needs the CUDA toolkit for the build gate")

GOOD_ONLY = "mini_gpu_add_tensor"  # one scripted answer: good
BAD_FIRST = "mini_gpu_swiglu_tensor"  # prose-only answer, then the good one


def kill_run(porter_cli, ws, point: str, *args: str):
    r = porter_cli(ws, "run", *args, env={"PORTER_TEST_KILL_AT": point})
    assert r.returncode == -signal.SIGKILL, f"not killed at {point}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def finish_run(porter_cli, ws, *args: str):
    r = porter_cli(ws, "run", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def assert_consistent(ws, unit: str, porter_cli) -> None:
    ledger = Ledger(ws)
    integrity = ledger.verify()
    assert integrity.ok, integrity.problems
    records = ledger.records()
    mine = [r for r in records if r.get("unit") == unit]

    # every attempt has a verdict or was explicitly abandoned
    concluded = {r["attempt"] for r in mine if r["kind"] in ("failure", "step")}
    abandoned = {r["attempt"] for r in mine if r["kind"] == "reconcile" and r["action"].startswith("abandon")}
    for a in (r for r in mine if r["kind"] == "attempt"):
        assert a["attempt"] in concluded | abandoned, f"attempt {a['attempt']} left without a verdict"

    # no step lost or doubled: each step is committed exactly once or abandoned
    dropped = {r["step"] for r in mine if r["kind"] == "reconcile" and r["action"] == "abandon-step"}
    steps = [r for r in mine if r["kind"] == "step"]
    live = [s for s in steps if s["hash"] not in dropped]
    assert len(live) == 1, f"{len(live)} live steps for {unit}"
    for s in steps:
        commits = gitops.commits_with_trailer(ws, "Porter-Step", s["hash"])
        assert len(commits) == (0 if s["hash"] in dropped else 1), f"step {s['hash'][:12]} committed {len(commits)} times"
    all_steps = gitops.git(ws, "log", "--format=%(trailers:key=Porter-Step,valueonly)").split()
    assert len(all_steps) == len(set(all_steps)), "a step was committed twice"
    unit_commits = gitops.git(ws, "log", "--format=%H", f"--grep=^Porter-Unit: {unit}$").split()
    assert len(unit_commits) == 1

    # the work tree is what the ledger says
    assert gitops.git(ws, "status", "--porcelain", "--", "targets", "ledger").strip() == ""
    import hashlib

    assert hashlib.sha256((ws / live[0]["unit_file"]).read_bytes()).hexdigest() == live[0]["candidate_sha256"]

    st = porter_cli(ws, "status", "--json")
    if "not available" not in st.stderr:
        data = json.loads(st.stdout)
        states = {u["unit"]: u["state"] for u in data["units"]}
        assert "tampered" not in states.values(), data.get("problems")
        assert states[unit].split(" (")[0] in ("built", "verified")  # "verified (perf unmeasured)" too


GOOD_ONLY_POINTS = ["after-attempt", "after-evidence", "after-gate", "after-gate:3", "after-unit-file",
                    "after-step", "after-commit"]


@pytest.mark.parametrize("point", GOOD_ONLY_POINTS)
def test_kill_during_a_passing_attempt(workspace, build_cache, porter_cli, point):
    kill_run(porter_cli, workspace, point, "--unit", GOOD_ONLY)
    r = finish_run(porter_cli, workspace, "--unit", GOOD_ONLY)
    assert_consistent(workspace, GOOD_ONLY, porter_cli)
    records = Ledger(workspace).records()
    if point in ("after-step",):
        assert "reconcile: committed the interrupted step" in r.stdout
        assert len([x for x in records if x["kind"] == "attempt"]) == 1
    elif point == "after-commit":
        assert not [x for x in records if x["kind"] == "reconcile"]
    else:
        # the attempt was abandoned explicitly and the same answer replayed
        rec = [x for x in records if x["kind"] == "reconcile" and x["action"] == "abandon-attempt"]
        assert [x["attempt"] for x in rec] == [1]
        attempts = [x for x in records if x["kind"] == "attempt"]
        assert [a["model"] for a in attempts] == [attempts[0]["model"]] * 2
    if point == "after-unit-file":
        assert any(x["kind"] == "reconcile" and x["action"] == "restore-file" for x in records)


def test_kill_after_a_failure_record(workspace, build_cache, porter_cli):
    kill_run(porter_cli, workspace, "after-failure", "--unit", BAD_FIRST, "--max-attempts", "2")
    finish_run(porter_cli, workspace, "--unit", BAD_FIRST, "--max-attempts", "2")
    assert_consistent(workspace, BAD_FIRST, porter_cli)
    kinds = [(r["kind"], r.get("attempt")) for r in Ledger(workspace).records() if r.get("unit") == BAD_FIRST]
    assert ("failure", 1) in kinds and ("step", 2) in kinds
    assert not [k for k in kinds if k[0] == "reconcile"]  # a concluded attempt needs no repair


def test_kill_after_the_exhausted_record(workspace, build_cache, porter_cli):
    kill_run(porter_cli, workspace, "after-exhausted", "--unit", BAD_FIRST, "--max-attempts", "1")
    finish_run(porter_cli, workspace, "--unit", BAD_FIRST, "--max-attempts", "1")
    assert_consistent(workspace, BAD_FIRST, porter_cli)


def test_kill_during_recovery_itself(workspace, build_cache, porter_cli):
    kill_run(porter_cli, workspace, "after-unit-file", "--unit", GOOD_ONLY)
    kill_run(porter_cli, workspace, "after-reconcile", "--unit", GOOD_ONLY)  # killed mid-reconcile
    kill_run(porter_cli, workspace, "after-step", "--unit", GOOD_ONLY)
    kill_run(porter_cli, workspace, "after-reconcile", "--unit", GOOD_ONLY)  # killed right after committing the step
    finish_run(porter_cli, workspace, "--unit", GOOD_ONLY)
    assert_consistent(workspace, GOOD_ONLY, porter_cli)


def test_torn_ledger_line_is_repaired(workspace, build_cache, porter_cli):
    kill_run(porter_cli, workspace, "after-attempt", "--unit", GOOD_ONLY)
    with open(workspace / "ledger" / "ledger.jsonl", "ab") as f:
        f.write(b'{"kind":"gate","seq":')  # a write cut short by the kill
    r = finish_run(porter_cli, workspace, "--unit", GOOD_ONLY)
    assert "torn" in r.stdout
    assert_consistent(workspace, GOOD_ONLY, porter_cli)
    assert any(x["kind"] == "repair" for x in Ledger(workspace).records())


def test_every_kill_point_is_exercised():
    covered = {p.split(":")[0] for p in GOOD_ONLY_POINTS} | {"after-failure", "after-exhausted", "after-reconcile"}
    assert covered == set(KILL_POINTS)


def test_a_second_concurrent_run_exits_zero(workspace, porter_cli):
    from porter.records.lock import RunLock

    lock = RunLock(workspace)
    assert lock.acquire()
    try:
        before = Ledger(workspace).read_bytes()
        r = porter_cli(workspace, "run", "--unit", GOOD_ONLY)
        assert r.returncode == 0
        import os

        assert f"another porter run is active (pid {os.getpid()})" in r.stdout
        assert Ledger(workspace).read_bytes() == before
    finally:
        lock.release()
