"""The precompiled prefix of nvcc's host compile (porter/gates/host_pch.py).

What it must never do is change an object: every test that compiles compares
the object's code and data sections and symbols with the one made without it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from porter.gates import build, host_pch, nvcc_split
from porter.target import load_target
# the split compile's own unit: an anonymous namespace of its own, a kernel, a launch
from test_nvcc_split import SOURCE, UNIT


@pytest.fixture(autouse=True)
def _porter_home_beside(tmp_path_factory, monkeypatch):
    """These tests compile in tmp_path itself; the compiler's sandbox refuses a folder holding $PORTER_HOME."""
    monkeypatch.setenv("PORTER_HOME", str(tmp_path_factory.mktemp("porter-home")))

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("objcopy") is None,
                                reason="nvcc and objcopy needed: the precompiled prefix is nvcc's host compile")

# -- where the prefix ends (no compiler) ---------------------------------------------------------

UNIT_TEXT = "\n".join([
    '# 1 "u.cu"',
    '#pragma GCC diagnostic ignored "-Wattributes"',
    '# 1 "/inc/runtime.h" 3',
    'extern "C" {',
    '# 4',
    'int cudaThing(const char *s = "{not a brace}");',
    "char brace = '}';",
    "}",
    "#if 0",
    "# 9",
    "{",
    "#endif",
    "struct S { int a; };",
    '# 7 "u.cu"',
    "static int unit_code() { return 1; }",
    "",
])


def test_prefix_ends_where_the_text_returns_to_the_unit():
    prefix, rest = host_pch.split_prefix(UNIT_TEXT)
    assert prefix.endswith("struct S { int a; };\n") and "unit_code" not in prefix
    assert rest.startswith('# 1 "u.cu"\n# 7 "u.cu"\nstatic int unit_code()')
    # nothing is lost or added: prefix + rest is the text, less nothing but the cut
    assert rest.split("\n", 1)[0] + "\n" + prefix + rest.split("\n", 1)[1] == UNIT_TEXT


def test_the_prefix_is_the_same_for_every_unit():
    other = UNIT_TEXT.replace('"u.cu"', '"v.cu"').replace("unit_code() { return 1; }", "other() { return 2; }")
    assert host_pch.split_prefix(UNIT_TEXT)[0] == host_pch.split_prefix(other)[0]


def test_the_prefix_stops_before_the_module_id_and_at_a_closed_block():
    """cudafe++ names headers' anonymous namespaces after the module id (one per compile): a
    prefix holding it could never be shared; cut before it, where the enclosing block is closed."""
    text = UNIT_TEXT.replace("struct S { int a; };", "namespace cuda { namespace std {\nint x;\n"
                             "namespace _GLOBAL__N__abc_4_u_cu_def { int y; }\n}}")
    prefix, rest = host_pch.split_prefix(text, avoid="_GLOBAL__N__abc_4_u_cu_def")
    assert "_GLOBAL__N__" not in prefix and prefix.endswith("#endif\n")
    assert rest.split("\n")[1] == "namespace cuda { namespace std {"


def test_no_prefix_when_nothing_closes_or_the_text_has_no_marker():
    assert host_pch.split_prefix("int x;\n") is None
    assert host_pch.split_prefix('# 1 "u.cu"\nnamespace a {\n# 3 "u.cu"\n}\n') is None
    assert host_pch.split_prefix('# 1 "u.cu"\nint a;\n') is None  # never back in the unit


def test_the_cut_is_remembered_per_prefix(tmp_path):
    memo = tmp_path / "cuts"
    first = host_pch.split_prefix(UNIT_TEXT, memo=memo)
    assert len(list(memo.iterdir())) == 1
    assert host_pch.split_prefix(UNIT_TEXT, memo=memo) == first


# -- with nvcc --------------------------------------------------------------------------------------

# a header with an anonymous namespace, as libcu++'s are (ds4's conventions header includes them)
ANON_HEADER = "#pragma once\nnamespace hdr { namespace { __host__ __device__ inline int one() { return 1; } } }\n"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from porter.workspace import init_workspace

    return load_target(init_workspace(tmp_path_factory.mktemp("pch") / "ws", ["minimoe"]), "minimoe")


