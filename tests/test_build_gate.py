"""Build gate with the real nvcc: builds and links a good unit, fails each broken one at the right stage.

The object cache is shared by the session (conftest `build_cache`), so the 23
placeholder objects and the glue are compiled once for all tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from porter.diagnostics import MAX_DIAG_CHARS, MAX_ERRORS, trim_diagnostics
from porter.errors import PorterError
from porter.gates import build
from porter.target import load_target
from porter.gates.driver import Candidate, GateContext, ParityOptions

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None,
                                reason="nvcc not on PATH: the build gate needs the CUDA toolkit")

UNIT = "mini_gpu_add_tensor"
KERNEL = '''#include "mini_cuda.cuh"

static __global__ void add_kernel(float *o, const float *a, const float *b, uint64_t n) {
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = a[i] + b[i];
}
'''
BODY = ''' {
    if (!out || !a || !b) return -1;
    add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, mini_cuda_stream()>>>(
        (float *)out->data, (const float *)a->data, (const float *)b->data, n);
    return MINI_CUDA_LAUNCH_OK("add") ? 0 : -1;
}
'''
HEAD = 'extern "C" int mini_gpu_add_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *a, const mini_gpu_tensor *b, uint64_t n)'
GOOD = KERNEL + HEAD + BODY


@pytest.fixture(scope="module")
def target(tmp_path_factory, build_cache):
    from porter.workspace import init_workspace

    ws = init_workspace(tmp_path_factory.mktemp("build") / "ws", ["minimoe"])
    return load_target(ws, "minimoe")


def fresh(src: str) -> str:
    """A comment that makes the source (and so its object) new to the cache."""
    return src + f"// {uuid.uuid4().hex}\n"


def test_good_unit_compiles_links_and_exports_every_symbol(target, build_cache):
    res = build.run(Candidate.of(UNIT, GOOD), GateContext(target, build_cache=build_cache))
    assert res.ok, res.summary + "\n" + res.diagnostics
    ev = res.evidence
    assert ev["gate"] == "build" and ev["unit"] == UNIT and ev["ok"] is True
    assert "release" in ev["toolchain"]["nvcc_version"]
    assert ev["nvcc_flags"] == target.nvcc_flags and ev["force_include"] == "mini_cuda.cuh"
    assert ev["arch"] == list(target.arch.archs) and f"-arch={ev['arch'][0]}" in ev["nvcc_flags"]
    for key in ("candidate_sha256", "object_sha256", "library_sha256", "api_header_sha256", "conventions_sha256"):
        assert len(ev[key]) == 64, key
    assert ev["compile_seconds"] >= 0 and ev["exports_checked"] == len(target.units) == 24
    lib = Path(ev["library"])
    assert lib.is_file() and lib.name == "libmini_cuda.so"
    assert build.exported_symbols(lib) >= set(target.units)
    # the library holds this candidate and every other unit's current file (placeholders here)
    assert ev["linked"][UNIT]["placeholder"] is False
    assert all(v["placeholder"] for u, v in ev["linked"].items() if u != UNIT)
    # the same candidate again comes from the cache
    again = build.run(Candidate.of(UNIT, GOOD), GateContext(target, build_cache=build_cache))
    assert again.ok and again.evidence["object_cached"] is True
    assert again.evidence["library_sha256"] == ev["library_sha256"]


def test_compile_error_fails_with_trimmed_diagnostics(target, build_cache):
    src = fresh(GOOD.replace("a[i] + b[i]", "a[i] + missing_name[i]"))
    res = build.run(Candidate.of(UNIT, src), GateContext(target, build_cache=build_cache))
    assert not res.ok and res.evidence["stage"] == "compile"
    assert res.summary.startswith(f"compile error: {UNIT}.cu(")
    assert 'identifier "missing_name" is undefined' in res.diagnostics
    for path in (str(target.workspace), str(build_cache), "/tmp/"):
        assert path not in res.diagnostics, f"diagnostics keep a path: {path}"
    assert len(res.diagnostics) <= MAX_DIAG_CHARS + 100


def test_signature_drift_is_a_compile_error(target, build_cache):
    drifted = HEAD.replace("uint64_t n)", "uint32_t n)")
    res = build.run(Candidate.of(UNIT, fresh(KERNEL + drifted + BODY)), GateContext(target, build_cache=build_cache))
    assert not res.ok and res.evidence["stage"] == "compile"
    assert '"C" linkage' in res.summary  # the forced include's declaration conflicts with it


def test_missing_extern_c_fails_the_export_check(target, build_cache):
    # Without extern "C" and with a drifted signature the definition is a C++ overload:
    # it compiles, but the library no longer exports the C symbol.
    overload = HEAD.replace('extern "C" ', "").replace("uint64_t n)", "uint32_t n)")
    res = build.run(Candidate.of(UNIT, fresh(KERNEL + overload + BODY.replace("(n + 255)", "((uint64_t)n + 255)"))), GateContext(target, build_cache=build_cache))
    assert not res.ok and res.evidence["stage"] == "exports", res.summary
    assert f"does not export {UNIT} under its C name" in res.summary
    assert "C++-mangled _Z" in res.summary
    assert res.evidence["missing_exports"] == [UNIT]


def test_exact_signature_without_extern_c_inherits_c_linkage(target, build_cache):
    """Documented behaviour: the force-included header already declared it extern "C"; the
    static gate is what insists on the keyword in the unit file."""
    res = build.run(Candidate.of(UNIT, fresh(KERNEL + HEAD.replace('extern "C" ', "") + BODY)), GateContext(target, build_cache=build_cache))
    assert res.ok, res.summary


def test_undefined_symbol_fails_at_link(target, build_cache):
    src = fresh(KERNEL + 'extern "C" int porter_test_not_defined_anywhere(void);\n' + HEAD
                + BODY.replace("return MINI_CUDA_LAUNCH_OK", "return porter_test_not_defined_anywhere() + MINI_CUDA_LAUNCH_OK"))
    res = build.run(Candidate.of(UNIT, src), GateContext(target, build_cache=build_cache))
    assert not res.ok and res.evidence["stage"] == "link"
    assert "porter_test_not_defined_anywhere" in res.diagnostics


def test_nvcc_timeout_is_a_failed_build(target, build_cache, monkeypatch):
    monkeypatch.setattr(build, "NVCC_TIMEOUT_S", 0.01)
    res = build.run(Candidate.of(UNIT, fresh(GOOD)), GateContext(target, build_cache=build_cache))
    assert not res.ok and "nvcc timed out" in res.summary


def test_no_nvcc_on_path_is_a_one_line_error(target, build_cache, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PorterError) as exc:
        build.run(Candidate.of(UNIT, GOOD), GateContext(target, build_cache=build_cache))
    assert str(exc.value).startswith("nvcc not found on PATH") and "\n" not in str(exc.value)


def test_diagnostics_are_deduplicated_and_capped():
    one = "/abs/dir/x.cu(3): error: identifier \"q\" is undefined\n      q = 1;\n      ^\n\n"
    many = "".join(f"/abs/dir/x.cu({i}): error: thing {i}\n" for i in range(40))
    out = trim_diagnostics(one * 5 + many, compiler=True, strip=["/abs/dir"])
    assert out.count('identifier "q" is undefined') == 1
    assert "/abs/dir" not in out and "x.cu(3)" in out
    assert out.count("error:") == MAX_ERRORS and "more error(s) not shown" in out


def test_cache_dir_honours_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_BUILD_CACHE", str(tmp_path / "c"))
    assert build.cache_dir(Path("/ws")) == tmp_path / "c"
    monkeypatch.delenv("PORTER_BUILD_CACHE")
    assert build.cache_dir(Path("/ws")) == Path("/ws/runs/build-cache")
    assert os.environ.get("PORTER_BUILD_CACHE") is None


def test_threads_building_the_same_object_compile_it_once(workspace, tmp_path, monkeypatch):
    """--jobs N: every unit's first build needs the same placeholder objects; one compile each."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from porter.gates import build
    from porter.target import load_target

    target = load_target(workspace, "minimoe")
    calls = []
    real_run = subprocess.run

    def fake_nvcc(cmd, **kw):
        if "-c" not in cmd:
            return real_run(cmd, **kw)  # nvcc --version for the object key
        calls.append(threading.get_ident())
        time.sleep(0.3)  # long enough for every thread to arrive while the first compiles
        out = cmd[cmd.index("-o") + 1]
        (Path(kw["cwd"]) / out if not Path(out).is_absolute() else Path(out)).write_bytes(b"obj")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(build.subprocess, "run", fake_nvcc)
    monkeypatch.setattr(build, "SPLIT_COMPILE", False)  # one faked nvcc call per compile
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: build.compile_object(target, "u", b"int x;", tmp_path), range(8)))
    assert len(calls) == 1
    assert len({p for p, _, _ in got}) == 1 and sum(not cached for _, _, cached in got) == 1


def test_the_toolkit_is_found_through_an_nvcc_wrapper_script(tmp_path):
    """/usr/local/bin/nvcc is often `exec /usr/local/cuda-X/bin/nvcc "$@"` (and module systems do the
    same): the toolkit's lib64 (rpath, CUDA_HOME for ds4's Makefile) must come from nvcc, not its path."""
    real = Path(build.nvcc_path()).resolve()
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    root = build.toolkit_root(str(wrapper))
    assert root != tmp_path and (root / "bin" / "nvcc").is_file()
    assert any(d.parent == root or root in d.parents for d in build.toolkit_lib_dirs(str(wrapper)))
