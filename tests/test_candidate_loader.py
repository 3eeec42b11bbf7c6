"""Exactly one module of porter loads a library into a Python process: porter/gates/parity/loader.py.

The rule, on Python code only (ast): a reference to ctypes.CDLL / PyDLL, ctypes.cdll / pydll,
LoadLibrary or dlopen -- called, imported or named -- outside loader.py fails.  C source that
porter writes out as a string (calibration/trace.py's launch-trace interposer dlopens
libcuda.so.1 RTLD_NOLOAD inside the traced process) is text to a compiler, not Python loading a
library, and is not looked at.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOADER = "porter/gates/parity/loader.py"
# modules that load a system library by its soname, never a path a candidate could have written
SYSTEM_LIBRARY_LOADERS = {
    "porter/calibration/mutate/fingerprint.py": "libzstd, found by ctypes.util.find_library('zstd'), to read the "
                                                "compressed device code of mutants' objects",
}
LOADING_NAMES = {"CDLL", "PyDLL", "cdll", "pydll", "LoadLibrary", "dlopen"}


def library_loads(path: Path) -> list[str]:
    """`line: name` for every reference to a library loader in the Python code of `path`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in LOADING_NAMES:
            out.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in LOADING_NAMES:
            out.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.ImportFrom):
            out += [f"{node.lineno}: import {a.name}" for a in node.names if a.name in LOADING_NAMES]
    return out


def loaders_in(root: Path) -> dict[str, list[str]]:
    return {str(p.relative_to(root)): hits for p in sorted((root / "porter").rglob("*.py"))
            if (hits := library_loads(p))}


def test_only_the_parity_loader_loads_libraries():
    found = loaders_in(REPO)
    assert set(found) - set(SYSTEM_LIBRARY_LOADERS) == {LOADER}, f"modules besides {LOADER} load libraries: {found}"
    assert set(SYSTEM_LIBRARY_LOADERS) <= set(found), "an allowed system-library loader no longer loads: drop it"


def test_the_walk_finds_every_way_of_loading_and_skips_c_source_in_strings(tmp_path):
    pkg = tmp_path / "porter"
    pkg.mkdir()
    ways = {
        "attr.py": "import ctypes\nlib = ctypes.CDLL('x.so')\n",
        "cdll.py": "import ctypes\nlib = ctypes.cdll.LoadLibrary('x.so')\n",
        "from_import.py": "from ctypes import CDLL\n",
        "libc.py": "import ctypes\nlibc = ctypes.CDLL(None)\n",
        "dl.py": "import _ctypes\nh = _ctypes.dlopen('x.so')\n",
    }
    for name, code in ways.items():
        (pkg / name).write_text(code)
    (pkg / "c_text.py").write_text('SRC = r"""void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);"""\n')
    found = loaders_in(tmp_path)
    assert set(found) == {f"porter/{n}" for n in ways}, found
