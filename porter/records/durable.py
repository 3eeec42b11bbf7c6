"""Crash-safe file writes (a SIGKILL leaves the old file or the new one, never half of one) and bounded
reads of files a candidate or a forger may have replaced with a link, a device or a huge file."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in `directory` survive a power cut."""
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write via a temp file in the same folder, fsync it, rename it over `path`, fsync the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")  # threads of --jobs N
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path` when it is a regular file (not a symlink) of at most `limit` bytes; an
    OSError naming what it is otherwise (FileNotFoundError when absent)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.errno, "not a regular file (a symlink)") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a device, fifo or directory)")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, over the {limit} bytes allowed")
        chunks, left = [], limit + 1
        want = st.st_size + 1  # one read for a file that does not grow meanwhile (status reads thousands)
        while left > 0:
            b = os.read(fd, min(left, want))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
            want = 1 << 20
        if left <= 0:
            raise OSError(errno.EFBIG, f"grew over the {limit} bytes allowed while read")
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)
