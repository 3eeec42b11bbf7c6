"""The verdict is the checker's: a candidate that rewrites the process it was loaded into gains nothing.

Each candidate here is the host stand-in's swiglu with one flaw, plus a
constructor that does what an attacker who has read porter's code would do
from inside the parity runner: it runs Python in the runner's interpreter
(PyRun_SimpleString, found with dlsym) and patches the runner's checks away --
the guard comparison, the const-input comparison, the timer, the saving of
outputs, the calls themselves.  Before the checker process existed each of
these passed or was "skipped"; now each is refused by the check named for it,
because the outputs, guards, const inputs and the wall time of every timed
call are read by a process that never loads the candidate.  Host mode: no GPU
needed; tests/test_hostile_gpu.py runs the CUDA side.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from porter.gates.parity import merge, runner
from porter.gates.parity.gate import run_spec
from porter.spec import load_spec

from tests.test_parity_compare import FAKE_BACKEND, fixture_ctx, target  # noqa: F401  (fixtures)

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc)")
UNIT = "mini_gpu_swiglu_tensor"

# Python run inside the runner by the candidate's constructor: patch every module object the runner has
_EACH = "import sys\nfor m in list(sys.modules.values()):\n"
PATCHES = {
    # the old in-process guard check, and any byte comparison, told to see nothing
    "hide_guards": _EACH + "    if hasattr(m, 'Fenced'): m.Fenced.guard_damage = lambda self: []\n"
                           "    if hasattr(m, 'byte_diff'): m.byte_diff = lambda a, b: (0, None)\n",
    "hide_const": _EACH + "    if hasattr(m, 'byte_diff'): m.byte_diff = lambda a, b: (0, None)\n",
    # a slow unit whose timer reports a microsecond, whatever clock the runner uses
    "forge_time": _EACH + "    for c in (getattr(m, 'Device', None), getattr(m, 'HostDevice', None), "
                          "getattr(m, 'CudaDevice', None)):\n"
                          "        if c is not None and hasattr(c, 'time_one'):\n"
                          "            c.time_one = lambda self, call, stream: (call(), 0.001)[1]\n"
                          "            c.time_call = lambda self, call, stream, after_end=None: "
                          "(call(), after_end and after_end(), (0.001, 0.0))[2]\n",
    # every outputs file the runner writes is junk (a parent that parses it and raises used to skip)
    "junk_outputs": "import numpy\n"
                    "def junk(path, **kw):\n"
                    "    open(path if str(path).endswith('.npz') else str(path) + '.npz', 'wb').write(b'PK junk')\n"
                    "numpy.savez = junk\n",
    # no call is made: the runner just says it completed
    "skip_calls": _EACH + "    if hasattr(m, 'OpCalls'):\n"
                          "        m.OpCalls.run_case = lambda self, case, arrays: self.results['cases'].append("
                          "{'id': case['id'], 'passes': [{'pass': i, 'rc': 0} for i in range(len(case['passes']))]})\n"
                          "        m.OpCalls.finish = lambda self: None\n",
}

CONSTRUCTOR = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
__attribute__((constructor)) static void porter_attack(void) {
    int (*ensure)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    void (*release)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "PyGILState_Release");
    int (*run)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    if (!ensure || !release || !run) return;
    int g = ensure(); run(PORTER_PATCH); release(g);
}
"""
SLOW = "#define _POSIX_C_SOURCE 199309L\n#include <time.h>\n"
SLEEP = "{ struct timespec ts = {0, 20000000}; nanosleep(&ts, 0); }\n        for (uint64_t i = 0; i < n; i++)"

# name: (FAKE_BACKEND hack flag, patch, slow kernel, the check that must refuse it)
CANDIDATES = {
    "overrun_hiding_guards": ("OVERRUN", "hide_guards", False, "guard"),
    "underrun_hiding_guards": ("UNDERRUN", "hide_guards", False, "guard"),
    "const_write_hidden": ("CONST", "hide_const", False, "const"),
    "slow_with_forged_timer": (None, "forge_time", True, "timing"),
    "noop_with_junk_outputs": ("UNTOUCHED", "junk_outputs", False, "sentinel"),
    "no_calls_said_complete": (None, "skip_calls", False, "crash"),
    "honest_with_a_harmless_patch": (None, "junk_outputs", False, None),  # control: outputs come from the checker
}