def _compile(target, folder: Path, source: str, key: str, pch_dir: Path | None, extra: list[str] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{UNIT}.cu").write_text(source)
    out = folder / "x.o"
    cmd = [build.nvcc_path(), "-c", *build.compile_flags(target), *extra, "-o", str(out), f"{UNIT}.cu"]
    assert nvcc_split.compile_split(cmd, folder, key, UNIT, 240, pch_dir) == "ok"
    return out


def _sections(obj: Path, tmp: Path) -> dict[str, bytes]:
    out = {}
    for sec in (".text", ".data", ".rodata", ".bss", ".nv_fatbin", ".nvFatBinSegment", ".init_array"):
        dump = tmp / f"{obj.parent.name}{sec}.bin"
        subprocess.run(["objcopy", "-O", "binary", f"--only-section={sec}", str(obj), str(dump)], check=True)
        out[sec] = dump.read_bytes()
    syms = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    out["symbols"] = "\n".join(sorted(syms.splitlines())).encode()
    return out


def _headers(pch_dir: Path) -> list[Path]:
    return sorted(d for d in pch_dir.iterdir() if (d / "prefix.h.gch").is_file())


@needs_nvcc
def test_the_object_is_the_one_made_without_it_and_units_share_one_header(target, tmp_path):
    pch = tmp_path / "pch"
    key = "a" * 64
    with_pch = _compile(target, tmp_path / "with", SOURCE, key, pch)
    without = _compile(target, tmp_path / "without", SOURCE, key, None)
    sections = _sections(with_pch, tmp_path)
    assert sections[".text"] and sections[".nv_fatbin"], "nothing compared"
    assert sections == _sections(without, tmp_path)
    assert len(_headers(pch)) == 1
    # another unit's compile (other code, other module id) reads the same header
    _compile(target, tmp_path / "other", SOURCE.replace("2.0f * x", "3.0f * x"), "b" * 64, pch)
    assert len(_headers(pch)) == 1
    assert not list(pch.glob("*.failed"))


@needs_nvcc
def test_a_header_anonymous_namespace_stays_out_of_the_shared_prefix(target, tmp_path):
    hdr = tmp_path / "anon.h"
    hdr.write_text(ANON_HEADER)
    pch = tmp_path / "pch"
    src = SOURCE.replace("2.0f * x", "(float)hdr::one() * x")
    first = _compile(target, tmp_path / "one", src, "c" * 64, pch, ["-include", str(hdr)])
    _compile(target, tmp_path / "two", src, "d" * 64, pch, ["-include", str(hdr)])
    (header,) = _headers(pch)
    assert "_GLOBAL__N_" not in (header / "prefix.h").read_text()
    assert "namespace hdr" not in (header / "prefix.h").read_text()
    plain = _compile(target, tmp_path / "plain", src, "c" * 64, None, ["-include", str(hdr)])
    assert _sections(first, tmp_path) == _sections(plain, tmp_path)


@needs_nvcc
def test_a_damaged_header_is_condemned_and_the_object_still_right(target, tmp_path):
    pch = tmp_path / "pch"
    _compile(target, tmp_path / "first", SOURCE, "e" * 64, pch)
    (header,) = _headers(pch)
    gch = header / "prefix.h.gch"
    gch.write_bytes(gch.read_bytes()[:100_000])  # a truncated .gch: gcc refuses it outright
    damaged = _compile(target, tmp_path / "second", SOURCE, "e" * 64, pch)
    plain = _compile(target, tmp_path / "plain", SOURCE, "e" * 64, None)
    assert _sections(damaged, tmp_path) == _sections(plain, tmp_path)
    assert not header.exists() and header.with_name(header.name + ".failed").is_file()
    # and it is not built again: later compiles stay plain
    _compile(target, tmp_path / "third", SOURCE, "e" * 64, pch)
    assert not _headers(pch)


@needs_nvcc
def test_a_prefix_that_does_not_precompile_leaves_the_compile_plain(target, tmp_path, monkeypatch):
    pch = tmp_path / "pch"
    real_split = host_pch.split_prefix

    def unclosed(text, avoid=None, memo=None):
        prefix, rest = real_split(text, avoid, memo)
        return prefix + "namespace left_open {\n", "}\n" + rest  # gcc cannot precompile this prefix

    monkeypatch.setattr(host_pch, "split_prefix", unclosed)
    obj = _compile(target, tmp_path / "one", SOURCE, "f" * 64, pch)
    assert not _headers(pch) and len(list(pch.glob("*.failed"))) == 1
    monkeypatch.undo()
    plain = _compile(target, tmp_path / "plain", SOURCE, "f" * 64, None)
    assert _sections(obj, tmp_path) == _sections(plain, tmp_path)


@needs_nvcc
def test_the_build_gate_uses_it_and_the_switch_turns_it_off(target, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    build.compile_object(target, UNIT, SOURCE.encode(), cache)
    assert len(_headers(cache / "host-pch")) == 1
    monkeypatch.setattr(build, "HOST_PCH", False)
    off = tmp_path / "off"
    build.compile_object(target, UNIT, SOURCE.encode(), off)
    assert not (off / "host-pch").exists()


@needs_nvcc
def test_a_compile_does_not_wait_for_a_header_another_thread_is_building(target, tmp_path, monkeypatch):
    class Busy:
        def acquire(self, blocking=True):
            assert blocking is False, "a compile must not block on another's header build"
            return False

    monkeypatch.setattr(host_pch, "key_lock", lambda key: Busy())
    pch = tmp_path / "pch"
    obj = _compile(target, tmp_path / "one", SOURCE, "9" * 64, pch)
    assert obj.is_file() and not _headers(pch) and not list(pch.glob("*.failed"))


@needs_nvcc
def test_each_architecture_reads_a_header_of_its_own(target, tmp_path, monkeypatch):
    """The host compile of an sm_120 object defines __CUDA_ARCH_LIST__=1200: its prefix must not be the
    one precompiled for sm_90 (the cache key holds the host compile's flags, the architecture among them)."""
    from porter.host import arch

    pch = tmp_path / "pch"
    monkeypatch.setenv(arch.ENV, "sm_90")
    _compile(load_target(target.workspace, "minimoe"), tmp_path / "h", SOURCE, "a" * 64, pch)
    monkeypatch.setenv(arch.ENV, "sm_120")
    _compile(load_target(target.workspace, "minimoe"), tmp_path / "b", SOURCE, "b" * 64, pch)
    assert len(_headers(pch)) == 2
