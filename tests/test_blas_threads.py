"""prepare() builds calls on several threads with numpy's BLAS held to one thread, and hands BLAS back
its own count only when the last overlapping build pool ends (porter/gates/parity/blas_threads.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from porter.gates.parity import blas_threads
from porter.gates.parity import gate as G
from porter.spec import Shape, SpecError, Tol, UnitSpec

BLAS = [d for d in threadpool_info() if d.get("user_api") == "blas"]
pytestmark = pytest.mark.skipif(not BLAS, reason="numpy has no BLAS threadpoolctl can see")


def blas_count() -> int:
    return min(d["num_threads"] for d in threadpool_info() if d.get("user_api") == "blas")


@pytest.fixture
def two_blas_threads():
    # a machine with one core would make 'restored' and 'limited' the same number
    with threadpool_limits(limits=2, user_api="blas"):
        assert blas_count() == 2
        yield


def test_one_thread_inside_and_the_count_restored_after(two_blas_threads):
    with blas_threads.one_blas_thread():
        assert blas_count() == 1
    assert blas_count() == 2


def test_overlapping_pools_keep_one_thread_until_the_last_ends(two_blas_threads):
    """The first pool to end must not hand the other's builders the machine's BLAS threads back."""
    a, b = blas_threads.one_blas_thread(), blas_threads.one_blas_thread()
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert blas_count() == 1
    b.__exit__(None, None, None)
    assert blas_count() == 2


def test_an_exception_inside_still_restores(two_blas_threads):
    with pytest.raises(RuntimeError):
        with blas_threads.one_blas_thread():
            raise RuntimeError("a spec's build failed")
    assert blas_count() == 2


def test_prepare_builds_on_several_threads_with_one_blas_thread(two_blas_threads, monkeypatch):
    seen, threads = [], set()

    def build(shape, ctx, rng):
        seen.append(blas_count())
        threads.add(threading.current_thread().name)
        raise SpecError("recorded; nothing to build")  # prepare stops at the first failure in case order

    monkeypatch.setattr(G, "BUILD_THREADS", 4)
    spec = UnitSpec(unit="u", reference="r", inputs={}, outputs={"out": Tol(nmse=1e-6)},
                    shapes=[Shape(f"s{i}", {}) for i in range(4)], build=build)
    monkeypatch.setattr(G, "header_params", lambda api_fn: [])
    with pytest.raises(SpecError):
        G.prepare(spec, None, None, [1, 2])
    assert seen and set(seen) == {1}, seen
    assert all(n.startswith("porter-build") for n in threads), threads
    assert blas_count() == 2
