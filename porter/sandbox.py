"""The sandbox every process that compiles, loads or runs candidate code starts in.

A candidate is code an LLM wrote: its host code (constructors, static
initialisers, inline asm) runs with the rights of the process that loads it.
So such a process sees only what it needs, read-only, and nothing of the user:

    w = sandbox.wrap(argv, ro=[lib_dir], rw=[plan_dir], gpu=True)
    subprocess.Popen(w.argv, env=w.env, close_fds=True, ...)

The mechanism is bubblewrap (`bwrap`): the Debian package Flatpak uses, kept
up to date, unprivileged (Linux user namespaces), and measured to run CUDA on
our H100 hosts.  Inside: new user, pid, net, ipc, uts and cgroup namespaces
(no network; bwrap's init is pid 1, so every descendant -- a setsid daemon
too -- dies with the sandbox), no capabilities (we run as root on CI and on the
GPU hosts), a cleared environment with HOME=/nonexistent, a private /tmp, a
fresh /proc, a minimal /dev plus the GPU's nodes, read-only binds of the
interpreter, its packages and the CUDA libraries, and only the folders the
caller names.  Never $HOME, $PORTER_HOME or the workspace: wrap() refuses a
bind that would expose one of them.  Limits: no core files, a file size
bound, a process count bound; never an address-space bound on a GPU (CUDA
reserves terabytes of virtual address space).

$PORTER_UNSAFE_NO_SANDBOX=1 (the CLI's --unsafe-no-sandbox) runs commands as
they are; label() then says "none" and evidence records it.
"""

from __future__ import annotations

import functools
import glob
import os
import resource
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass, field

from porter import toolchain

UNSAFE_ENV = "PORTER_UNSAFE_NO_SANDBOX"
INSTALL_HINT = "apt-get install bubblewrap"
HOME_INSIDE = "/nonexistent"
SYSTEM_RO = ("/usr", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")
MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64")  # /bin -> usr/bin on merged-/usr systems, real dirs elsewhere
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/dri")
CUDA_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING",
            "CUDA_PATH", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be made here; str() is one line naming what is missing and how to get it."""


@dataclass(frozen=True)
class Limits:
    """Resource bounds for everything in the sandbox (set hard, so the candidate cannot raise them)."""

    file_size: int | None = 64 << 30  # bytes one file may reach: outputs of real-size cases stay far below
    processes: int | None = 4096  # per real uid (the kernel exempts root: the pid namespace is the bound there)
    address_space: int | None = None  # never on a GPU
    open_files: int | None = 4096


@dataclass
class Wrapped:
    argv: list[str]
    env: dict[str, str]  # for Popen: bubblewrap itself gets no secrets either
    label: str  # "bubblewrap 0.8.0" or "none": what evidence records
    binds: list[tuple[str, str]] = field(default_factory=list)  # (kind, path), for tests and messages


def allow_unsafe(flag: bool) -> None:
    """--unsafe-no-sandbox: for this process and every child it starts (calibration, benches)."""
    if flag:
        os.environ[UNSAFE_ENV] = "1"
        print("porter: warning: --unsafe-no-sandbox: candidate code runs with your rights; "
              "evidence records \"sandbox\": \"none\"", file=sys.stderr)


def unsafe() -> bool:
    return os.environ.get(UNSAFE_ENV, "") not in ("", "0")


@functools.lru_cache(maxsize=1)
def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=1)
def version() -> str | None:
    exe = bwrap_path()
    if exe is None:
        return None
    try:
        out = toolchain.version_output(exe).strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or "bubblewrap"


def label() -> str:
    """What the evidence says about the sandbox candidate code ran in."""
    return "none" if unsafe() else (version() or "none")


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """Start one trivial sandbox (once per process): (True, version) or (False, one-line reason)."""
    if bwrap_path() is None:
        return False, f"bwrap not found: {INSTALL_HINT}"
    w = _bwrap(["/bin/true"], ro=(), rw=(), devices=(), gpu=False, env={}, limits=Limits(), cwd=None, tmp=None,
               python=False)
    try:
        p = subprocess.run(w.argv, env=w.env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bwrap did not start: {exc}"
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or ["no message"])[-1]
        if "namespace" in err or "Operation not permitted" in err or "uid map" in err:
            return False, (f"user namespaces disabled: {err} (sysctl kernel.unprivileged_userns_clone=1, "
                           "or user.max_user_namespaces > 0)")
        return False, f"bwrap failed: {err}"
    return True, version() or "bubblewrap"


def require() -> str:
    """The label to record; raises SandboxUnavailable unless the sandbox works or unsafe() was asked for."""
    if unsafe():
        return "none"
    ok, why = available()
    if not ok:
        raise SandboxUnavailable(f"cannot sandbox candidate code: {why} (or pass --unsafe-no-sandbox)")
    return why


def python_ro() -> list[str]:
    """The interpreter, its standard library and its packages (numpy, cupy and the pip CUDA libraries)."""
    paths = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        paths.add(site.getusersitepackages())
    return sorted(p for p in paths if os.path.exists(p))


def cuda_ro() -> list[str]:
    """The CUDA folders to show beyond /usr (which is shown whole)."""
    return [d for d in cuda_dirs() if not d.startswith("/usr/")]


def cuda_dirs() -> list[str]:
    """CUDA toolkit and driver library folders: where ldconfig and $LD_LIBRARY_PATH find them."""
    dirs = set()
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if ("libcuda.so" in line or "libnvidia" in line or "libcudart" in line) and "=>" in line:
            dirs.add(os.path.dirname(os.path.realpath(line.split("=>")[1].strip())))
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if d and os.path.isdir(d):
            dirs.add(os.path.realpath(d))
    for home in ("/usr/local/cuda", os.environ.get("CUDA_HOME") or "", os.environ.get("CUDA_PATH") or ""):
        if home and os.path.isdir(home):
            dirs.add(os.path.realpath(home))
    return sorted(dirs)


def gpu_devices() -> list[str]:
    return sorted(glob.glob("/dev/nvidia[0-9]*") + glob.glob("/dev/nvidia-caps/*")
                  + [p for p in GPU_NODES if os.path.exists(p)])


def _forbidden() -> list[str]:
    """Folders no sandbox may see: the user's home, porter's key folder, the signing key's folder."""
    out = [os.path.expanduser("~"), os.environ.get("PORTER_HOME") or os.path.expanduser("~/.config/porter")]
    key = os.environ.get("PORTER_SIGNING_KEY")
    if key:
        out.append(os.path.dirname(os.path.abspath(key)))
    return [os.path.realpath(p) for p in out if p]


def _check_bind(path: str, forbidden: list[str], *, writable: bool) -> None:
    """A bind may lie inside $HOME (a pyenv interpreter does) but never contain it, nor touch $PORTER_HOME."""
    real = os.path.realpath(path)
    for f in forbidden:
        contains = f == real or f.startswith(real.rstrip("/") + "/")
        inside_porter_home = f != forbidden[0] and real.startswith(f + "/")
        if contains or inside_porter_home:
            raise SandboxUnavailable(f"refusing to show {path} inside the sandbox: it exposes {f}")


def _limits_prefix(limits: Limits) -> list[str]:
    """prlimit(1) in front of the command: the limits are set before anything of it runs, and hard, so the
    candidate cannot raise them.  Not a preexec_fn: Python code between fork and exec deadlocks in a
    process with threads (measured: the build's compile chains hung in _execute_child during porter run)."""
    exe = shutil.which("prlimit")
    if exe is None:
        raise SandboxUnavailable("prlimit not found: apt-get install util-linux")
    pairs = [("core", resource.RLIMIT_CORE, 0), ("fsize", resource.RLIMIT_FSIZE, limits.file_size),
             ("nproc", resource.RLIMIT_NPROC, limits.processes), ("as", resource.RLIMIT_AS, limits.address_space),
             ("nofile", resource.RLIMIT_NOFILE, limits.open_files)]
    out = [exe]
    for name, res, value in pairs:
        if value is None:
            continue
        hard = resource.getrlimit(res)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)  # only root may raise a hard limit
        out.append(f"--{name}={value}:{value}")
    return out + ["--"]


