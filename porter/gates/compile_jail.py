"""What a compiler reading candidate text may see: the toolchain, the folders its command names, nothing else.

A candidate's `#include "/home/me/.config/porter/signing_key"`, `.incbin` in
inline asm or any include trick the extract filter missed is read by the
compiler, and the compiler's diagnostics quote what it read.  So every process
that compiles or links candidate code (nvcc, its split steps, the precompiled
header's gcc, the host link) runs in a bubblewrap sandbox (porter/host/sandbox.py)
that sees, read-only: the CUDA toolkit, /usr (compilers, system headers and
libraries), the host compiler when it lives elsewhere, the folders the command
names with -I/-isystem/-include/-L and the inputs it names by absolute path;
read-write: the folder it runs in, its -o folder and the caller's scratch
folders (the precompiled-header cache).  Every other path is "No such file or
directory"; a folder that would show $HOME or $PORTER_HOME (the signing key)
is refused by sandbox.wrap.  Its environment is cleared to the variables the tools read
(PATH, locale, NVCC_* flags): API keys never reach it.

One sandbox per chain of steps, not per tool: bwrap costs 25-30 ms to start on
the 2-core machine, and a split compile runs seven tools.

Bounds (LIMITS): one assembler `.fill` line made a 200 MB object in 2.5 s, so
no file a compile or link writes may pass FILE_MAX (the tool dies of SIGXFSZ),
and no compiler process may hold more than MEM_MAX of heap (RLIMIT_DATA: a
compile uses no GPU, whose address space reservations that limit would break).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from porter.host import sandbox
from porter.errors import PorterError

SYSTEM_RO = ("/usr",)  # sandbox.py binds it too; named here so a command's own paths under it are not bound twice
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "LC_MESSAGES", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")
FILE_MAX = int(os.environ.get("PORTER_COMPILE_FILE_MAX", 256 << 20))  # an object, a .gch, the library
MEM_MAX = int(os.environ.get("PORTER_COMPILE_MEM_MAX", 16 << 30))  # cicc and ptxas on a large unit stay below
LIMITS = sandbox.Limits(file_size=FILE_MAX, data=MEM_MAX)
_DIR_FLAGS = ("-I", "-isystem", "-iquote", "-L", "--include-path", "--library-path")
_FILE_FLAGS = ("-include", "--pre-include")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a compile: what the tools read, never a key or token of the user's."""
    env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
    env.update(extra)
    return env


@lru_cache(maxsize=None)
def toolchain_ro(nvcc: str) -> tuple[str, ...]:
    """nvcc as named on PATH (often a wrapper script), its toolkit's folders and those of the libraries it
    lacks (porter.host.toolchain.locate), the host compiler's folder when it is not under /usr."""
    from porter.host.toolchain import toolkit

    # the folders `porter doctor` found the toolkit's headers and libraries in, and those it lacks (pip
    # wheels, conda, $CUDA_HOME), by real path: what the doctor found is what the compiler sees
    out = [nvcc, str(Path(nvcc).resolve()), *toolkit(nvcc).ro]
    for cc in (os.environ.get("NVCC_CCBIN"), "gcc", "g++"):
        found = shutil.which(cc) if cc else None
        if found:
            out.append(str(Path(found).resolve().parent.parent))
    return tuple(p for p in dict.fromkeys(out) if not Path(p).is_relative_to("/usr"))


def named_paths(argv: list[str]) -> list[str]:
    """Folders a compile or link command names: -I/-L folders, -include files, absolute inputs."""
    out: list[str] = []
    for i, a in enumerate(argv[1:], 1):
        prev = argv[i - 1]
        if prev in _DIR_FLAGS:
            out.append(a)
        elif prev in _FILE_FLAGS or (a.startswith("/") and os.path.isfile(a)):
            out.append(os.path.dirname(a))
        else:
            out += [a[len(f):] for f in ("-I", "-L") if a.startswith(f) and len(a) > 2 and a[2] == "/"]
    return [str(Path(p).resolve()) for p in out if p and os.path.isdir(p)]


@dataclass(frozen=True)
class Jail:
    ro: tuple[str, ...]
    rw: tuple[str, ...]

    def run(self, argv: list[str], env: dict[str, str], cwd: Path | None, timeout: float,
            text: bool = False) -> subprocess.CompletedProcess:
        try:
            w = sandbox.wrap(argv, ro=list(self.ro), rw=list(self.rw), env=env, python=False, limits=LIMITS,
                             cwd=str(cwd) if cwd is not None else None)
        except sandbox.SandboxUnavailable as exc:
            raise PorterError(f"the compiler runs sandboxed: {exc}") from None
        # --unsafe-no-sandbox runs the command as it is, but still without the user's keys
        return subprocess.run(w.argv, capture_output=True, text=text, cwd=cwd,
                              env=env if w.label == "none" else w.env, timeout=timeout)


def for_command(argv: list[str], cwd: Path | None, rw: list[Path | str] = ()) -> Jail:
    """The sandbox for one compile or link command run in `cwd`."""
    writable = [str(Path(p).resolve()) for p in (cwd, *rw) if p is not None]
    if "-o" in argv[:-1]:
        writable.append(str(Path(cwd or ".", argv[argv.index("-o") + 1]).resolve().parent))
    from porter.host.toolchain import nvcc_path

    # the toolkit of the nvcc on PATH, whatever runs (nvcc's dryrun names its g++ and tools bare)
    ro = [p for p in (*toolchain_ro(nvcc_path()), *named_paths(argv)) if not Path(p).is_relative_to("/usr")]
    return Jail(tuple(dict.fromkeys(ro)), tuple(dict.fromkeys(writable)))