def _c_string(py: str) -> str:
    return json.dumps(py)  # a JSON string is a valid C string literal for this ASCII text


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("attacks")
    out = {}
    for name, (hack, patch, slow, _) in CANDIDATES.items():
        src = FAKE_BACKEND
        if slow:
            src = SLOW + src.replace("for (uint64_t i = 0; i < n; i++) o[i] = g[i]", SLEEP + " o[i] = g[i]", 1)
            assert src.count("nanosleep") == 1
        src = f"#define PORTER_PATCH {_c_string(PATCHES[patch])}\n" + CONSTRUCTOR + src
        (d / f"{name}.c").write_text(src)
        flags = [f"-DHACK_{hack}"] if hack else []
        subprocess.run([CC, "-O1", "-shared", "-fPIC", *flags, "-o", str(d / f"lib{name}.so"), str(d / f"{name}.c"),
                        "-lm", "-ldl"], check=True)
        out[name] = d / f"lib{name}.so"
    return out


@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_a_patched_runner_does_not_change_the_verdict(target, fixture_ctx, libs, tmp_path, name):
    check = CANDIDATES[name][3]
    r = run_spec(target, load_spec(target, UNIT), libs[name], workspace=tmp_path, mode="host", ctx=fixture_ctx,
                 timing_reps=4)
    assert not r.skipped, r.summary  # candidate code ran: never a skip
    if check is None:
        assert r.ok, r.summary + "\n" + r.diagnostics
    else:
        assert not r.ok and check in r.metrics["failed_checks"], (check, r.summary)
    if check == "timing":
        assert "not believed" in r.diagnostics, r.diagnostics


def test_a_forged_checker_record_in_the_plan_folder_is_replaced(tmp_path):
    """The runner can write its plan folder, including a folder named like the checker's: the parent puts
    the checker's own files there once the runner is gone, replacing whatever the runner left."""
    plan = tmp_path / "plan"
    (plan / runner.CHECKER_DIR).mkdir(parents=True)
    (plan / runner.CHECKER_DIR / "checker.json").write_text(json.dumps({"cases": [], "complete": True}))
    chk = runner.CheckerProc("host", tmp_path, [str(plan)])
    (chk.out / "checker.json").write_text(json.dumps({"cases": [], "complete": False, "violation": "x"}))
    chk.adopt(plan)
    chk.discard()
    assert runner.read_checker(plan)["complete"] is False


def test_event_times_are_believed_only_within_the_checkers_bound():
    walls = [1.1, 1.2, 1.15, 1.1]
    assert merge.gap_failures([1.0, 1.1, 1.05, 1.0], walls, 4, 0.5) == []
    # claimed far below what the checker measured around each call
    assert "not believed" in merge.gap_failures([0.001] * 4, walls, 4, 0.5)[0]
    # longer than the window it happened in, missing, or not a number
    assert "longer than" in merge.gap_failures([2.0, 1.1, 1.05, 1.0], walls, 4, 0.5)[0]
    assert "of 4 timed calls" in merge.gap_failures([1.0] * 3, walls[:3], 4, 0.5)[0]
    assert "not a duration" in merge.gap_failures([None, 1.1, 1.05, 1.0], walls, 4, 0.5)[0]


def test_a_long_calls_bound_grows_by_a_share_of_its_claimed_time_only():
    # measured: 106.3 ms by the events, 106.807 ms from outside, on a host busy with builds
    assert merge.gap_failures([106.3] * 4, [106.807] * 4, 4, 0.5) == []
    # work hidden outside the events beyond 1% of the call is still caught
    assert "not believed" in merge.gap_failures([106.3] * 4, [106.3 * 1.02 + 0.5] * 4, 4, 0.5)[0]
    # the share is of what the candidate claims: claiming less buys no room
    assert "not believed" in merge.gap_failures([0.2] * 4, [1.0] * 4, 4, 0.5)[0]
    assert merge.gap_failures([0.2] * 4, [0.69] * 4, 4, 0.5) == []
