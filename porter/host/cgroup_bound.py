"""A memory and process bound per sandbox that holds on a GPU: a cgroup v2 of its own.

Rlimits cannot bound a GPU process's memory (RLIMIT_AS and RLIMIT_DATA count the
terabytes of address space CUDA reserves), and the sandbox's /tmp and /dev/shm
bound only what is written there: a candidate's malloc loop took 2 GiB of host
memory.  Where porter runs as root on a host with cgroup v2 (CI, GPU hosts,
containers that mount the hierarchy writable), every sandbox starts in a cgroup
of its own under /sys/fs/cgroup/porter-sandboxes with memory.max (swap off) and
pids.max set before any of its code runs: a shim writes its own pid into the
cgroup and then execs the sandbox, so everything the sandbox starts is inside.
The kernel's OOM killer ends the sandbox, not the host.

Where that cannot be had (not root, cgroup v1, the controllers not delegated to
us), usable() says why and the sandbox keeps its rlimits: RLIMIT_NPROC for the
sandbox uid, RLIMIT_DATA for compiles; a GPU process then has no memory bound
but its tmpfs sizes, which docs/security.md states.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from pathlib import Path

ROOT = Path(os.environ.get("PORTER_CGROUP_ROOT", "/sys/fs/cgroup"))
PARENT = "porter-sandboxes"
SHELL = "/bin/sh"
_SEQ = itertools.count()


def default_memory() -> int:
    """Half of this machine's memory: a sandbox may use a lot (ds4's real-size inputs), never all."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 16 << 30


@functools.lru_cache(maxsize=1)
def usable() -> tuple[bool, str]:
    """(True, "cgroup v2") when sandboxes get their own cgroup here; else (False, why not)."""
    if os.environ.get("PORTER_CGROUP", "") in ("0", "off"):
        return False, "turned off by PORTER_CGROUP=off"
    if os.geteuid() != 0:
        return False, "porter is not root (the sandbox's rlimits bind its uid)"
    controllers = ROOT / "cgroup.controllers"
    if not controllers.is_file():
        return False, f"no cgroup v2 hierarchy at {ROOT}"
    have = set(controllers.read_text().split())
    if not {"memory", "pids"} <= have:
        return False, f"{ROOT} does not offer the memory and pids controllers ({' '.join(sorted(have)) or 'none'})"
    parent = ROOT / PARENT
    try:
        _enable(ROOT)
        parent.mkdir(exist_ok=True)
        _enable(parent)
    except OSError as exc:
        return False, f"cannot make {parent} with the memory and pids controllers ({exc.strerror or exc})"
    return True, "cgroup v2"


def _enable(cg: Path) -> None:
    ctl = cg / "cgroup.subtree_control"
    if not {"memory", "pids"} <= set(ctl.read_text().split()):
        ctl.write_text("+memory +pids")


REAP_AFTER_S = 300.0


def _reap(parent: Path) -> None:
    """Remove the cgroups of sandboxes that ended: empty, and made long enough ago that the sandbox it
    was made for has joined it (a cgroup made a moment ago by another thread or porter is empty too,
    until its shim runs; rmdir fails on one that still has processes)."""
    now = time.time()
    for d in parent.glob("job-*"):
        try:
            if now - d.stat().st_mtime > REAP_AFTER_S:
                d.rmdir()
        except OSError:
            continue


def job(memory: int, processes: int | None) -> Path | None:
    """A new cgroup bounding one sandbox, or None where usable() says no."""
    if not usable()[0]:
        return None
    parent = ROOT / PARENT
    _reap(parent)
    d = parent / f"job-{os.getpid()}-{next(_SEQ)}"
    d.mkdir()
    (d / "memory.max").write_text(str(int(memory)))
    try:
        (d / "memory.swap.max").write_text("0")  # no swap to spill into: the bound is the bound
    except OSError:
        pass  # a kernel without swap accounting
    if processes is not None:
        (d / "pids.max").write_text(str(int(processes)))
    return d


def prefix(cg: Path) -> list[str]:
    """The shim in front of the sandbox: it joins `cg` (porter's side, still root), then becomes it."""
    return [SHELL, "-c", 'echo $$ > "$0" && exec "$@"', str(cg / "cgroup.procs")]
