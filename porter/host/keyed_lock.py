"""One threading.Lock per key, for this process: work that must happen once per key (an object
file, a precompiled header) while threads ask for the same key at once."""

from __future__ import annotations

import threading

_LOCKS: dict[str, threading.Lock] = {}
_GUARD = threading.Lock()


def key_lock(key: str) -> threading.Lock:
    with _GUARD:
        return _LOCKS.setdefault(key, threading.Lock())
