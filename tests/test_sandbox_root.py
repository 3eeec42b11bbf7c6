"""porter run as root (CI, GPU hosts, containers) never hands a sandbox host root.

Before: bwrap started by root maps the sandbox's uid 0 to host uid 0, and /proc/sys inside is the
host's, writable: a candidate set kernel.core_pattern to a pipe into its own script and crashed, and
the kernel ran the script as host root outside every namespace.  These tests write only the value a
sysctl already holds, so the host is never changed even where a write would go through.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from porter.host import sandbox

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="porter is not root here: nothing to drop"),
              pytest.mark.skipif(not sandbox.available()[0], reason=f"no sandbox: {sandbox.available()[1]}")]


def _inside(script: str, tmp_path, **kw) -> subprocess.CompletedProcess:
    work = tmp_path / "work"  # tmp_path itself holds the test's $PORTER_HOME, which no sandbox may see
    work.mkdir(exist_ok=True)
    w = sandbox.wrap(["/bin/sh", "-c", script], rw=[str(work)], python=False, **kw)
    return subprocess.run(w.argv, env=w.env, capture_output=True, text=True, timeout=60, cwd=work)


def test_a_sysctl_write_is_refused_inside(tmp_path):
    p = _inside('v=$(cat /proc/sys/kernel/core_pattern); echo "$v" > /proc/sys/kernel/core_pattern '
                '&& echo WROTE || echo REFUSED', tmp_path)
    assert "REFUSED" in p.stdout and "WROTE" not in p.stdout, p.stdout + p.stderr


def test_the_sandbox_runs_as_an_unprivileged_host_uid(tmp_path):
    p = _inside("id -u; cat /proc/self/uid_map; touch made_inside", tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split()
    assert lines[0] != "0" or lines[2] != "0", p.stdout  # inside uid 0 must not map to host uid 0
    owner = os.stat(tmp_path / "work" / "made_inside").st_uid
    assert owner != 0 and owner == sandbox.sandbox_ids()[0]


def test_sys_is_not_shown_whole_and_no_user_namespace_is_made_inside(tmp_path):
    p = _inside("ls /sys/kernel >/dev/null 2>&1 && echo SYS_KERNEL; ls /sys/fs/cgroup >/dev/null 2>&1 "
                "&& echo CGROUPS; unshare -U true 2>/dev/null && echo USERNS; echo done", tmp_path, gpu=True)
    assert "done" in p.stdout, p.stderr
    assert "SYS_KERNEL" not in p.stdout and "CGROUPS" not in p.stdout and "USERNS" not in p.stdout, p.stdout


def test_the_process_bound_holds_for_the_sandbox_uid(tmp_path):
    # root is exempt from RLIMIT_NPROC; the sandbox uid is not: a fork loop stops at the bound
    p = _inside("n=0; while [ $n -lt 200 ]; do sleep 5 & n=$((n+1)); done 2>/dev/null; echo started $n",
                tmp_path, limits=sandbox.Limits(processes=64))
    assert "started 200" not in p.stdout, p.stdout + p.stderr


def test_the_memory_bound_holds_where_the_host_has_cgroup_v2(tmp_path):
    """Rlimits cannot bound a GPU process's memory (CUDA reserves terabytes of address space), so as root
    on cgroup v2 each sandbox is its own cgroup: a candidate's allocation past memory.max ends it."""
    from porter.host import cgroup_bound

    ok, why = cgroup_bound.usable()
    if not ok:
        pytest.skip(f"no cgroup bound here: {why}")
    work = tmp_path / "work"
    work.mkdir()
    run = []
    for mib in (16, 512):
        w = sandbox.wrap([sandbox.sys.executable, "-c", f"b = bytearray({mib} << 20); b[::4096] = b'x' * len(b[::4096]); print('HELD')"],
                         rw=[str(work)], limits=sandbox.Limits(memory=128 << 20))
        assert w.cgroup and (cgroup_bound.ROOT / cgroup_bound.PARENT) in __import__("pathlib").Path(w.cgroup).parents
        run.append(subprocess.run(w.argv, env=w.env, capture_output=True, text=True, timeout=60, cwd=work))
    assert "HELD" in run[0].stdout, run[0].stderr
    assert "HELD" not in run[1].stdout and run[1].returncode != 0, run[1].stdout
