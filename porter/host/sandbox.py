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
too -- dies with the sandbox), no capabilities, no new user namespaces
(--disable-userns), a cleared environment with HOME=/nonexistent, a private
/tmp and /dev/shm of bounded size, a fresh /proc whose /proc/sys is
read-only, a read-only minimal /dev plus the nodes of the one GPU the process
may use, the few /sys folders CUDA reads (SYS_RO), read-only binds of the
interpreter, its packages and the CUDA libraries, and only the folders the
caller names.  Never $HOME, $PORTER_HOME or the workspace: wrap() refuses a
bind that would expose one of them.  Limits: no core files, a file size
bound, a process count bound; never an address-space bound on a GPU (CUDA
reserves terabytes of virtual address space): as root on cgroup v2 a cgroup of
its own bounds the sandbox's memory and processes (porter.host.cgroup_bound).

Never host root.  CI and the GPU hosts run porter as root, and a user
namespace made by root maps the sandbox's uid 0 to host uid 0: the files of
/proc/sys are root's, so a candidate could set kernel.core_pattern to a pipe
into its own script and crash (the kernel runs it as host root), and
RLIMIT_NPROC does not bind root.  So when porter is root, every command runs
as SANDBOX_UID (PORTER_SANDBOX_UID), a uid no account owns, in two steps:
bwrap runs as root without a user namespace and builds the mounts (a bind
source must only be reachable by root: the interpreter under /root, a test's
folder under /tmp/pytest-of-root), then setpriv drops to the sandbox uid, and
a second, unprivileged bwrap makes the user namespace (mapping that uid to
itself), the pid namespace and /proc.  One bwrap as the sandbox uid cannot
do it alone: bwrap resolves every bind source with the caller's uid, and
--bind-fd goes back through the path.  wrap() hands the writable folders
to the sandbox uid (hand_over); what the sandbox only reads must be readable
by others (porter's umask 022).  As any other user porter is unprivileged
already, and one bwrap runs with that user's uid.

$PORTER_UNSAFE_NO_SANDBOX=1 (the CLI's --unsafe-no-sandbox) runs commands as
they are; label() then says "none" and evidence records it.
"""

from __future__ import annotations

import functools
import glob
import grp
import os
import pwd
import resource
import shutil
import site
import stat
import subprocess
import sys
from dataclasses import dataclass, field

from porter.host import cgroup_bound
from porter.host import toolchain

UNSAFE_ENV = "PORTER_UNSAFE_NO_SANDBOX"
INSTALL_HINT = "apt-get install bubblewrap"
HOME_INSIDE = "/nonexistent"
SYSTEM_RO = ("/usr", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")
MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64")  # /bin -> usr/bin on merged-/usr systems, real dirs elsewhere
# every GPU's shared nodes; /dev/nvidiaN is the one GPU's own (gpu_devices)
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
CUDA_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING",
            "CUDA_PATH", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")
# What of /sys a GPU process reads, never /sys whole (root-only files, every device, the cgroup tree):
SYS_RO = (
    "/sys/devices/system/cpu",  # online and possible CPUs: the CUDA runtime's and numpy's thread counts
    "/sys/devices/system/node",  # NUMA nodes: libcuda places host memory near the GPU
    "/sys/bus/pci/devices",  # the GPU's PCI attributes (numa_node, resource); links into /sys/devices/pci*
    "/sys/devices/pci*",  # what those links point at
    "/sys/module/nvidia",  # the driver's parameters
    "/sys/module/nvidia_uvm",
)
SYS_ENV = "PORTER_SANDBOX_SYS"  # more /sys paths, ':'-separated, for a driver that reads others ("/sys": all)
# The host uid (and gid) every sandboxed command runs as when porter is root: no account's, above
# the ranges useradd, systemd and /etc/subuid hand out, below 2**31 (tools that read uids as signed
# ints).  One uid for all sandboxes: the compile jails share the precompiled-header folder and read
# each other's objects, and a warm parity worker is handed its plan after it started.
SANDBOX_UID_ENV, SANDBOX_GID_ENV = "PORTER_SANDBOX_UID", "PORTER_SANDBOX_GID"
SANDBOX_UID = 2_000_000_000


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be made here; str() is one line naming what is missing and how to get it."""


@dataclass(frozen=True)
class Limits:
    """Resource bounds for everything in the sandbox (set hard, so the candidate cannot raise them)."""

    file_size: int | None = 64 << 30  # bytes one file may reach: outputs of real-size cases stay far below
    # processes and threads of the uid the sandbox runs as; when porter is root that uid is
    # SANDBOX_UID, which every sandbox of the host shares, so this bounds all of them together
    processes: int | None = 4096
    address_space: int | None = None  # never on a GPU
    open_files: int | None = 4096
    data: int | None = None  # RLIMIT_DATA: heap and private writable memory of one process; never on a GPU
    tmp_size: int = 1 << 30  # bytes /tmp may hold (a tmpfs: memory), g++'s temporaries in a link
    shm_size: int = 256 << 20  # bytes /dev/shm may hold
    # bytes of memory the whole sandbox may hold (its cgroup's memory.max, where porter is root on cgroup
    # v2: porter.host.cgroup_bound); None: half of this machine's
    memory: int | None = None


@dataclass
class Wrapped:
    argv: list[str]
    env: dict[str, str]  # for Popen: bubblewrap itself gets no secrets either
    label: str  # "bubblewrap 0.8.0" or "none": what evidence records
    binds: list[tuple[str, str]] = field(default_factory=list)  # (kind, path), for tests and messages
    uid: int | None = None  # the host uid the command runs as; None: porter's own
    cgroup: str | None = None  # the cgroup bounding its memory and processes (porter.host.cgroup_bound)


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
    try:
        w = _bwrap(["/bin/true"], ro=(), rw=(), devices=(), gpu=False, gpu_index=None, env={}, limits=Limits(),
                   cwd=None, tmp=None, python=False)
    except SandboxUnavailable as exc:
        return False, str(exc)
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


def drops_privileges() -> bool:
    """Whether sandboxes run as SANDBOX_UID: porter is root (a non-root user is unprivileged already)."""
    return os.getuid() == 0 or os.geteuid() == 0


def sandbox_ids() -> tuple[int, int]:
    """(uid, gid) sandboxes run as when porter is root: $PORTER_SANDBOX_UID / $PORTER_SANDBOX_GID, else
    SANDBOX_UID for both.  SandboxUnavailable for root or an id an account or group owns."""
    try:
        uid = int(os.environ.get(SANDBOX_UID_ENV) or SANDBOX_UID)
        gid = int(os.environ.get(SANDBOX_GID_ENV) or uid)
    except ValueError:
        raise SandboxUnavailable(f"${SANDBOX_UID_ENV} and ${SANDBOX_GID_ENV} must be numbers") from None
    return _checked_ids(uid, gid)


@functools.lru_cache(maxsize=None)
def _checked_ids(uid: int, gid: int) -> tuple[int, int]:
    # (running processes of the uid are no sign of another owner: they are the sandboxes of porter
    # runs beside this one)
    for what, n, look in (("uid", uid, pwd.getpwuid), ("gid", gid, grp.getgrgid)):
        if not 0 < n < 2**32 - 2 or n == 65535:
            raise SandboxUnavailable(f"sandbox {what} {n} is not an unprivileged id: set ${SANDBOX_UID_ENV}")
        try:
            owner = look(n)[0]
        except KeyError:
            continue
        raise SandboxUnavailable(f"sandbox {what} {n} belongs to {owner!r}: set ${SANDBOX_UID_ENV} "
                                 f"(and ${SANDBOX_GID_ENV}) to an id no account or group has")
    return uid, gid


def hand_over(*paths) -> None:
    """Make folders (and what is in them) the sandbox uid's, so a sandbox can write there: a no-op
    unless porter is root.  Never follows a link, never gives away a file with a second name (a hard
    link a sandbox made to a file outside), never leaves the folder: a sandbox may have written
    there before."""
    if unsafe() or not drops_privileges():
        return
    uid, gid = sandbox_ids()
    for top in paths:
        top = os.fspath(top)
        try:
            st = os.lstat(top)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise SandboxUnavailable(f"refusing to hand {top} to the sandbox: it is a symbolic link")
        if not stat.S_ISDIR(st.st_mode):
            _give(top, None, uid, gid)
            continue
        for _root, dirs, files, dfd in os.fwalk(top, follow_symlinks=False):
            st = os.fstat(dfd)
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.fchown(dfd, uid, gid)
            for name in dirs + files:
                _give(name, dfd, uid, gid)


def _give(name: str, dfd: int | None, uid: int, gid: int) -> None:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if (st.st_uid, st.st_gid) == (uid, gid) or stat.S_ISDIR(st.st_mode):
        return  # folders: fwalk hands each one over from its own descriptor
    if stat.S_ISLNK(st.st_mode):
        os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
        return
    if not stat.S_ISREG(st.st_mode):
        return
    # by descriptor: the name may have become a link or another file since the stat
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dfd)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def let_read(path: str, uid: int, gid: int) -> None:
    """A read-only bind's top that the sandbox uid cannot read (mkdtemp's 0700 plan folder a checker
    reads, mkstemp's 0600 weight map) becomes the sandbox uid's: the bind keeps it read-only inside,
    and other users of the host get no more than before.  What lies below it is the umask's."""
    st = os.stat(path)
    need = (stat.S_IROTH | stat.S_IXOTH) if stat.S_ISDIR(st.st_mode) else stat.S_IROTH
    if st.st_uid == uid:
        need <<= 6
    elif st.st_gid == gid:
        need <<= 3
    if st.st_mode & need != need:
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            raise SandboxUnavailable(f"{path} is not readable by the sandbox's uid {uid} and has other names: "
                                     "make it readable by others")
        os.chown(path, uid, gid)


def visible_gpu(env: dict) -> int | None:
    """The one GPU a sandbox may use: CUDA_VISIBLE_DEVICES when it is one integer (a parity worker's,
    pool.py), else None (every GPU)."""
    v = (env.get("CUDA_VISIBLE_DEVICES") or "").strip()
    return int(v) if v.isdigit() else None


def gpu_minor(index: int) -> int:
    """N of /dev/nvidiaN for CUDA's device `index`: devices in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID,
    and FASTEST_FIRST among equal GPUs), the driver naming each one's minor number in
    /proc/driver/nvidia/gpus/<bus id>/information; `index` itself where the driver says nothing."""
    infos = sorted(glob.glob("/proc/driver/nvidia/gpus/*/information"))
    if index < len(infos):
        try:
            with open(infos[index]) as f:
                for line in f:
                    if line.startswith("Device Minor:"):
                        return int(line.split(":", 1)[1])
        except (OSError, ValueError):
            pass
    return index


def gpu_devices(index: int | None = None) -> list[str]:
    """The NVIDIA device nodes to show: the shared ones and GPU `index`'s own, or every GPU's (and
    /dev/dri) when index is None."""
    own = glob.glob("/dev/nvidia[0-9]*")
    if index is not None:
        mine = f"/dev/nvidia{gpu_minor(index)}"
        own = [d for d in own if d == mine]
    shared = [p for p in GPU_NODES if os.path.exists(p)] + glob.glob("/dev/nvidia-caps/*")
    if index is None and os.path.exists("/dev/dri"):
        shared.append("/dev/dri")
    return sorted(own + shared)


def sys_ro() -> list[str]:
    """The /sys paths a GPU sandbox sees: SYS_RO and $PORTER_SANDBOX_SYS, those that exist."""
    pats = list(SYS_RO) + [p for p in os.environ.get(SYS_ENV, "").split(":") if p]
    out: list[str] = []
    for pat in pats:
        if not (pat == "/sys" or pat.startswith("/sys/")):
            raise SandboxUnavailable(f"${SYS_ENV} names {pat}: only paths under /sys")
        out += [p for p in sorted(glob.glob(pat)) if p not in out]
    return out


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
             ("nofile", resource.RLIMIT_NOFILE, limits.open_files), ("data", resource.RLIMIT_DATA, limits.data)]
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
         gpu_index: int | None = None, env: dict | None = None, limits: Limits | None = None,
         cwd: str | None = None, tmp: str | None = None, python: bool = True, scratch: list = ()) -> Wrapped:
    """argv run inside a sandbox (or as it is under --unsafe-no-sandbox).

    scratch: folders made empty and writable (1777) in the sandbox's own root, nothing of the host's
    behind them (a warm parity worker links its plan's path there); binds below them stay visible.

    ro/rw: folders or files shown at their own path, read-only / writable (rw ones are handed to the
    sandbox uid).  devices: device nodes (gpu=True adds the NVIDIA nodes, the CUDA libraries and
    SYS_RO).  gpu_index: the one GPU whose node is shown (default: CUDA_VISIBLE_DEVICES's, when it
    names one; else every GPU's).  env: the whole environment inside besides PATH, HOME, TMPDIR and
    the CUDA device selection.  tmp: a writable folder for TMPDIR (default: the sandbox's private
    /tmp).  cwd: where argv starts (default: the first rw folder)."""
    if unsafe():
        outer = dict(os.environ)
        outer.update(env or {})
        return Wrapped(_limits_prefix(limits or Limits()) + list(argv), outer, "none")
    require()
    return _bwrap(argv, scratch=scratch, ro=ro, rw=rw, devices=devices, gpu=gpu, gpu_index=gpu_index, env=env,
                  limits=limits or Limits(), cwd=cwd, tmp=tmp, python=python)


