"""Python a target holds in its own folder (its e2e driver and the driver's helpers), imported by path.

porter never imports a target's code by a module name of its own: a new target adds files under
targets/<t>/ and no edit of porter/.  A file is imported once per resolved path (its module name
says which target folder and file it came from), so two targets may both hold e2e/driver.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

from porter.errors import PorterError


def load_file(path: str | Path):
    """The module of the Python file at `path` (imported on first use)."""
    path = Path(path).resolve()
    key = f"porter_target_code_{path.parent.parent.name}_{path.stem}_" \
          f"{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    if key in sys.modules:
        return sys.modules[key]
    if not path.is_file():
        raise PorterError(f"target code {path} does not exist")
    spec = importlib.util.spec_from_file_location(key, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception:
        del sys.modules[key]
        raise
    return mod


def sibling(file: str, name: str):
    """From inside a target's Python file: the module `name`.py beside it (`sibling(__file__, "gguf")`)."""
    return load_file(Path(file).resolve().parent / f"{name}.py")
