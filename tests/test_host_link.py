"""The backend library linked with nvcc's host step alone (porter/gates/host_link.py), with real nvcc."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from porter.gates import build, host_link


@pytest.fixture(autouse=True)
def _porter_home_beside(tmp_path_factory, monkeypatch):
    """These tests compile in tmp_path itself; the compiler's sandbox refuses a folder holding $PORTER_HOME."""
    monkeypatch.setenv("PORTER_HOME", str(tmp_path_factory.mktemp("porter-home")))

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("g++") is None,
                                reason="nvcc or g++ not on PATH: the host link runs nvcc's own g++ line")

KERNEL = '''
static __global__ void twice_kernel(float *x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}
extern "C" int porter_twice(float *x, unsigned n) {
    twice_kernel<<<(n + 255) / 256, 256>>>(x, n);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
'''
FLAGS = ["-O2", "-Xcompiler", "-fPIC", "-arch=sm_90"]


def _obj(tmp_path: Path, name: str, src: str) -> Path:
    (tmp_path / f"{name}.cu").write_text(src)
    out = tmp_path / f"{name}.o"
    subprocess.run([build.nvcc_path(), "-c", *FLAGS, "-o", str(out), str(tmp_path / f"{name}.cu")],
                   check=True, capture_output=True)
    return out


def _link_cmd(out: Path, objs: list[Path]) -> list[str]:
    nvcc = build.nvcc_path()
    return [nvcc, "-shared", "-lcudart", *build.PORTER_LINK_FLAGS, *build.toolkit_rpath(nvcc), "-o", str(out),
            *map(str, objs)]


def _dynamic(lib: Path) -> tuple[set[str], set[str]]:
    """(exported defined symbols, needed libraries) of a shared library."""
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    return ({l.split()[-1] for l in syms.splitlines() if l.strip()},
            {l.split("[")[-1].rstrip("]") for l in needed.splitlines() if "(NEEDED)" in l})


def test_host_link_keeps_nvcc_line_but_the_device_link_object(tmp_path):
    obj = _obj(tmp_path, "k", KERNEL)
    plan = host_link.host_link_command(_link_cmd(tmp_path / "a.so", [obj]), tmp_path)
    assert plan is not None
    cmd, _env = plan
    assert Path(cmd[0]).name == "g++" and "-shared" in cmd and str(obj) in cmd
    assert not any("dlink" in a for a in cmd)  # the device-link object is the one thing dropped
    assert "-lcudart" in cmd and "defs" in cmd  # our libraries and -z defs are still there


@pytest.mark.parametrize("callers_tmpdir", [True, False])
def test_host_link_runs_with_its_sandboxs_own_tmp(tmp_path, monkeypatch, callers_tmpdir):
    """Neither the dryrun's private TMPDIR (already deleted) nor the caller's (a folder its sandbox
    does not show) reaches g++: it writes its temporaries to the sandbox's own /tmp, and links."""
    obj = _obj(tmp_path, "k", KERNEL)
    own = tmp_path / "own-tmp"
    own.mkdir()
    if callers_tmpdir:
        monkeypatch.setenv("TMPDIR", str(own))
    else:
        monkeypatch.delenv("TMPDIR", raising=False)
    plan = host_link.host_link_command(_link_cmd(tmp_path / "t.so", [obj]), tmp_path)
    assert plan is not None
    _cmd, env = plan
    assert "TMPDIR" not in env
    assert host_link.link(_link_cmd(tmp_path / "t.so", [obj]), FLAGS, tmp_path, 60) == "ok"


def test_host_linked_library_exports_and_needs_what_nvcc_linked_one_does(tmp_path):
    obj = _obj(tmp_path, "k", KERNEL)
    a, b = tmp_path / "host.so", tmp_path / "nvcc.so"
    assert host_link.link(_link_cmd(a, [obj]), FLAGS, tmp_path, 60) == "ok" and a.is_file()
    subprocess.run(_link_cmd(b, [obj]), check=True, capture_output=True)
    sa, sb = _dynamic(a), _dynamic(b)
    assert "porter_twice" in sa[0] and sa == sb
    # the kernel's own fatbinary (and its registration) is in the object, so in both libraries
    sec = subprocess.run(["readelf", "-S", str(a)], capture_output=True, text=True, check=True).stdout
    assert ".nv_fatbin" in sec


def test_an_undefined_symbol_still_fails_the_link(tmp_path):
    """-z defs: a unit calling a function nobody defines is refused by the host link too (the
    caller then links with nvcc, whose diagnostics name the symbol)."""
    obj = _obj(tmp_path, "u", 'extern "C" int nowhere(void);\nextern "C" int porter_u(void) { return nowhere(); }\n')
    assert host_link.link(_link_cmd(tmp_path / "u.so", [obj]), FLAGS, tmp_path, 60) == "failed"
    r = subprocess.run(_link_cmd(tmp_path / "u2.so", [obj]), capture_output=True, text=True)
    assert r.returncode != 0 and "nowhere" in (r.stdout + r.stderr)


@pytest.mark.parametrize("flag", ["-rdc=true", "-dc", "--relocatable-device-code=true"])
def test_relocatable_device_code_keeps_nvcc_device_link(tmp_path, flag):
    assert host_link.link(_link_cmd(tmp_path / "r.so", []), [*FLAGS, flag], tmp_path, 60) == "unsplit"


def test_turned_off_links_with_nvcc(tmp_path, monkeypatch):
    monkeypatch.setattr(host_link, "ENABLED", False)
    assert host_link.link(_link_cmd(tmp_path / "o.so", []), FLAGS, tmp_path, 60) == "unsplit"


def test_no_temporaries_left_behind(tmp_path):
    obj = _obj(tmp_path, "k", KERNEL)
    host_link.link(_link_cmd(tmp_path / "t.so", [obj]), FLAGS, tmp_path, 60)
    assert not list(tmp_path.glob(".nvcc-link-*"))


def test_a_remembered_link_listing_names_this_links_objects(tmp_path, monkeypatch):
    """The link's nvcc listing is asked once per shape: a second link of other objects to
    another output gets nvcc's g++ line with its own objects and output, none of the first's."""
    from porter.gates import nvcc_split

    monkeypatch.setattr(nvcc_split, "_DRYRUNS", {})
    a = _obj(tmp_path, "k", KERNEL)
    b = _obj(tmp_path, "k2", KERNEL.replace("porter_twice", "porter_twice2"))
    first = host_link.host_link_command(_link_cmd(tmp_path / "a.so", [a]), tmp_path)
    monkeypatch.setattr(nvcc_split, "dryrun", lambda *a, **k: pytest.fail("nvcc asked again for the same shape"))
    second = host_link.host_link_command(_link_cmd(tmp_path / "b.so", [b]), tmp_path)
    assert first and second
    assert str(b) in second[0] and str(tmp_path / "b.so") in second[0]
    assert str(a) not in second[0] and str(tmp_path / "a.so") not in second[0]
    assert [x for x in second[0] if x not in (str(b), str(tmp_path / "b.so"))] == \
        [x for x in first[0] if x not in (str(a), str(tmp_path / "a.so"))]
    assert host_link.link(_link_cmd(tmp_path / "b.so", [b]), FLAGS, tmp_path, 120) == "ok"
    assert "porter_twice2" in _dynamic(tmp_path / "b.so")[0]
