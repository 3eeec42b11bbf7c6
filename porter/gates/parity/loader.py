"""The one module of porter that loads a library into a process: the parity child's candidate, libc
and the CUDA runtime.

Loaded by path (a sibling of child.py, like device.py): ctypes only, nothing of porter.  Both kinds
of plan (op specs in child.py, runtime scenarios in scenario_child.py) get the library, its
functions, the unit's stream and the CUDA error state from here, so a change to how a candidate is
loaded is made once.  tests/test_candidate_loader.py fails if any other module of porter calls
ctypes.CDLL, ctypes.cdll, LoadLibrary or dlopen.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path


class Tensor(ctypes.Structure):
    """The target's tensor descriptor {void *data; uint64_t bytes; int32_t owner}: the layout every
    target's conventions header gives its tensor struct (op arguments, scenario handles)."""

    _fields_ = [("data", ctypes.c_void_p), ("bytes", ctypes.c_uint64), ("owner", ctypes.c_int32)]


class Fatal(Exception):
    """A plan cannot go on (check "load": the library or a function is missing)."""

    def __init__(self, check: str, detail: str):
        super().__init__(detail)
        self.check, self.detail = check, detail


def load(path: str):
    """The candidate, dlopened RTLD_NOW (an unresolved symbol fails here, not at some later call)
    and RTLD_LOCAL (its symbols resolve nothing loaded after it: a warm worker's next job)."""
    try:
        return ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        raise Fatal("load", f"cannot load {Path(path).name}: {exc}") from None


def cuda_runtime():
    """The CUDA runtime cupy already loaded (same primary context), for calls cupy does not bind
    (device.py: the persisting-L2 reset); None when no runtime library is found."""
    for name in ("libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def cuda_driver():
    """The CUDA driver (libcuda.so.1), for the virtual memory calls the checker's shared arenas use
    (shared_mem.py); None where there is none (a host without a GPU)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def libc():
    """The process's own C library (dlopen(NULL)): mallinfo2 measures host-mode memory in use."""
    return ctypes.CDLL(None)


def function(lib, name: str | None, restype, argtypes: list, required: bool = False):
    """`name` of `lib` with its types set; None when it has no such symbol (Fatal when `required`)."""
    f = getattr(lib, name, None) if name else None
    if f is None and required:
        raise Fatal("load", f"{Path(lib._name).name} does not export {name}")
    if f is not None:
        f.restype, f.argtypes = restype, argtypes
    return f


def unit_stream(lib, harness: dict) -> int | None:
    """The stream the unit orders its work on: 0 for a backend on the legacy default stream, the
    target's stream accessor's answer, or None where the library has none (nothing to probe)."""
    name = harness.get("stream")
    if name == "legacy":
        return 0
    f = function(lib, name, ctypes.c_void_p, [])
    return (f() or 0) if f is not None else None


def cuda_errors(lib):
    """A function that says which CUDA error a call left behind ("cudaErrorX (n)"), None when none;
    always None for a library without the CUDA runtime (the host stand-in)."""
    last = function(lib, "cudaGetLastError", ctypes.c_int, [])
    name = function(lib, "cudaGetErrorName", ctypes.c_char_p, [ctypes.c_int])

    def left() -> str | None:
        err = int(last()) if last is not None else 0
        if err == 0:
            return None
        text = name(err) if name is not None else None
        return f"{text.decode() if text else 'cudaError'} ({err})"
    return left
