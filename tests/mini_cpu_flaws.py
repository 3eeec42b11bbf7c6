"""mini_cpu.c, and one-line edits of it, built as host-mode stand-ins: the known-good's stand-in for a
spec's new case, and each edit the flaw class that case exists to refuse (tests/test_minimoe_spec_edges_*)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CC = shutil.which("cc") or shutil.which("gcc")


def build(checkout: Path, out_dir: Path, flaws: dict, cflags=("-DMINI_CPU_DOT=float",), skip=lambda edit: False) -> dict:
    """{name: lib path} for each entry of `flaws` (name: (unit, edit or None, ...)): mini_cpu.c with
    edit[0], which must occur exactly once, replaced by edit[1]; `skip(edit)`: leave that one unbuilt."""
    src = (checkout / "mini_cpu.c").read_text()
    out = {}
    for name, (_, edit, *_rest) in flaws.items():
        text = src
        if edit:
            assert src.count(edit[0]) == 1, f"{name}: the edit's anchor is not one place of mini_cpu.c"
            if skip(edit):
                continue
            text = src.replace(edit[0], edit[1])
        (out_dir / f"{name}.c").write_text(text)
        subprocess.run([CC, "-O2", "-fPIC", "-shared", *cflags, "-I", str(checkout),
                        "-o", str(out_dir / f"lib{name}.so"), str(out_dir / f"{name}.c"), "-lm"], check=True)
        out[name] = out_dir / f"lib{name}.so"
    return out


def run_host(target, spec, lib: Path, workspace: Path, **kw):
    """`spec` judged on `lib` in host mode, untimed; a skip is a failure of the test, never a pass."""
    from porter.gates.parity import gate

    r = gate.run_spec(target, spec, lib, workspace=workspace, mode="host", timing_reps=0, **kw)
    assert not r.skipped, r.summary
    return r