def wrap(argv: list[str], *, ro: list = (), rw: list = (), devices: list = (), gpu: bool = False,
         env: dict | None = None, limits: Limits | None = None, cwd: str | None = None,
         tmp: str | None = None, python: bool = True) -> Wrapped:
    """argv run inside a sandbox (or as it is under --unsafe-no-sandbox).

    ro/rw: folders or files shown at their own path, read-only / writable.  devices: device nodes
    (gpu=True adds the NVIDIA nodes and the CUDA libraries).  env: the whole environment inside
    besides PATH, HOME, TMPDIR and the CUDA device selection.  tmp: a writable folder for TMPDIR
    (default: the sandbox's private /tmp).  cwd: where argv starts (default: the first rw folder)."""
    if unsafe():
        outer = dict(os.environ)
        outer.update(env or {})
        return Wrapped(_limits_prefix(limits or Limits()) + list(argv), outer, "none")
    require()
    return _bwrap(argv, ro=ro, rw=rw, devices=devices, gpu=gpu, env=env, limits=limits or Limits(), cwd=cwd,
                  tmp=tmp, python=python)


def _bwrap(argv, *, ro, rw, devices, gpu, env, limits, cwd, tmp, python) -> Wrapped:
    inside_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME_INSIDE, "TMPDIR": tmp or "/tmp",
                  "LANG": "C.UTF-8"}
    if gpu:
        inside_env.update({k: os.environ[k] for k in CUDA_ENV if k in os.environ})
        ld = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d and os.path.isdir(d)]
        ld += [d for d in cuda_dirs() if d not in ld]
        if ld:
            inside_env["LD_LIBRARY_PATH"] = ":".join(ld)
    inside_env.update(env or {})
    exe = bwrap_path()
    forbidden = _forbidden()
    binds: list[tuple[str, str]] = []
    args = [exe, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for k, v in sorted(inside_env.items()):
        args += ["--setenv", k, str(v)]
    for name in MERGED_USR:
        p = "/" + name
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # first: a bind below /tmp stays visible
    ro_all = [p for p in SYSTEM_RO if os.path.exists(p)]
    if python:
        ro_all += python_ro()
    if gpu:
        ro_all += cuda_ro() + [p for p in ("/sys",) if os.path.exists(p)]
    for p in ro_all + [str(x) for x in ro]:
        if not os.path.exists(p):
            continue
        _check_bind(p, forbidden, writable=False)
        args += ["--ro-bind", p, p]
        binds.append(("ro", p))
    for p in [str(x) for x in rw]:
        _check_bind(p, forbidden, writable=True)
        args += ["--bind", p, p]
        binds.append(("rw", p))
    for d in list(devices) + (gpu_devices() if gpu else []):
        args += ["--dev-bind", d, d]
        binds.append(("dev", d))
    where = cwd or (str(rw[0]) if rw else "/")
    args += ["--chdir", where, "--"]
    outer = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return Wrapped(_limits_prefix(limits) + args + list(argv), outer, version() or "bubblewrap", binds)
