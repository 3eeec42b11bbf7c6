"""numpy's BLAS on one thread while a spec's calls are built on several (gate.prepare).

prepare() builds a spec's calls on up to 8 threads, and OpenBLAS starts its own threads for each
product, as many as the host has cores: 8 builders x 16 BLAS threads on a 16-core H200 host, and
several specs prepared at once by calibrate, the perf table or a run's jobs.  Measured there on ds4's
indexed-attention spec (prepare alone, nothing else running): 286 CPU-seconds, 18 s of wall time, with
BLAS's default; 41 CPU-seconds, 11 s, with one BLAS thread per builder.  On a loaded 64-core host the
same prepare had taken 417 s.  The builders are the parallelism, so BLAS gets one thread while any
build pool of this process runs.

The limit is process-wide (OpenBLAS keeps one thread count), and pools overlap: prepares of several
specs run at once on the driver's threads.  So the first pool to start sets it and the last one to end
restores what was there before; a pool that restored on its own exit would hand the other pools'
builders back the oversubscription, or leave BLAS on one thread for good."""

from __future__ import annotations

import threading
from contextlib import contextmanager

_lock = threading.Lock()
_users = 0
_limiter = None


@contextmanager
def one_blas_thread():
    global _users, _limiter
    with _lock:
        if _users == 0:
            from threadpoolctl import threadpool_limits

            _limiter = threadpool_limits(limits=1, user_api="blas")
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _limiter is not None:
                _limiter.restore_original_limits()
                _limiter = None
