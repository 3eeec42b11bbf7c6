"""Which GPU architectures a build is for.

A build must run on the GPU that judges it: a cubin for sm_90 does not load on
an sm_120 card (RTX PRO 6000) or an sm_121 one (GB10), and parity would then
refuse every candidate for the machine's sake.  So the architectures are, in
order: the ones the user names (`--arch sm_120`, or $PORTER_ARCH, comma
separated), else every kind of GPU this machine has (cupy, else nvidia-smi),
else the target's declared default ([cuda] default_arch: a CPU-only machine
still builds, for the GPU the target is usually run on).

    choose(default, named=None, found=None) -> ArchChoice   the pick, and how it was made
    detected() -> tuple[str, ...]                            the GPUs here ("sm_90", ...), once per process
    nvcc_flags(archs) -> list[str]                           what nvcc is given for them
    required(declared, named=None) -> tuple[str, ...]        the GPU kinds a verdict must hold on
    order(arch) -> tuple                                     sort key: sm_90 before sm_121

Required architectures ([cuda] required_archs, `--require-arch`, $PORTER_REQUIRE_ARCH) are a
different thing from the build's: a unit is verified only where parity and perf ran on a GPU of
every required kind; the build is made for all of them as well (Target.arch).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from porter.errors import PorterError

ENV = "PORTER_ARCH"
REQUIRE_ENV = "PORTER_REQUIRE_ARCH"
_NAME = re.compile(r"(sm_|compute_)?(\d{2,3})([af]?)")
_DOTTED = re.compile(r"(\d{1,2})\.(\d)")


def normalize(text: str) -> str:
    """'sm_120', '120', '12.0' -> 'sm_120'; 'compute_90' stays (a virtual architecture: PTX only, which the
    driver compiles for any GPU at least that new); a one-line PorterError otherwise."""
    s = str(text).strip().lower()
    dotted = _DOTTED.fullmatch(s)
    if dotted:
        return f"sm_{dotted.group(1)}{dotted.group(2)}"
    m = _NAME.fullmatch(s)
    if m is None:
        raise PorterError(f"GPU architecture {text!r} not understood: name it like sm_90, sm_120 or 12.0")
    return f"{m.group(1) or 'sm_'}{m.group(2)}{m.group(3)}"


def number(arch: str) -> int:
    """sm_90 -> 90, sm_120 -> 120 (sm_90a -> 90): for comparing architectures."""
    return int(_NAME.fullmatch(normalize(arch)).group(2))


def order(arch: str) -> tuple:
    """Sort key: sm_90 before sm_121 (as text, sm_121 would come first); a name that is no architecture last."""
    try:
        return (number(arch), arch)
    except (PorterError, AttributeError):
        return (1 << 30, arch)


def required(declared=(), named: str | None = None) -> tuple[str, ...]:
    """The architectures a verdict must hold on: the target's `declared` and those a run names
    (`named`, comma separated; $PORTER_REQUIRE_ARCH when None), each a real GPU kind, lowest first.
    A virtual one (compute_90) is refused in one line: a verdict is measured on a GPU, and no GPU is
    a compute_90."""
    if named is None:
        named = os.environ.get(REQUIRE_ENV) or ""
    out = []
    for text in [*declared, *str(named).split(",")]:
        if not str(text).strip():
            continue
        a = normalize(text)
        if not a.startswith("sm_"):
            raise PorterError(f"required GPU architecture {text!r} is virtual (PTX only): require a GPU kind "
                              "like sm_90 or sm_121")
        out.append(a)
    return tuple(sorted(dict.fromkeys(out), key=order))


def _from_cupy() -> list[str] | None:
    try:
        import cupy  # noqa: PLC0415 - optional: only a GPU machine has it
    except Exception:  # noqa: BLE001 - missing or broken (a CUDA-major mismatch raises at import)
        return None
    try:
        rt = cupy.cuda.runtime
        return [f"sm_{p['major']}{p['minor']}" for p in (rt.getDeviceProperties(i) for i in range(rt.getDeviceCount()))]
    except Exception:  # noqa: BLE001 - no driver, no device
        return None


def _from_nvidia_smi() -> list[str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.splitlines():
        try:
            found.append(normalize(line))
        except PorterError:
            continue  # "[N/A]" on a GPU the driver cannot query
    return found


@lru_cache(maxsize=None)
def detected() -> tuple[str, ...]:
    """Every distinct architecture of this machine's GPUs, lowest first; () without one."""
    found = _from_cupy() or _from_nvidia_smi()
    return tuple(sorted(set(found), key=number))


@dataclass(frozen=True)
class ArchChoice:
    archs: tuple[str, ...]
    how: str  # "named" (--arch / $PORTER_ARCH), "detected" (this machine's GPUs), "default" (the target's, no GPU here)

    def describe(self) -> str:
        why = {"named": "named by --arch / $PORTER_ARCH", "detected": "the GPUs of this machine",
               "default": "the target's default_arch: no GPU found here"}[self.how]
        return f"{', '.join(self.archs)} ({why})"


def choose(default: str, named: str | None = None, found: tuple[str, ...] | None = None) -> ArchChoice:
    """The architectures to build for: `named` (comma separated), else `found` (detected() when None),
    else `default`."""
    if named is None:
        named = os.environ.get(ENV) or None
    if named:
        archs = [normalize(a) for a in str(named).split(",") if a.strip()]
        if archs:
            return ArchChoice(tuple(dict.fromkeys(archs)), "named")
    found = detected() if found is None else found
    if found:
        return ArchChoice(tuple(found), "detected")
    return ArchChoice((normalize(default),), "default")


def nvcc_flags(archs: tuple[str, ...] | list[str]) -> list[str]:
    """One architecture: `-arch=sm_N` (its cubin and PTX, as nvcc's own shorthand); several: one
    -gencode each (nvcc then compiles once per architecture, unsplit: porter/gates/nvcc_split.py)."""
    if len(archs) == 1:
        return [f"-arch={archs[0]}"]
    out: list[str] = []
    for a in archs:
        n = a.split("_", 1)[1]
        out += ["-gencode", f"arch=compute_{n},code={a}"]
    return out


_ARCH_FLAG = re.compile(r"^(-arch|--gpu-architecture|-gencode|--generate-code|-code|--gpu-code)\b")


def arch_flag_in(flags: list[str]) -> str | None:
    """The first flag of `flags` that fixes an architecture (a target must declare default_arch instead)."""
    return next((f for f in flags if _ARCH_FLAG.match(f)), None)
