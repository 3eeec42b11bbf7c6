"""Small C steps for e2e engines: compile an object once (content-addressed), link an engine, run it.

An engine linked with a candidate library runs the candidate's host code (constructors, static
initialisers) as well as its kernels, so `run_engine` starts it inside porter.host.sandbox like the parity
child: it sees only the files its run names, read-only, and writes only its output folder."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from porter.host import sandbox
from porter.errors import PorterError

COMPILE_TIMEOUT_S = 300


def cc_path() -> str:
    for name in (os.environ.get("CC") or "", "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise PorterError("no C compiler (cc, gcc or clang) on PATH: the e2e gate builds the target's engine with one")


def _run(cmd: list[str], what: str, cwd: Path | None = None, timeout: float = COMPILE_TIMEOUT_S) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout)
    if proc.returncode != 0:
        first = next((l for l in (proc.stderr + proc.stdout).splitlines() if "error" in l), (proc.stderr or "?").strip()[:300])
        raise PorterError(f"{what} failed: {first}")


def compile_object(src: Path, out_dir: Path, flags: list[str], includes: list[Path]) -> Path:
    """cc -c src with flags; the object is named by the sha256 of what made it, so it is built once."""
    key = hashlib.sha256(Path(src).read_bytes() + "\0".join(flags).encode() + b"".join(
        p.read_bytes() for inc in includes for p in sorted(Path(inc).glob("*.h")))).hexdigest()[:20]
    obj = Path(out_dir) / f"{Path(src).stem}-{key}.o"
    if not obj.is_file():
        obj.parent.mkdir(parents=True, exist_ok=True)
        tmp = obj.with_suffix(f".{os.getpid()}.tmp.o")
        _run([cc_path(), *flags, *(f"-I{i}" for i in includes), "-c", "-o", str(tmp), str(src)], f"cc {Path(src).name}")
        os.replace(tmp, obj)
    return obj


def link(out: Path, objects: list[Path], *, library: Path | None = None, wrap: list[str] = (),
         libs: list[str] = ("-lm",)) -> Path:
    cmd = [cc_path(), "-o", str(out), *map(str, objects)]
    if library is not None:
        lib = Path(library).resolve()
        cmd += [str(lib), f"-Wl,-rpath,{lib.parent}"]
    cmd += [f"-Wl,--wrap={s}" for s in wrap]
    cmd += list(libs)
    out.parent.mkdir(parents=True, exist_ok=True)
    _run(cmd, f"link {out.name}")
    return out


def _runtime_library_path() -> str:
    """LD_LIBRARY_PATH for an engine linked with a CUDA library: the toolkit's lib dirs (libcudart is
    found there when it is not in the loader's cache), then the driver's folders the sandbox shows."""
    dirs = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        from porter.host.toolchain import toolkit_root

        root = toolkit_root(nvcc)
        dirs = [str(d) for d in (root / "lib64", root / "lib") if d.is_dir()]
    return ":".join(dirs + sandbox.cuda_dirs())


def run_engine(cmd: list[str], *, reads: list[Path], writes: list[Path], env: dict | None = None,
               timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """cmd (an engine executable and its arguments) inside the sandbox with the GPU: `reads` are shown
    read-only (the executable, the libraries it links, the model, inputs), `writes` writable (its output
    folder); env is the whole environment of the run besides the sandbox's own.  A timeout kills the
    sandbox and everything in it (subprocess.TimeoutExpired propagates)."""
    inside = {"LD_LIBRARY_PATH": _runtime_library_path(), **(env or {})}
    w = sandbox.wrap(list(map(str, cmd)), ro=[str(p) for p in reads], rw=[str(p) for p in writes], gpu=True,
                     env=inside, cwd=str(cwd or writes[0]), python=False)
    # its text is a diagnostic the candidate writes: bytes that are not UTF-8 must not raise in porter
    return subprocess.run(w.argv, env=w.env, capture_output=True, text=True, errors="replace",
                          timeout=timeout, close_fds=True)


def read_engine_output(path: Path, max_bytes: int) -> bytes:
    """The bytes of a file an engine run wrote, read by porter: a regular file of at most max_bytes.
    The run could write anything in its output folder, including a link to a host file porter may read
    and the sandbox may not, or a file too big to load; each is a PorterError (the candidate's failure)."""
    with open_engine_output(path, max_bytes) as (f, _size):
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise PorterError(f"{Path(path).name} grew past {max_bytes} bytes while read")
    return data


@contextlib.contextmanager
def open_engine_output(path: Path, max_bytes: int):
    """(binary file, size) of a file an engine run wrote, for a reader that streams it (a GB of logits rows):
    the checks of read_engine_output (no link, a regular file, at most max_bytes), each a PorterError."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise PorterError(f"the engine wrote no {Path(path).name}") from None
    except OSError as exc:
        raise PorterError(f"{Path(path).name} is not a file porter reads ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PorterError(f"{Path(path).name} is not a regular file")
        if st.st_size > max_bytes:
            raise PorterError(f"{Path(path).name} has {st.st_size} bytes, more than the {max_bytes} expected")
        with os.fdopen(fd, "rb", closefd=False) as f:
            yield f, st.st_size
    finally:
        os.close(fd)
