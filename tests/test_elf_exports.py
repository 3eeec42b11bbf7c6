"""The build gate's export check reads the library's dynamic symbols itself (elf_exports.py):
it must name exactly what `nm -D --defined-only` names, and hand any file it does not walk to nm."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from porter.errors import PorterError
from porter.gates import build, elf_exports

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None or shutil.which("nm") is None, reason="no C compiler or nm")

LIB = """
int exported_api(int x) { return x + 1; }
__attribute__((visibility("hidden"))) int hidden_helper(int x) { return x * 2; }
static int local_only(int x) { return x - 1; }
int uses_libm_and_locals(int x) { return local_only(hidden_helper(x)) + (int)__builtin_sqrt((double)x); }
extern int undefined_elsewhere(int);
int calls_undefined(int x) { return undefined_elsewhere(x); }
int data_symbol = 7;
"""


def _nm(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {p[2].split("@")[0] for p in (ln.split() for ln in out.splitlines()) if len(p) >= 3}


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("elf")
    (d / "l.c").write_text(LIB)
    out = d / "libl.so"
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(out), str(d / "l.c"), "-lm"], check=True)
    return out


def test_defined_dynamic_symbols_are_nms(lib):
    got = elf_exports.defined_dynamic_symbols(lib)
    assert got == _nm(lib)
    assert {"exported_api", "uses_libm_and_locals", "calls_undefined", "data_symbol"} <= got
    assert "hidden_helper" not in got and "local_only" not in got
    assert "undefined_elsewhere" not in got  # referenced, not defined: the case the check exists for


def test_a_real_cuda_library_reads_as_nm_reads_it(tmp_path):
    """A library nvcc linked, as the build gate makes them (when nvcc is here)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    (tmp_path / "k.cu").write_text('__global__ void k(float *x) { x[0] = 1; }\n'
                                   'extern "C" int porter_api(float *x) { k<<<1, 1>>>(x); return 0; }\n')
    out = tmp_path / "libk.so"
    subprocess.run([build.nvcc_path(), "-shared", "-Xcompiler", "-fPIC", "-o", str(out), str(tmp_path / "k.cu")],
                   check=True, capture_output=True)
    assert elf_exports.defined_dynamic_symbols(out) == _nm(out) and "porter_api" in _nm(out)


@pytest.mark.parametrize("damage", ["empty", "not-elf", "32-bit", "truncated"])
def test_a_file_it_does_not_walk_goes_to_nm(lib, tmp_path, damage):
    data = lib.read_bytes()
    bad = {"empty": b"", "not-elf": b"#!/bin/sh\n" + data[10:], "32-bit": data[:4] + b"\x01" + data[5:],
           "truncated": data[: len(data) // 3]}[damage]
    f = tmp_path / "libbad.so"
    f.write_bytes(bad)
    with pytest.raises(elf_exports.NotReadable):
        elf_exports.defined_dynamic_symbols(f)
    with pytest.raises(PorterError, match="nm -D libbad.so failed"):
        build.exported_symbols(f)  # nm's own verdict on the file, as before


def test_export_check_uses_the_reader_not_nm(lib, monkeypatch):
    monkeypatch.setattr(build, "_nm_exported_symbols", lambda p: pytest.fail("nm asked for a readable library"))
    assert "exported_api" in build.exported_symbols(lib)
