"""Facts about the tools and the machine a verdict was reached with, asked once per process.

Every gate's evidence names its toolchain (porter.records.evidence.gate_facts) and the build cache keys
objects by the compilers' identities: all of them ask here, so nvcc, nvidia-smi, a host compiler
and bwrap are each run at most once per process (and per path).  tests/test_toolchain.py fails
if another module asks a tool its --version.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from porter.errors import PorterError


@lru_cache(maxsize=None)
def version_output(exe: str, path_env: str | None = None) -> str:
    """`exe --version`'s stdout, asked once per process (PATH=path_env when given: a compiler wrapper
    finds its own tools there); OSError or subprocess.TimeoutExpired when the tool cannot say."""
    env = dict(os.environ, PATH=path_env) if path_env is not None else None
    return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60, env=env).stdout


def nvcc_release_line(nvcc: str) -> str:
    """nvcc's whole release line ("Cuda compilation tools, release 12.4, V12.4.131"): the build
    gate's evidence and its object cache key; PorterError when nvcc cannot say."""
    try:
        out = version_output(nvcc)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PorterError(f"{nvcc} --version failed: {exc}") from exc
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return next((line for line in lines if "release" in line), lines[-1] if lines else "unknown")


def nvcc_version() -> str | None:
    """The nvcc on PATH as "release 12.4, V12.4.131" (parity and e2e evidence); None without one."""
    exe = find_nvcc()
    if not exe:
        return None
    try:
        out = version_output(exe)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release [^\n]*", out)
    return m.group(0) if m else out.strip().splitlines()[-1:][0] if out.strip() else None


def compiler_identity(compiler: str, path_env: str) -> str:
    """A host compiler's --version text (part of the precompiled header's cache key)."""
    try:
        return version_output(compiler, path_env).strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


@lru_cache(maxsize=None)
def driver_facts() -> dict:
    """{"gpu", "driver"} of the first GPU nvidia-smi lists; {} without one."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    if not out:
        return {}
    name, _, drv = out[0].partition(",")
    return {"gpu": name.strip(), "driver": drv.strip()}


def host_facts(driver: dict | None = None) -> dict:
    """The toolchain of a verdict reached by running the backend: nvcc, GPU, driver, Python, numpy
    (`driver`: driver_facts(), asked now when not given)."""
    import numpy as np

    d = driver_facts() if driver is None else driver
    return {"nvcc": nvcc_version(), "gpu": d.get("gpu"), "driver": d.get("driver"),
            "python": platform.python_version(), "numpy": np.__version__}


def where_facts(executor: str, mode: str) -> dict:
    """The machine a parity run happens on, asked by the harness there (never by the child):
    host name, and in cuda mode its nvidia-smi's GPU and driver.  A Ray worker sends these back
    with the run's outputs (porter.gates.parity.cluster), so a verdict names the host it ran on."""
    return {"host": socket.gethostname(), "executor": executor, **(driver_facts() if mode == "cuda" else {})}


def arch_of(dev: dict) -> str | None:
    """"sm_90" from device.py's facts ("compute_capability": "9.0"); None for the host stand-in."""
    cc = str(dev.get("compute_capability") or "")
    m = re.fullmatch(r"(\d+)\.(\d+)", cc)
    return f"sm_{m.group(1)}{m.group(2)}" if m else None


def device_facts(dev: dict, mode: str, where: dict | None = None) -> dict:
    """host_facts, with what the parity child saw of its device (`dev`: device.py's facts) and the
    machine it ran on (`where`: where_facts() of that machine; default this one): its host, GPU,
    architecture and driver.  nvcc is this process's: the toolkit that built the library.
    nvidia-smi is asked only in cuda mode (the host stand-in's verdict names no driver)."""
    where = where or where_facts("local", mode)
    facts = host_facts({"gpu": where.get("gpu"), "driver": where.get("driver")})
    return dict(facts, gpu=dev.get("name") or facts["gpu"], driver_api_version=dev.get("driver_api_version"),
                cuda_runtime=dev.get("runtime_version"), cupy=dev.get("cupy"), arch=arch_of(dev),
                host=where.get("host"), executor=where.get("executor"))


