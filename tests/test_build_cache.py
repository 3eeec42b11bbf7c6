"""The build cache is bounded: an object too big to keep is a failed compile, and the cache is pruned
least recently used first, never what was used in the grace period (a build between compile and link)."""

from __future__ import annotations

import os
import shutil
import time
import uuid

import pytest

from porter.gates import build
from porter.gates import build_cache as bounds
from porter.gates.driver import Candidate, GateContext
from porter.target import load_target


def _entry(cache, sub: str, name: str, size: int, age_s: float):
    p = cache / sub / name
    if sub == "objects":
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(size))
        f = p
    else:
        p.mkdir(parents=True)
        f = p / "libx.so"
        f.write_bytes(os.urandom(size))
    t = time.time() - age_s
    os.utime(f, (t, t))
    os.utime(p, (t, t))
    return p


def test_prune_removes_the_least_recently_used_until_the_cache_fits(tmp_path):
    old = _entry(tmp_path, "objects", "a.o", 400_000, 7200)
    older_lib = _entry(tmp_path, "lib", "k1", 400_000, 9000)
    recent = _entry(tmp_path, "objects", "b.o", 400_000, 3600)
    fresh = _entry(tmp_path, "tu", "t1", 400_000, 10)
    gone = bounds.prune(tmp_path, limit=900_000, grace=1800)
    assert gone == [older_lib, old]
    assert recent.exists() and fresh.exists()


def test_prune_never_removes_what_was_used_in_the_grace_period(tmp_path):
    a = _entry(tmp_path, "objects", "a.o", 500_000, 60)
    b = _entry(tmp_path, "lib", "k", 500_000, 120)
    assert bounds.prune(tmp_path, limit=0, grace=1800) == []
    assert a.exists() and b.exists()
    # a cache hit is a use: it moves an old entry to the back of the line
    c = _entry(tmp_path, "objects", "c.o", 500_000, 7200)
    assert bounds.touch(c)
    assert bounds.prune(tmp_path, limit=0, grace=1800) == []


def test_the_precompiled_headers_are_never_pruned(tmp_path):
    pch = tmp_path / "host-pch" / "x.gch"
    pch.parent.mkdir(parents=True)
    pch.write_bytes(b"x" * 100_000)
    t = time.time() - 99999
    os.utime(pch, (t, t))
    bounds.prune(tmp_path, limit=0, grace=0)
    assert pch.exists()


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH: the build gate needs it")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from porter.workspace import init_workspace

    ws = init_workspace(tmp_path_factory.mktemp("cache") / "ws", ["minimoe"])
    return load_target(ws, "minimoe")


@needs_nvcc
def test_an_object_too_big_to_keep_is_a_failed_compile(target, build_cache, monkeypatch):
    """One `.fill` line makes the assembler write as much as it is told (200 MB in 2.5 s, measured):
    above OBJECT_MAX the compile fails with the reason, and nothing enters the objects folder."""
    from tests.ws_builder import SOURCES

    monkeypatch.setattr(bounds, "OBJECT_MAX", 2 << 20)
    src = SOURCES["mini_gpu_swiglu_tensor"] + f'asm(".pushsection .rodata\\n.fill 4194304,1,7\\n.popsection");\n// {uuid.uuid4().hex}\n'
    res = build.run(Candidate.of("mini_gpu_swiglu_tensor", src), GateContext(target, build_cache=build_cache))
    assert not res.ok and res.check == "compile" and "MiB" in res.summary, res.summary
    # (a failed compile compiles the glue to tell the candidate's fault from the toolkit's: those may enter)
    assert all(p.stat().st_size < 2 << 20 for p in (build_cache / "objects").iterdir())
    ok = build.run(Candidate.of("mini_gpu_swiglu_tensor", SOURCES["mini_gpu_swiglu_tensor"] + f"// {uuid.uuid4().hex}\n"),
                   GateContext(target, build_cache=build_cache))
    assert ok.ok, ok.summary


@needs_nvcc
def test_a_build_prunes_a_cache_past_its_bound(target, tmp_path, monkeypatch):
    from tests.ws_builder import SOURCES

    cache = tmp_path / "cache"
    stale = _entry(cache, "objects", "0" * 64 + ".o", 1 << 20, 7200)
    monkeypatch.setattr(bounds, "CACHE_MAX", 1)
    monkeypatch.setattr(bounds, "_LAST_PRUNE", {})
    res = build.run(Candidate.of("mini_gpu_swiglu_tensor", SOURCES["mini_gpu_swiglu_tensor"]),
                    GateContext(target, build_cache=cache))
    assert res.ok, res.summary
    assert not stale.exists()
    assert (cache / "lib").exists() and any((cache / "objects").iterdir())  # this build's own: in the grace period