class _Mounts:
    """bwrap's mount options in order, with every folder a mount point needs made 0755 first (bwrap
    0.8.0 makes them 0700: an unprivileged sandbox could not walk down to its own folders)."""

    def __init__(self):
        self.args: list[str] = []
        self.made: set[str] = {"/"}

    def parents(self, dest: str) -> None:
        parts = dest.rstrip("/").split("/")[1:-1]
        for i in range(1, len(parts) + 1):
            d = "/" + "/".join(parts[:i])
            if d not in self.made:
                self.made.add(d)
                self.args += ["--perms", "0755", "--dir", d]

    def add(self, *opts: str, dest: str) -> None:
        self.parents(dest)
        self.args += list(opts)
        self.made.add(dest.rstrip("/") or "/")


def _bwrap(argv, *, ro, rw, devices, gpu, gpu_index, env, limits, cwd, tmp, python, scratch=()) -> Wrapped:
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
    root = drops_privileges()
    uid, gid = sandbox_ids() if root else (None, None)
    forbidden = _forbidden()
    binds: list[tuple[str, str]] = []
    m = _Mounts()
    for name in MERGED_USR:
        p = "/" + name
        if os.path.islink(p):
            m.add("--symlink", os.readlink(p), p, dest=p)
        elif os.path.isdir(p):
            m.add("--ro-bind", p, p, dest=p)
    # /proc: the unprivileged bwrap mounts its own (below); as root the host's is shown to it, under
    # that one, for its setup (uid maps, user.max_user_namespaces=1), and hidden before argv runs
    if root:
        m.add("--bind", "/proc", "/proc", dest="/proc")
    # /dev: bwrap's minimal one, read-only once the nodes are in (a writable tmpfs of half the RAM
    # otherwise), /dev/shm its own bounded tmpfs
    m.add("--dev", "/dev", dest="/dev")
    shown = gpu_index if gpu_index is not None else visible_gpu(inside_env)
    if gpu and shown is not None:
        # CUDA numbers only the GPUs whose node it can open: with one node shown, that GPU is device 0
        # inside, and the host's index (1 on a two-GPU host) would name no device at all
        inside_env["CUDA_VISIBLE_DEVICES"] = "0"
    for d in list(devices) + (gpu_devices(shown) if gpu else []):
        m.add("--dev-bind", d, d, dest=d)
        binds.append(("dev", d))
    m.add("--perms", "1777", "--size", str(limits.shm_size), "--tmpfs", "/dev/shm", dest="/dev/shm")
    m.args += ["--remount-ro", "/dev"]
    # first: a bind below /tmp stays visible
    m.add("--perms", "1777", "--size", str(limits.tmp_size), "--tmpfs", "/tmp", dest="/tmp")
    ro_all = [p for p in SYSTEM_RO if os.path.exists(p)]
    if python:
        ro_all += python_ro()
    if gpu:
        ro_all += cuda_ro() + sys_ro()
    if root:  # the second bwrap and setpriv run inside the first
        ro_all += [p for p in (os.path.realpath(exe), shutil.which("setpriv") or "") if p and not p.startswith("/usr/")]
    for d in scratch:
        m.add("--perms", "1777", "--dir", str(d), dest=str(d))
    for p in ro_all + [str(x) for x in ro]:
        if not os.path.exists(p):
            continue
        _check_bind(p, forbidden, writable=False)
        if root:
            let_read(os.path.realpath(p), uid, gid)
        m.add("--ro-bind", p, p, dest=p)
        binds.append(("ro", p))
    for p in [str(x) for x in rw]:
        _check_bind(p, forbidden, writable=True)
        m.add("--bind", p, p, dest=p)
        binds.append(("rw", p))
    if root:
        hand_over(*[str(x) for x in rw])
    where = cwd or (str(rw[0]) if rw else "/")
    setenv = [a for k, v in sorted(inside_env.items()) for a in ("--setenv", k, str(v))]
    # the fresh /proc, and its /proc/sys read-only: sysctls are host root's (core_pattern)
    own_proc = ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    if not root:
        args = [exe, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                "--cap-drop", "ALL", "--clearenv", *setenv, *own_proc, *m.args, "--chdir", where, "--"]
        return Wrapped(_limits_prefix(limits) + args + list(argv), _outer_env(), version() or "bubblewrap", binds)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SandboxUnavailable("setpriv not found (porter runs as root, sandboxes as an unprivileged uid): "
                                 "apt-get install util-linux")
    # no user namespace here: root builds the mounts (it can reach every bind source) and keeps only
    # what setpriv needs to become the sandbox uid; its pid namespace's init ends everything with it
    outer = [exe, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID",
             "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP", "--clearenv", *setenv, *m.args,
             "--chdir", "/", "--"]  # not `where`: a folder handed over (0700, the sandbox uid's) shuts root out
    drop = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--"]
    inner = [exe, "--unshare-user", "--disable-userns", "--unshare-pid", "--die-with-parent",
             "--dev-bind", "/", "/", *own_proc, "--chdir", where, "--"]
    cg = cgroup_bound.job(limits.memory or cgroup_bound.default_memory(), limits.processes)
    shim = cgroup_bound.prefix(cg) if cg else []
    return Wrapped(shim + _limits_prefix(limits) + outer + drop + inner + list(argv), _outer_env(),
                   version() or "bubblewrap", binds, uid, str(cg) if cg else None)


def _outer_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
