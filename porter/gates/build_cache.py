"""The build cache's bounds: what one object may weigh, and how much the cache may hold.

A candidate decides what its compile writes: one assembler `.fill` line made a
200 MB object (and library) in 2.5 s, under the compiler sandbox's per-file
limit, and the cache kept every one of them.  So an object above OBJECT_MAX is
a failed compile (the candidate's, with the reason), and once the objects,
linked libraries and compile folders pass CACHE_MAX ($PORTER_BUILD_CACHE_MAX)
the least recently used go first (prune).  An entry used in the last GRACE_S is
never removed: a build between its compile and its link, a library a gate is
about to load.  "Used" is the file's time, set on every cache hit (touch).
The precompiled headers are not pruned: few, shared by every compile, and one
going while a compile reads it would fail that compile.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

OBJECT_MAX = int(os.environ.get("PORTER_OBJECT_MAX", 64 << 20))  # a ds4 unit's fat object stays far below
CACHE_MAX = int(os.environ.get("PORTER_BUILD_CACHE_MAX", 4 << 30))
GRACE_S = 1800.0
PRUNE_EVERY_S = 60.0  # the size check walks the folders: at most this often per cache and process
PRUNED = ("objects", "lib", "tu")
_LOCK = threading.Lock()
_LAST_PRUNE: dict[str, float] = {}


def touch(path: Path) -> bool:
    """Whether a cached file is there, its time set to now first (what prune goes by)."""
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    except OSError:
        pass  # another user's file in a shared cache: used all the same
    return Path(path).is_file()


def object_too_big(path: Path) -> str | None:
    """Why a freshly compiled object may not enter the cache, or None."""
    size = Path(path).stat().st_size
    if size > OBJECT_MAX:
        return (f"error: the object file is {size / 2**20:.0f} MiB, more than the {OBJECT_MAX / 2**20:.0f} MiB "
                "a unit's object may be (data the source makes the assembler write?)")
    return None


def _disk(st: os.stat_result) -> int:
    return st.st_blocks * 512  # what the disk holds: a sparse file's length is no bound


def _tree(path: str) -> tuple[float, int]:
    """(latest time of anything in it, bytes on disk) of a folder, its links not followed."""
    st = os.lstat(path)
    last, size = st.st_mtime, _disk(st)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            last, size = max(last, st.st_mtime), size + _disk(st)
    return last, size


def entries(cache: Path) -> list[tuple[float, int, Path]]:
    """(last use, bytes, path) of what prune may remove: objects, linked libraries' folders, compile folders."""
    out = []
    for sub in PRUNED:
        try:
            found = list(os.scandir(Path(cache) / sub))
        except OSError:
            continue
        for e in found:
            try:
                if sub == "objects":
                    if e.name.endswith(".o") and not e.name.startswith(".") and e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        out.append((st.st_mtime, _disk(st), Path(e.path)))
                elif e.is_dir(follow_symlinks=False):
                    out.append((*_tree(e.path), Path(e.path)))
            except OSError:
                continue
    return out


def prune(cache: Path, limit: int | None = None, grace: float | None = None) -> list[Path]:
    """Remove the least recently used entries until the cache holds `limit` bytes, never one used in the
    last `grace` seconds; what went."""
    limit = CACHE_MAX if limit is None else limit
    grace = GRACE_S if grace is None else grace
    found = sorted(entries(cache))
    total = sum(size for _last, size, _path in found)
    removed: list[Path] = []
    now = time.time()
    for last, size, path in found:
        if total <= limit or now - last < grace:
            break  # sorted by last use: the rest were used later still
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        if not os.path.lexists(path):
            total -= size
            removed.append(path)
    return removed


def maybe_prune(cache: Path) -> list[Path]:
    """prune, at most once every PRUNE_EVERY_S per cache folder and process."""
    now = time.monotonic()
    with _LOCK:
        if now - _LAST_PRUNE.get(str(cache), float("-inf")) < PRUNE_EVERY_S:
            return []
        _LAST_PRUNE[str(cache)] = now
    return prune(cache)
