"""Kill points: PORTER_TEST_KILL_AT=<point>[:<n>] SIGKILLs `porter run` right after the n-th durable
write named <point>, for the crash tests of each row of porter.run's table of what a kill leaves."""

from __future__ import annotations

import os
import signal

KILL_POINTS = (
    "after-attempt", "after-evidence", "after-gate", "after-failure", "after-exhausted",
    "after-unit-file", "after-step", "after-commit", "after-reconcile",
)
_kill_counts: dict[str, int] = {}


def kill_point(name: str) -> None:
    """Test hook: SIGKILL this process at the named point when PORTER_TEST_KILL_AT says so."""
    want = os.environ.get("PORTER_TEST_KILL_AT")
    if not want:
        return
    point, _, nth = want.partition(":")
    if point != name:
        return
    _kill_counts[name] = _kill_counts.get(name, 0) + 1
    if _kill_counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
