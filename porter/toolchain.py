"""Facts about the tools and the machine a verdict was reached with, asked once per process.

Every gate's evidence names its toolchain (porter.evidence.gate_facts) and the build cache keys
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
    exe = shutil.which("nvcc")
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


def nvcc_path() -> str:
    """The nvcc on PATH; a one-line PorterError when there is none."""
    path = shutil.which("nvcc")
    if path is None:
        raise PorterError(
            "nvcc not found on PATH: install the CUDA toolkit or add its bin/ folder to PATH "
            "(e.g. export PATH=/usr/local/cuda/bin:$PATH)"
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


def toolkit_lib_dirs(nvcc: str) -> list[Path]:
    root = toolkit_root(nvcc)
    return [d for d in (root / "lib64", root / "targets" / "x86_64-linux" / "lib") if d.is_dir()]


def toolkit_rpath(nvcc: str) -> list[str]:
    """-rpath to the toolkit's library folders: the parity child dlopens the backend, and a
    library it links (-lcublas) must resolve there even when the loader's path lacks the toolkit."""
    return [a for d in toolkit_lib_dirs(nvcc) for a in ("-Xlinker", "-rpath", "-Xlinker", str(d))]


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