def find_nvcc(env: dict | None = None) -> str | None:
    """The nvcc porter compiles with: the one on PATH, else $CUDA_HOME's, $CUDA_PATH's or the active conda
    environment's ($CONDA_PREFIX/bin); None without one."""
    env = os.environ if env is None else env
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX"):
        exe = Path(env.get(var) or "/nonexistent") / "bin" / "nvcc"
        if env.get(var) and exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    return None


def nvcc_path() -> str:
    """The nvcc porter compiles with (find_nvcc); a one-line PorterError when there is none."""
    path = find_nvcc()
    if path is None:
        raise PorterError(
            "nvcc not found on PATH, $CUDA_HOME, $CUDA_PATH or $CONDA_PREFIX: install the CUDA toolkit or add "
            "its bin/ folder to PATH (e.g. export PATH=/usr/local/cuda/bin:$PATH)"
        )
    return path


@lru_cache(maxsize=None)
def toolkit_root(nvcc: str) -> Path:
    """The CUDA toolkit's folder, as nvcc itself reports it (`TOP=` in its dryrun): the nvcc on
    PATH is often a wrapper script (/usr/local/bin/nvcc -> exec /usr/local/cuda-13.0/bin/nvcc,
    module systems), whose own path says nothing about where lib64/ is."""
    try:
        r = subprocess.run([nvcc, "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True, text=True,
                           timeout=60)
        m = re.search(r"^#\$ TOP=(.+)$", r.stderr, re.M)
        if m and Path(m.group(1).strip()).is_dir():
            return Path(m.group(1).strip()).resolve()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return Path(nvcc).resolve().parent.parent


# -- where the toolkit's headers and libraries are ------------------------------------------------
#
# One answer for three readers: `porter doctor` (is cublas_v2.h there?), the build's flags (-I, -L, -rpath)
# and the compile sandbox's read-only binds.  A header the doctor finds through a link that points out of
# the bound folders, or in a folder nvcc is never told about, was "found" and then "No such file" in the
# sandboxed build.  So every folder here is given by its real path, and the sandbox binds exactly these.

SYSTEM_INCLUDE = (Path("/usr/local/include"), Path("/usr/include"))
SYSTEM_LIB = tuple(Path(p) for p in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                                     "/usr/lib", "/lib/x86_64-linux-gnu", "/lib64"))


@dataclass(frozen=True)
class Toolkit:
    """Where a compile with `nvcc` finds `#include <...>` and `-l...`, by real path.

    include_dirs / lib_dirs: the toolkit's own folders, then `extra_*`, then the system's.
    extra_include / extra_lib: folders outside the toolkit that hold a library it lacks (cuBLAS from
    NVIDIA's pip wheel, a conda environment's, $CUDA_HOME's): the build passes them as -I / -L -rpath.
    ro: what the compile sandbox binds read-only (every folder above, and the real folders that links
    in them point to), less what sits under /usr (the sandbox shows /usr whole).
    notes: folders looked at and not used, with why."""

    nvcc: str
    root: Path
    include_dirs: tuple[Path, ...]
    lib_dirs: tuple[Path, ...]
    extra_include: tuple[Path, ...] = ()
    extra_lib: tuple[Path, ...] = ()
    ro: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def header(self, name: str) -> Path | None:
        """The real path of `#include <name>` as the compile finds it; None when no folder holds it."""
        return next(((d / name).resolve() for d in self.include_dirs if (d / name).is_file()), None)

    def library(self, name: str) -> Path | None:
        """The real path of what `-l<name>` links (lib<name>.so); None when no folder holds it."""
        return next(((d / f"lib{name}.so").resolve() for d in self.lib_dirs if (d / f"lib{name}.so").is_file()),
                    None)

    def library_versions(self, name: str) -> list[Path]:
        """lib<name>.so.<version> files in the library folders (NVIDIA's pip wheels ship only those, and
        the linker's -l<name> reads lib<name>.so)."""
        return sorted({p for d in self.lib_dirs for p in d.glob(f"lib{name}.so.*")})

    def flags(self) -> list[str]:
        """-I for each extra include folder (nvcc knows its own)."""
        return [a for d in self.extra_include for a in ("-I", str(d))]

    def link_flags(self) -> list[str]:
        """-L for each extra library folder, and -rpath to every toolkit and extra library folder: the
        parity child dlopens the backend, and a library it links (-lcublas) must resolve there even when
        the loader's path lacks the toolkit."""
        system = set(_real_dirs(SYSTEM_LIB))
        toolkit_own = [d for d in self.lib_dirs if d not in self.extra_lib and d not in system]
        return ([a for d in self.extra_lib for a in ("-L", str(d))]
                + [a for d in (*toolkit_own, *self.extra_lib) for a in ("-Xlinker", "-rpath", "-Xlinker", str(d))])


