"""The per-sandbox cgroup (porter.host.cgroup_bound) on a hierarchy laid out in a folder: what it writes, when
it declines, and the shim that joins it before the sandbox's first instruction.  The bound itself is
shown on a real cgroup v2 host by tests/test_sandbox_root.py."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from porter.host import cgroup_bound


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids io\n")
    (tmp_path / "cgroup.subtree_control").write_text("\n")
    (tmp_path / cgroup_bound.PARENT).mkdir()
    (tmp_path / cgroup_bound.PARENT / "cgroup.subtree_control").write_text("\n")
    monkeypatch.setattr(cgroup_bound, "ROOT", tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    cgroup_bound.usable.cache_clear()
    yield tmp_path
    cgroup_bound.usable.cache_clear()


def test_a_job_gets_its_memory_and_process_bounds_before_it_runs(fake_root):
    assert cgroup_bound.usable() == (True, "cgroup v2")
    assert "+memory +pids" in (fake_root / "cgroup.subtree_control").read_text()
    cg = cgroup_bound.job(256 << 20, 64)
    assert (cg / "memory.max").read_text() == str(256 << 20)
    assert (cg / "memory.swap.max").read_text() == "0" and (cg / "pids.max").read_text() == "64"


def test_the_shim_writes_its_own_pid_then_becomes_the_command(tmp_path):
    procs = tmp_path / "cgroup.procs"
    shim = cgroup_bound.prefix(tmp_path)
    r = subprocess.run([*shim, "/bin/sh", "-c", "echo $$"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and procs.read_text().strip() == r.stdout.strip()  # exec: the same process
    # a cgroup it cannot join: the command never runs
    r = subprocess.run([*cgroup_bound.prefix(tmp_path / "gone"), "/bin/echo", "RAN"], capture_output=True, text=True)
    assert r.returncode != 0 and "RAN" not in r.stdout


@pytest.mark.parametrize("layout, why", [
    ("v1", "no cgroup v2"),
    ("no_memory", "does not offer the memory and pids controllers"),
])
def test_it_declines_with_the_reason(tmp_path, monkeypatch, layout, why):
    if layout == "no_memory":
        (tmp_path / "cgroup.controllers").write_text("cpu io\n")
    monkeypatch.setattr(cgroup_bound, "ROOT", tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    cgroup_bound.usable.cache_clear()
    try:
        ok, reason = cgroup_bound.usable()
        assert not ok and why in reason
        assert cgroup_bound.job(1 << 30, 64) is None
    finally:
        cgroup_bound.usable.cache_clear()


def test_not_root_keeps_the_rlimits(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    cgroup_bound.usable.cache_clear()
    try:
        assert cgroup_bound.usable() == (False, "porter is not root (the sandbox's rlimits bind its uid)")
    finally:
        cgroup_bound.usable.cache_clear()


def test_a_cgroup_made_a_moment_ago_is_not_reaped_before_its_sandbox_joins(fake_root):
    """On an H200 as root, one --jobs thread reaped the empty cgroup another had just made, and that
    sandbox's shim found no cgroup.procs: every gate failed.  Only cgroups older than REAP_AFTER_S go."""
    first = cgroup_bound.job(1 << 30, 64)
    for f in first.iterdir():
        f.unlink()  # empty, as a real one is until its shim joins
    cgroup_bound.job(1 << 30, 64)
    assert first.is_dir()
    old = time.time() - cgroup_bound.REAP_AFTER_S - 5
    os.utime(first, (old, old))
    cgroup_bound.job(1 << 30, 64)
    assert not first.exists()
