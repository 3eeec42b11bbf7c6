"""One `porter run` per workspace at a time: runs/porter.records.lock, held with flock.

The kernel drops the lock when the holder exits, however it exits (SIGKILL
included), so a crashed run never leaves a stale lock behind.  A second run
finds the lock held, prints who holds it and exits 0: a cron job that starts
while the previous one is still going is not an error.

    with RunLock(workspace) as held:   # False: another run holds it (its pid: .holder())
    RunLock(workspace).held_elsewhere()  # a run is active (status: its unit "in progress"), lock not taken
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "porter.records.lock"


class RunLock:
    def __init__(self, workspace: Path):
        self.path = Path(workspace) / "runs" / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> bool:
        """True when this process now holds the lock; False when another one does."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    def holder(self) -> int | None:
        """The pid written by the process holding the lock (None when unreadable)."""
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def held_elsewhere(self) -> bool:
        """Whether another process holds the lock now (a run is active), seen in /proc/locks without
        taking the lock: a status taking it even for a moment could turn a run starting then away.
        False where /proc/locks cannot be read (not Linux)."""
        try:
            st = os.stat(self.path)
            with open("/proc/locks") as f:
                table = f.read()
        except OSError:
            return False
        inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        for line in table.splitlines():
            fields = line.split()
            # "1: FLOCK  ADVISORY  WRITE 14309 fe:00:2147156 0 EOF"; a waiter's line has "->" after the number
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode and fields[4] != str(os.getpid()):
                return True
        return False

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