def _real_dirs(paths) -> list[Path]:
    return list(dict.fromkeys(Path(os.path.realpath(p)) for p in paths if Path(p).is_dir()))


def _own_dirs(root: Path) -> tuple[list[Path], list[Path]]:
    """A toolkit's include and library folders: its include/ and targets/*/include (with cccl/ for cub and
    thrust), lib64/, lib/ (conda's) and targets/*/lib."""
    inc = [root / "include", *sorted(root.glob("targets/*/include"))]
    inc += [d / "cccl" for d in list(inc)]
    lib = [root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib"))]
    lib = [d for d in lib if d.is_dir() and any(d.glob("libcudart.so*"))]
    return _real_dirs(inc), _real_dirs(lib)


def _site_dirs() -> list[Path]:
    """The Python environment's package folders (NVIDIA's wheels install under <one>/nvidia/<lib>/)."""
    import site

    found = [*sys.path, *getattr(site, "getsitepackages", lambda: [])(), site.getusersitepackages()]
    return [Path(p) for p in dict.fromkeys(found) if p and Path(p, "nvidia").is_dir()]


def _candidates(root: Path, env, site_dirs) -> list[tuple[str, Path, Path | None]]:
    """(what, include folder, library folder) outside the toolkit that may hold a library it lacks, in the
    order looked at: $CUDA_HOME, $CUDA_PATH, conda's environment, each NVIDIA pip wheel's folder."""
    out: list[tuple[str, Path, Path | None]] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var) and Path(env[var]).is_dir() and Path(env[var]).resolve() != root:
            inc, lib = _own_dirs(Path(env[var]).resolve())
            out += [(f"${var} ({env[var]})", i, lib[0] if lib else None) for i in inc if "cccl" not in i.parts]
    if env.get("CONDA_PREFIX") and Path(env["CONDA_PREFIX"]).is_dir():
        conda = Path(env["CONDA_PREFIX"]).resolve()
        if conda != root:
            for t in sorted(conda.glob("targets/*")):
                out.append((f"conda ({conda})", t / "include", t / "lib"))
            out.append((f"conda ({conda})", conda / "include", conda / "lib"))
    for sp in site_dirs:
        if not Path(sp, "nvidia").is_dir():
            continue
        for pkg in sorted(Path(sp, "nvidia").iterdir()):
            if pkg.is_dir():
                lib = pkg / "lib"
                out.append((f"pip wheel nvidia/{pkg.name} ({sp})", pkg / "include", lib if lib.is_dir() else None))
    return [(w, Path(os.path.realpath(i)), Path(os.path.realpath(lb)) if lb else None) for w, i, lb in out
            if i.is_dir() or (lb is not None and lb.is_dir())]


def _names(folder: Path | None, pattern: str) -> set[str]:
    return {p.name for p in folder.glob(pattern)} if folder is not None and folder.is_dir() else set()


def _lib_stems(folder: Path | None) -> set[str]:
    """libcublas.so.12 -> libcublas: the libraries a folder holds, whatever their version suffix."""
    return {n.split(".so")[0] for n in _names(folder, "lib*.so*")}


def _link_targets(folders) -> list[Path]:
    """The real folders that the links in `folders` (one level) point to: a toolkit's lib64/libcublas.so
    may be a link into another tree, and the sandbox must show where it lands."""
    out = []
    for d in folders:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.is_symlink():
                real = Path(os.path.realpath(e.path))
                if real.exists():
                    out.append(real if real.is_dir() else real.parent)
    return out


