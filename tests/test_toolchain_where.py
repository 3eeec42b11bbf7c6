"""Toolchains where users have them (issue 43, item 6): one answer (porter.host.toolchain.locate) for where the
toolkit's headers and libraries are, read by `porter doctor`, the build's flags and the compile sandbox.

Fake toolkits are laid out in tmp folders: an nvcc reached through a link, a toolkit whose libcublas.so is a
link into another tree, cuBLAS from NVIDIA's pip wheel only, conda's layout, $CUDA_HOME without nvcc on PATH.
Each sandbox test runs `test -f` inside the compile sandbox on what the doctor says it found: before this
module the doctor either did not find it or the sandbox did not show it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from porter.host import sandbox
from porter.host import toolchain
from porter.gates import compile_jail

REPO = Path(__file__).resolve().parent.parent

needs_bwrap = pytest.mark.skipif(not sandbox.available()[0], reason="no working bubblewrap here")


def fake_toolkit(root: Path, *, cublas: bool = False, release: str = "12.9") -> Path:
    """A toolkit folder with a fake nvcc (its --version and the TOP= line of its --dryrun), the runtime's
    header and library, and cuBLAS only when asked."""
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "lib64").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("/* fake */\n")
    (root / "lib64" / "libcudart.so").write_bytes(b"\x7fELF fake")
    if cublas:
        (root / "include" / "cublas_v2.h").write_text("/* fake */\n")
        (root / "lib64" / "libcublas.so").write_bytes(b"\x7fELF fake")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\ncase \"$1\" in\n"
                    f"  --version) echo 'Cuda compilation tools, release {release}, V{release}.1';;\n"
                    f"  --dryrun) echo '#$ TOP={root}' >&2;;\nesac\n")
    nvcc.chmod(0o755)
    return nvcc


def pip_wheel(site: Path, *, unversioned: bool = True) -> Path:
    """site-packages/nvidia/cublas/{include,lib} as nvidia-cublas-cu12 installs it."""
    pkg = site / "nvidia" / "cublas"
    (pkg / "include").mkdir(parents=True)
    (pkg / "lib").mkdir()
    (pkg / "include" / "cublas_v2.h").write_text("/* fake */\n")
    (pkg / "lib" / "libcublas.so.12").write_bytes(b"\x7fELF fake")
    if unversioned:
        (pkg / "lib" / "libcublas.so").symlink_to("libcublas.so.12")
    return pkg


def seen_in_sandbox(nvcc: str, path: Path) -> bool:
    """Whether `path` is a file inside the sandbox a compile with `nvcc` runs in (its read-only binds)."""
    jail = compile_jail.Jail(compile_jail.toolchain_ro(nvcc), ())
    r = jail.run(["/bin/sh", "-c", f"test -f '{path}'"], compile_jail.clean_env(), None, 60, text=True)
    return r.returncode == 0


@pytest.fixture(autouse=True)
def _fresh_caches():
    for f in (toolchain.toolkit, toolchain.toolkit_root, compile_jail.toolchain_ro, toolchain.version_output):
        f.cache_clear()
    yield
    for f in (toolchain.toolkit, toolchain.toolkit_root, compile_jail.toolchain_ro, toolchain.version_output):
        f.cache_clear()


def no_env(monkeypatch, path: str = "/usr/bin:/bin") -> None:
    for var in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", path)


# -- a pip wheel's cuBLAS ----------------------------------------------------------------------------

@needs_bwrap
def test_cublas_from_a_pip_wheel_is_found_passed_and_shown_in_the_sandbox(tmp_path, monkeypatch):
    nvcc = str(fake_toolkit(tmp_path / "cuda"))
    pkg = pip_wheel(tmp_path / "site")
    no_env(monkeypatch)
    monkeypatch.setattr(toolchain, "_site_dirs", lambda: [tmp_path / "site"])
    tk = toolchain.toolkit(nvcc)
    header, lib = tk.header("cublas_v2.h"), tk.library("cublas")
    assert header == (pkg / "include" / "cublas_v2.h").resolve() and lib == (pkg / "lib" / "libcublas.so.12").resolve()
    assert ["-I", str(pkg.resolve() / "include")] == tk.flags()
    assert ["-L", str(pkg.resolve() / "lib")] == toolchain.toolkit_rpath(nvcc)[:2]
    assert str(pkg.resolve() / "lib") in toolchain.toolkit_rpath(nvcc)  # the parity child finds it too
    assert seen_in_sandbox(nvcc, header) and seen_in_sandbox(nvcc, lib)
    # and what the sandbox shows of the toolkit, it shows of nothing else of tmp_path
    (tmp_path / "secret").write_text("x")
    assert not seen_in_sandbox(nvcc, tmp_path / "secret")


def test_doctor_and_the_build_agree_on_a_pip_wheel_cublas(tmp_path, monkeypatch):
    from porter.commands import doctor

    nvcc = str(fake_toolkit(tmp_path / "cuda"))
    no_env(monkeypatch, f"{tmp_path / 'cuda' / 'bin'}:/usr/bin:/bin")
    monkeypatch.setattr(toolchain, "_site_dirs", lambda: [tmp_path / "site"])
    spec = type("S", (), {})()
    spec.cuda = type("C", (), {"toolkit_headers": ["cublas_v2.h"], "link_flags": ["-shared", "-lcublas"]})()
    spec.upstream = None
    target = type("T", (), {"spec": spec})()
    before = {c.name: c for c in doctor._toolkit_files(target, nvcc)}
    assert not before["headers"].ok and not before["libraries"].ok  # no cuBLAS anywhere: refused
    toolchain.toolkit.cache_clear()
    pip_wheel(tmp_path / "site")
    after = {c.name: c for c in doctor._toolkit_files(target, nvcc)}
    assert after["headers"].ok and after["libraries"].ok, [c.line() for c in after.values()]
    assert "nvidia/cublas/include" in after["headers"].detail
    assert after["toolkit"].ok and "nvidia/cublas" in after["toolkit"].detail
    if sandbox.available()[0]:  # what the doctor found, the sandboxed compiler sees
        tk = toolchain.toolkit(nvcc)
        assert seen_in_sandbox(nvcc, tk.header("cublas_v2.h")) and seen_in_sandbox(nvcc, tk.library("cublas"))


def test_a_wheel_without_the_linkers_name_is_refused_by_the_doctor_saying_why(tmp_path, monkeypatch):
    from porter.commands import doctor

    nvcc = str(fake_toolkit(tmp_path / "cuda"))
    pip_wheel(tmp_path / "site", unversioned=False)  # NVIDIA's wheels ship libcublas.so.12 only
    no_env(monkeypatch)
    monkeypatch.setattr(toolchain, "_site_dirs", lambda: [tmp_path / "site"])
    spec = type("S", (), {})()
    spec.cuda = type("C", (), {"toolkit_headers": [], "link_flags": ["-lcublas"]})()
    spec.upstream = None
    c = {c.name: c for c in doctor._toolkit_files(type("T", (), {"spec": spec})(), nvcc)}["libraries"]
    assert not c.ok and "libcublas.so.12" in c.detail and "ln -s libcublas.so.12" in c.detail


def test_a_wheel_holding_the_toolkits_own_headers_is_not_used(tmp_path, monkeypatch):
    """nvidia/cuda_runtime's cuda_runtime.h given with -I would be read before the toolkit's own."""
    nvcc = str(fake_toolkit(tmp_path / "cuda"))
    other = tmp_path / "site" / "nvidia" / "cuda_runtime"
    (other / "include").mkdir(parents=True)
    (other / "include" / "cuda_runtime.h").write_text("/* another release */\n")
    (other / "include" / "cuda_extra.h").write_text("\n")
    no_env(monkeypatch)
    tk = toolchain.locate(nvcc, env={}, site_dirs=[tmp_path / "site"])
    assert tk.flags() == [] and tk.header("cuda_extra.h") is None
    assert any("cuda_runtime.h" in n and "not used" in n for n in tk.notes)


# -- links out of the toolkit ------------------------------------------------------------------------

@needs_bwrap
def test_a_toolkit_reached_through_links_is_shown_at_its_real_path(tmp_path, monkeypatch):
    """nvcc on PATH is a link to /opt/.../cuda-12.9/bin/nvcc, the toolkit's libcublas.so a link into another
    tree (a package manager's layout): the sandbox shows where each link lands."""
    real = tmp_path / "opt" / "cuda-12.9"
    nvcc_real = fake_toolkit(real)
    elsewhere = tmp_path / "vendor" / "cublas"
    (elsewhere / "include").mkdir(parents=True)
    (elsewhere / "lib").mkdir()
    (elsewhere / "include" / "cublas_v2.h").write_text("/* fake */\n")
    (elsewhere / "lib" / "libcublas.so.12").write_bytes(b"\x7fELF fake")
    (real / "include" / "cublas_v2.h").symlink_to(elsewhere / "include" / "cublas_v2.h")
    (real / "lib64" / "libcublas.so").symlink_to(elsewhere / "lib" / "libcublas.so.12")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").symlink_to(nvcc_real)
    no_env(monkeypatch, f"{tmp_path / 'bin'}:/usr/bin:/bin")
    nvcc = toolchain.find_nvcc()
    assert nvcc == str(tmp_path / "bin" / "nvcc")
    tk = toolchain.toolkit(nvcc)
    assert tk.root == real.resolve()
    header, lib = tk.header("cublas_v2.h"), tk.library("cublas")
    assert header == (elsewhere / "include" / "cublas_v2.h").resolve()
    assert seen_in_sandbox(nvcc, header) and seen_in_sandbox(nvcc, lib)
    # the links themselves resolve inside too (the compiler opens them by the toolkit's name)
    assert seen_in_sandbox(nvcc, real / "include" / "cublas_v2.h") and seen_in_sandbox(nvcc, real / "lib64" / "libcublas.so")


# -- CUDA_HOME, conda -------------------------------------------------------------------------------

def test_nvcc_from_cuda_home_when_path_has_none(tmp_path, monkeypatch):
    nvcc = fake_toolkit(tmp_path / "cuda")
    no_env(monkeypatch)
    assert toolchain.find_nvcc() is None or not toolchain.find_nvcc().startswith(str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    if shutil.which("nvcc", path="/usr/bin:/bin") is None:
        assert toolchain.find_nvcc() == str(nvcc)
        assert toolchain.nvcc_path() == str(nvcc)
    assert toolchain.find_nvcc({"PATH": "/nonexistent", "CUDA_PATH": str(tmp_path / "cuda")}) == str(nvcc)
    assert toolchain.find_nvcc({"PATH": "/nonexistent"}) is None


def test_nvcc_nowhere_is_one_line_naming_where_it_looked(monkeypatch):
    from porter.errors import PorterError

    monkeypatch.setattr(toolchain, "find_nvcc", lambda env=None: None)
    with pytest.raises(PorterError) as e:
        toolchain.nvcc_path()
    assert "\n" not in str(e.value) and "CUDA_HOME" in str(e.value) and "CONDA_PREFIX" in str(e.value)


@needs_bwrap
def test_conda_layout_cublas_beside_another_nvcc(tmp_path, monkeypatch):
    """`conda install libcublas-dev` into an environment whose nvcc is the system's: targets/x86_64-linux/."""
    nvcc = str(fake_toolkit(tmp_path / "cuda"))
    conda = tmp_path / "conda"
    t = conda / "targets" / "x86_64-linux"
    (t / "include").mkdir(parents=True)
    (t / "lib").mkdir()
    (t / "include" / "cublas_v2.h").write_text("/* fake */\n")
    (t / "lib" / "libcublas.so.12").write_bytes(b"\x7fELF fake")
    (t / "lib" / "libcublas.so").symlink_to("libcublas.so.12")
    (conda / "lib").mkdir()
    (conda / "lib" / "libcublas.so").symlink_to(t / "lib" / "libcublas.so.12")
    no_env(monkeypatch)
    monkeypatch.setenv("CONDA_PREFIX", str(conda))
    monkeypatch.setattr(toolchain, "_site_dirs", lambda: [])
    tk = toolchain.toolkit(nvcc)
    assert tk.header("cublas_v2.h") == (t / "include" / "cublas_v2.h").resolve()
    assert tk.library("cublas") is not None
    assert seen_in_sandbox(nvcc, tk.header("cublas_v2.h")) and seen_in_sandbox(nvcc, tk.library("cublas"))


def test_conda_nvcc_finds_its_own_lib_folder(tmp_path, monkeypatch):
    """conda's cuda-nvcc: TOP is $CONDA_PREFIX, its libraries in lib/ (not lib64/)."""
    conda = tmp_path / "env"
    nvcc = fake_toolkit(conda)
    (conda / "lib64" / "libcudart.so").rename(tmp_path / "x")
    (conda / "lib64").rmdir()
    (conda / "lib").mkdir()
    (conda / "lib" / "libcudart.so").write_bytes(b"\x7fELF fake")
    (conda / "lib" / "libcublas.so").write_bytes(b"\x7fELF fake")
    no_env(monkeypatch)
    monkeypatch.setenv("CONDA_PREFIX", str(conda))
    tk = toolchain.locate(str(nvcc), env=dict(os.environ), site_dirs=[])
    assert tk.library("cublas") == (conda / "lib" / "libcublas.so").resolve()
    assert str(conda.resolve() / "lib") in toolchain.Toolkit.link_flags(tk)


# -- the real toolkit keeps working ------------------------------------------------------------------

@needs_bwrap
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here")
def test_the_real_nvcc_compiles_in_the_sandbox_with_what_the_doctor_found(tmp_path):
    nvcc = toolchain.nvcc_path()
    tk = toolchain.toolkit(nvcc)
    header = tk.header("cuda_runtime.h")
    assert header is not None and seen_in_sandbox(nvcc, header)
    tmp_path = tmp_path / "build"  # beside PORTER_HOME (conftest's), which no sandbox shows
    tmp_path.mkdir()
    src = tmp_path / "k.cu"
    src.write_text("#include <cuda_runtime.h>\n__global__ void k(float *x) { x[0] = 1.f; }\n")
    cmd = [nvcc, "-c", "-arch=sm_90", *tk.flags(), "-o", str(tmp_path / "k.o"), str(src)]
    r = compile_jail.for_command(cmd, tmp_path).run(cmd, compile_jail.clean_env(), tmp_path, 300, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "k.o").is_file()


def test_doctor_headers_line_on_this_machine_names_where_each_was_found():
    """On this machine's toolkit: every header the doctor calls found has a real path in a folder the compile
    sandbox binds (or under /usr, which it shows whole)."""
    nvcc = toolchain.find_nvcc()
    if nvcc is None:
        pytest.skip("no nvcc here")
    tk = toolchain.toolkit(nvcc)
    ro = compile_jail.toolchain_ro(nvcc)
    for name in ("cuda_runtime.h", "cub/cub.cuh"):
        p = tk.header(name)
        if p is not None:
            assert p.is_relative_to("/usr") or any(p.is_relative_to(r) for r in ro), (p, ro)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", __file__]))
