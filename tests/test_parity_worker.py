"""The pre-started parity workers keep the fresh child's isolation (host mode, no GPU needed).

A crash, a hang or an abort by one candidate is recorded as that candidate's
failure; every plan runs in its own sandboxed process, so no state of one
candidate survives into the next.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time

import pytest

from porter.gates.parity import pool, runner

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc)")

TINY_C = r"""
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int ok(void) { return 7; }
int counter(void) { static int n; return ++n; }
int hang(void) { for (volatile int spin = 1; spin;) {} return 0; }
int segv(void) { volatile int *p = (int *)0; return *p; }
int die(void) { abort(); }
int early_done(void) {  /* says "done" on every descriptor before any result exists */
    static const char line[] = "{\"done\": 0}\n";
    for (int fd = 3; fd < 256; fd++) write(fd, line, sizeof line - 1);
    sleep(2);
    return 7;
}
static void *plant(void *arg) {
    (void)arg;
    for (;;) { unlink("planted"); symlink("/etc/hostname", "planted"); }
    return 0;
}
int planter(void) {  /* a thread that keeps planting a link in the plan folder after the plan is done */
    pthread_t t;
    pthread_create(&t, 0, plant, 0);
    usleep(20000);
    return 7;
}
"""


@pytest.fixture(scope="module")
def tiny_lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    (d / "tiny.c").write_text(TINY_C)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(d / "libtiny.so"), str(d / "tiny.c"), "-lpthread"], check=True)
    return d / "libtiny.so"


def _plan(tmp_path, lib, symbol, i):
    d = tmp_path / f"job{i}-{symbol}"
    d.mkdir()
    (d / "plan.json").write_text(json.dumps({"mode": "call", "library": str(lib), "symbol": symbol}))
    return d


def test_bad_candidates_between_good_ones_are_recorded_and_replaced(tmp_path, tiny_lib):
    p = pool.WarmPool("host", 1)
    try:
        seq = ["ok", "ok", "segv", "ok", "hang", "ok", "die", "ok"]
        want = {"ok": ("done", "completed"), "segv": ("crash", "SIGSEGV"), "hang": ("timeout", "no result after"),
                "die": ("crash", "SIGABRT")}
        seen = []
        for i, sym in enumerate(seq):
            t0 = time.monotonic()
            o = p.run(_plan(tmp_path, tiny_lib, sym, i), timeout=3)
            seen.append((sym, o.status, o.detail, time.monotonic() - t0))
            status, detail = want[sym]
            assert o.status == status, (sym, o)
            assert detail in o.detail, (sym, o.detail)
            if sym == "ok":
                assert o.results["rc"] == 7
            else:
                assert "step 'call'" in o.detail  # the progress file still names where it died
        assert p.started == len(seq) + 1  # one process per plan, good or bad, and the spare for the next
    finally:
        p.close()


def test_no_static_state_survives_from_one_plan_to_the_next(tmp_path, tiny_lib):
    p = pool.WarmPool("host", 1)
    try:
        rcs = [p.run(_plan(tmp_path, tiny_lib, "counter", i), timeout=10).results["rc"] for i in range(3)]
        assert rcs == [1, 1, 1]  # a static counter starts from zero every time: a new process each plan
    finally:
        p.close()


def test_spawn_and_warm_agree(tmp_path, tiny_lib):
    p = pool.WarmPool("host", 1)
    try:
        for i, sym in enumerate(["ok", "segv"]):
            a = runner.run_child(_plan(tmp_path, tiny_lib, sym, 10 + i), timeout=5)
            b = p.run(_plan(tmp_path, tiny_lib, sym, 20 + i), timeout=5)
            assert (a.status, a.returncode) == (b.status, b.returncode)
    finally:
        p.close()


def test_a_worker_that_cannot_start_falls_back_to_a_fresh_child(tmp_path, tiny_lib, monkeypatch):
    p = pool.WarmPool("no-such-mode", 1)
    try:
        o = p.run(_plan(tmp_path, tiny_lib, "ok", 0), timeout=10)
        assert o.status == "done" and "warm worker unavailable" in o.detail
    finally:
        p.close()


def test_worker_exits_when_its_parent_is_killed(tmp_path, tiny_lib):
    """kill -9 of porter must not leave a worker behind (bwrap --die-with-parent)."""
    code = ("import sys, time, tempfile; sys.path.insert(0, %r); from porter.gates.parity import pool;"
            "w = pool.Standby('host', None, tempfile.mkdtemp(), []); assert w.ready(); print(w.proc.pid, flush=True);"
            "time.sleep(60)")
    import os
    import signal

    root = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    parent = subprocess.Popen(["python3", "-c", code % root], stdout=subprocess.PIPE, text=True)
    wpid = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    for _ in range(40):
        try:
            os.kill(wpid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.25)
    else:
        os.kill(wpid, signal.SIGKILL)
        pytest.fail("the warm worker outlived its parent")


def test_a_spare_outlives_the_thread_whose_plan_started_it(tmp_path, tiny_lib):
    """--jobs N runs units in threads that end with their unit: the spare started after one thread's plan
    serves another thread's plan.  --die-with-parent is a thread's death signal (PR_SET_PDEATHSIG), so a
    spare started by the short-lived thread died of SIGKILL before its next plan (calibrate --jobs 3)."""
    import threading

    p = pool.WarmPool("host", 1)
    try:
        def first_unit():
            p.run(_plan(tmp_path, tiny_lib, "ok", 0), timeout=10)
            assert p.spares[0].ready()  # the unit's thread goes on working while the spare warms up

        first = threading.Thread(target=first_unit)
        first.start()
        first.join()  # the thread that started the spare is gone
        time.sleep(0.5)
        o = p.run(_plan(tmp_path, tiny_lib, "ok", 1), timeout=10)
        assert o.status == "done", o.detail
        assert "warm worker unavailable" not in o.detail  # the spare served it, no fallback hid its death
        assert o.results["rc"] == 7
    finally:
        p.close()


def test_a_done_line_from_the_candidate_only_ends_its_own_plan_early(tmp_path, tiny_lib):
    """The reply channel is open while the candidate runs (the worker's "done" line travels on it): a
    forged line makes the parent look at the files at once, where no result is yet."""
    p = pool.WarmPool("host", 1)
    try:
        o = p.run(_plan(tmp_path, tiny_lib, "early_done", 0), timeout=10)
        assert o.status != "done" and o.results is None or o.results.get("rc") != 7, o
        good = p.run(_plan(tmp_path, tiny_lib, "ok", 1), timeout=10)
        assert good.status == "done" and good.results["rc"] == 7
    finally:
        p.close()


def test_nothing_of_the_sandbox_runs_once_the_verdict_is_back(tmp_path, tiny_lib):
    """After "done" the sandbox is killed, not waited for: the parent moves the folder back and scrubs it only
    once every task in the sandbox's pid namespace has stopped, so a thread planting links loses the race."""
    p = pool.WarmPool("host", 1)
    try:
        plan = _plan(tmp_path, tiny_lib, "planter", 0)
        o = p.run(plan, timeout=10)
        assert o.status == "done" and o.results["rc"] == 7, o
        time.sleep(0.3)
        assert not (plan / "planted").is_symlink()
    finally:
        p.close()


def test_a_partial_reply_line_does_not_hang_the_parent(tmp_path):
    r, w = os.pipe()
    os.write(w, b'{"done": 0')  # no newline, the writer stays open: only the deadline ends the wait
    got = []
    with os.fdopen(r, "rb", buffering=0) as stream:
        reader = threading.Thread(target=lambda: got.append(pool._done_line(stream, time.monotonic() + 0.5)))
        reader.start()
        reader.join(60)  # a hang guard, not a speed figure: the deadline is 0.5 s
        assert not reader.is_alive(), "a partial line held the parent past its deadline"
    assert got == [None]
    os.close(w)
    for line, want in [(b'{"done": 3}\n', 3), (b'{"done": "0"}\n', None), (b'[1]\n', None), (b"", None)]:
        r, w = os.pipe()
        os.write(w, line)
        os.close(w)
        with os.fdopen(r, "rb", buffering=0) as stream:
            assert pool._done_line(stream, time.monotonic() + 1) == want, line