def locate(nvcc: str, env: dict | None = None, site_dirs: list[Path] | None = None) -> Toolkit:
    """Where `nvcc`'s toolkit and the libraries it lacks are (see Toolkit).  A folder outside the toolkit is
    used only when none of its headers and libraries is one the toolkit already has: a second copy of
    cuda_runtime.h given with -I would be read before the toolkit's own."""
    env = os.environ if env is None else env
    root = toolkit_root(nvcc)
    inc, lib = _own_dirs(root)
    have_h = set().union(*(_names(d, "*.h") for d in inc)) if inc else set()
    have_l = set().union(*(_lib_stems(d) for d in lib)) if lib else set()
    extra_inc: list[Path] = []
    extra_lib: list[Path] = []
    notes: list[str] = []
    for what, i, lb in _candidates(root, env, _site_dirs() if site_dirs is None else site_dirs):
        headers, libs = _names(i, "*.h"), _lib_stems(lb)
        new_h, new_l = headers - have_h, libs - have_l
        if not new_h and not new_l:
            continue
        clash = sorted((headers & have_h) | (libs & have_l))
        if clash:
            notes.append(f"{what}: not used, it also holds the toolkit's {', '.join(clash[:3])}"
                         f"{' ...' if len(clash) > 3 else ''} (a second copy would shadow {root}'s)")
            continue
        if i.is_dir() and new_h:
            extra_inc.append(i)
            have_h |= headers
        if lb is not None and new_l:
            extra_lib.append(lb)
            have_l |= libs
    inc_all = _real_dirs([*inc, *extra_inc, *SYSTEM_INCLUDE])
    lib_all = _real_dirs([*lib, *extra_lib, *SYSTEM_LIB])
    binds = [Path(nvcc), Path(nvcc).resolve(), root, *inc, *lib, *extra_inc, *extra_lib,
             *_link_targets([*inc, *lib, *extra_inc, *extra_lib])]
    ro = [str(p) for p in dict.fromkeys(binds) if not Path(p).is_relative_to("/usr")]
    # a folder inside another bound one is shown by it
    ro = [p for p in ro if not any(q != p and Path(p).is_relative_to(q) and Path(q).is_dir() for q in ro)]
    return Toolkit(nvcc, root, tuple(inc_all), tuple(lib_all), tuple(extra_inc), tuple(extra_lib), tuple(ro),
                   tuple(notes))


@lru_cache(maxsize=None)
def toolkit(nvcc: str) -> Toolkit:
    """locate(nvcc) for this process's environment, asked once."""
    return locate(nvcc)


def toolkit_lib_dirs(nvcc: str) -> list[Path]:
    """The library folders of the toolkit and of the libraries it lacks (not the system's)."""
    system = set(_real_dirs(SYSTEM_LIB))
    return [d for d in toolkit(nvcc).lib_dirs if d not in system]


def toolkit_rpath(nvcc: str) -> list[str]:
    """The link flags every backend library gets: -L to the libraries the toolkit lacks and -rpath to
    every toolkit library folder (Toolkit.link_flags)."""
    return toolkit(nvcc).link_flags()


def cuda_device_here() -> tuple[bool, str]:
    """(True, what) when cupy is importable here and sees a CUDA device; else (False, why).  Parity's own
    check of this machine, and what a Ray worker asks of its host before taking a job (cluster.GateWorker.hello)."""
    if importlib.util.find_spec("cupy") is None:
        return False, "cupy is not installed (pip install 'porter[gpu]'); parity needs cupy and an NVIDIA GPU"
    probe = "import cupy; print(cupy.cuda.runtime.getDeviceCount())"
    try:
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"cannot probe for a CUDA device: {exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
        return False, f"no usable CUDA device ({last[:200]})"
    try:
        n = int(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False, "no usable CUDA device (device count unreadable)"
    if n < 1:
        return False, "no CUDA device visible"
    return True, f"{n} CUDA device(s) visible to cupy"
