"""Linking the backend library with nvcc's own host link step alone.

`nvcc -shared` always runs a device link first (`nvcc --dryrun` lists it):

    nvlink  ->  fatbinary  ->  gcc -c link.stub  ->  g++ -shared (the device-link object + ours)

The device link resolves relocatable device code (-rdc / -dc).  Objects compiled
without it carry their own fatbinary and register it themselves, so the
device-link object holds nothing they use: PyTorch's extensions and CMake's
non-separable CUDA targets link such objects with the host compiler alone.
Here we keep nvcc's exact g++ line (its libraries, search paths and our flags)
and drop the device-link object, which measured 0.12-0.17 s of nvcc against
0.05 s of g++ for minimoe's library on the 2-core machine.

Anything but that shape (device code that needs linking, another nvcc whose
dryrun reads differently) links with plain nvcc, as does a host link that
fails, so link diagnostics are always nvcc's own.  PORTER_HOST_LINK=0 turns
this off.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from porter.gates import compile_jail, nvcc_split

ENABLED = os.environ.get("PORTER_HOST_LINK", "1") != "0"
# flags that make device code relocatable: its objects need the device link
_RDC = re.compile(r"^(-rdc(=true)?|--relocatable-device-code(=true)?|-dc|--device-c|-dlink|--device-link)$")


def needs_device_link(compile_flags: list[str]) -> bool:
    return any(_RDC.match(f) for f in compile_flags)


def host_link_command(nvcc_cmd: list[str], scratch: Path) -> tuple[list[str], dict] | None:
    """nvcc's final g++ line for this link without the device-link object, and its environment;
    None when the steps are not the shape we know.  nvcc's temporaries are named under a private
    TMPDIR in `scratch` (a dryrun writes none, but names them after its pid)."""
    tmpdir = Path(tempfile.mkdtemp(prefix=".nvcc-link-", dir=scratch))
    env = compile_jail.clean_env(TMPDIR=str(tmpdir))
    try:
        # the objects (each its content hash) and the output vary from link to link
        objects = [a for a in nvcc_cmd if a.endswith(".o")]
        steps = nvcc_split.dryrun_cached(nvcc_cmd, env, None, [str(tmpdir), *nvcc_split.output_of(nvcc_cmd), *objects])
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    tools = [nvcc_split.tool_name(s) for s in steps or []]
    if steps is None or tools != ["nvlink", "fatbinary", "rm", "gcc", "g++"]:
        return None
    try:
        stub_compile = shlex.split(steps[3])
        dlink_obj = stub_compile[stub_compile.index("-o") + 1]
        final = shlex.split(steps[4])
    except (ValueError, IndexError):
        return None
    if final.count(dlink_obj) != 1 or "-shared" not in final:
        return None
    final.remove(dlink_obj)
    # the private TMPDIR was for the dryrun's names: g++ writes its temporaries to its sandbox's /tmp
    env.pop("TMPDIR", None)
    return final, env


def link(nvcc_cmd: list[str], compile_flags: list[str], scratch: Path, timeout: float) -> str:
    """"ok" when the host link made the library, "unsplit" when this link needs (or may need)
    nvcc's device link, "failed" (the caller links with nvcc for its diagnostics) or "timeout"."""
    if not ENABLED or needs_device_link(compile_flags):
        return "unsplit"
    plan = host_link_command(nvcc_cmd, scratch)
    if plan is None:
        return "unsplit"
    cmd, env = plan
    try:  # the objects are the candidate's: g++ and ld run in the compiler's sandbox
        r = compile_jail.for_command(cmd, scratch).run(cmd, env, scratch, timeout, text=True)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "ok" if r.returncode == 0 else "failed"
