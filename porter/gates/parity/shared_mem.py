"""Memory the checker owns and the candidate's process may only use: one arena per case.

The checker (checker.py) allocates every buffer a unit is called on -- inputs,
outputs, their guard bytes -- in an arena it can export as a file descriptor,
and hands that descriptor to the runner (child.py) over their socket.  The
runner maps it and passes pointers into it to the candidate; the checker reads
the same bytes through its own mapping, so what it compares is what the
candidate left in memory, not anything the candidate's process reports.

  HostArena  memfd_create + mmap(MAP_SHARED): the host stand-in (CI, no GPU).
  CudaArena  the CUDA driver's virtual memory API: cuMemCreate with a POSIX
             file descriptor handle, exported once and imported by the runner
             (cuMemImportFromShareableHandle + cuMemMap).  Unlike the legacy
             cudaIpc* handles it is a plain fd, so it crosses the sandboxes'
             separate pid and user namespaces (legacy IPC looks the exporter up
             by pid).

Loaded by path from the checker and the runner (numpy, ctypes and siblings only).
"""

from __future__ import annotations

import ctypes
import mmap
import os

ALIGN = 256  # cudaMalloc's alignment, kept for every payload
CU_MEM_HANDLE_TYPE_POSIX_FD = 1
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_READWRITE = 3


class ArenaError(Exception):
    """The arena could not be made or mapped (a driver refusal, a bad descriptor)."""


def layout(sizes: dict[str, int], guard: int) -> tuple[dict[str, int], int]:
    """{name: payload offset} and the arena's size: each buffer [guard | payload | guard], the payload
    256-aligned and the after-guard starting right at its end (a write one byte past it shows)."""
    off, out = 0, {}
    for name, n in sizes.items():
        off = -(-off // ALIGN) * ALIGN
        out[name] = off + guard
        off += 2 * guard + int(n)
    return out, max(-(-off // ALIGN) * ALIGN, ALIGN)


class HostArena:
    """Shared host memory: the checker's mapping and the runner's see the same pages."""

    kind = "host"

    def __init__(self, size: int, fd: int | None = None):
        self.size = int(size)
        if fd is None:
            fd = os.memfd_create("porter-arena", os.MFD_CLOEXEC)
            os.ftruncate(fd, self.size)
        elif os.fstat(fd).st_size < self.size:
            raise ArenaError(f"arena descriptor holds {os.fstat(fd).st_size} bytes, {self.size} expected")
        self.fd = fd
        self.map = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))

    def write(self, off: int, data: bytes) -> None:
        self.map[off:off + len(data)] = data

    def read(self, off: int, n: int) -> bytes:
        return bytes(self.map[off:off + n])

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a ctypes view still alive (the runner's descriptors): freed with the process
            pass
        os.close(self.fd)


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def _driver(loader_mod):
    cu = loader_mod.cuda_driver()
    if cu is None:
        raise ArenaError("libcuda.so.1 not found")
    return cu


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise ArenaError(f"{what}: CUresult {rc}")


class CudaArena:
    """Device memory exportable as a file descriptor.  `device`: the ordinal in this process (both
    processes see the one GPU of their sandbox).  The checker creates it (fd=None) and exports; the
    runner imports the fd it was sent.  Reads and writes go through `dev` (device.CudaDevice)."""

    kind = "cuda"

    def __init__(self, size: int, dev, loader_mod, fd: int | None = None):
        self.cu = cu = _driver(loader_mod)
        self.dev = dev
        prop = _Prop()
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FD
        prop.location = _Location(CU_MEM_LOCATION_TYPE_DEVICE, int(dev.device_id))
        gran = ctypes.c_size_t(0)
        _check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
        g = max(int(gran.value), 1)
        self.size = -(-int(size) // g) * g
        self.handle = ctypes.c_ulonglong(0)
        if fd is None:
            _check(cu.cuMemCreate(ctypes.byref(self.handle), ctypes.c_size_t(self.size), ctypes.byref(prop),
                                  ctypes.c_ulonglong(0)), "cuMemCreate")
            out = ctypes.c_int(-1)
            _check(cu.cuMemExportToShareableHandle(ctypes.byref(out), self.handle, CU_MEM_HANDLE_TYPE_POSIX_FD,
                                                   ctypes.c_ulonglong(0)), "cuMemExportToShareableHandle")
            self.fd = out.value
        else:
            _check(cu.cuMemImportFromShareableHandle(ctypes.byref(self.handle), ctypes.c_void_p(fd),
                                                     CU_MEM_HANDLE_TYPE_POSIX_FD), "cuMemImportFromShareableHandle")
            self.fd = fd
        ptr = ctypes.c_ulonglong(0)
        _check(cu.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(self.size), ctypes.c_size_t(g),
                                      ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        self.base = ptr.value
        _check(cu.cuMemMap(ctypes.c_ulonglong(self.base), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                           self.handle, ctypes.c_ulonglong(0)), "cuMemMap")
        access = _Access(_Location(CU_MEM_LOCATION_TYPE_DEVICE, int(dev.device_id)), CU_MEM_ACCESS_READWRITE)
        _check(cu.cuMemSetAccess(ctypes.c_ulonglong(self.base), ctypes.c_size_t(self.size), ctypes.byref(access),
                                 ctypes.c_size_t(1)), "cuMemSetAccess")

    def write(self, off: int, data: bytes) -> None:
        if data:
            self.dev.write(self.base + off, data)

    def read(self, off: int, n: int) -> bytes:
        return self.dev.read(self.base + off, n) if n else b""

    def close(self) -> None:
        cu = self.cu
        cu.cuMemUnmap(ctypes.c_ulonglong(self.base), ctypes.c_size_t(self.size))
        cu.cuMemAddressFree(ctypes.c_ulonglong(self.base), ctypes.c_size_t(self.size))
        cu.cuMemRelease(self.handle)
        try:
            os.close(self.fd)
        except OSError:
            pass


def make_arena(kind: str, size: int, dev=None, loader_mod=None, fd: int | None = None):
    if kind == "cuda":
        return CudaArena(size, dev, loader_mod, fd)
    return HostArena(size, fd)
