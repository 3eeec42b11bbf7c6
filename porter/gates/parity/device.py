"""Device access for the parity child: fenced raw buffers, the unit's stream, events.

Imported by the child process by file path, so it needs numpy, ctypes and (for
CUDA) cupy only -- never porter, pydantic or gguf.

Two devices share one interface:

  CudaDevice  raw cudaMalloc buffers through cupy's runtime bindings (no memory
              pool: a buffer's neighbours are our guards, not recycled arrays),
              the unit's stream held by a timed kernel for the stream probe,
              CUDA-event timing, device facts (name, peak bandwidth).
  HostDevice  plain host memory, for CI: a C library built with cc stands in for
              the backend, and every check that is not about streams runs the
              same code path without a GPU.
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

GUARD_BYTES = 16384  # per side; cudaMalloc alignment (256) is kept for the payload
H2D, D2H = 1, 2
CUDA_ERROR_NOT_READY = 600
STREAM_NON_BLOCKING = 1
EVENT_DISABLE_TIMING = 2
ATTR_MEMORY_CLOCK_KHZ = 36  # cudaDevAttrMemoryClockRate
ATTR_BUS_WIDTH_BITS = 37  # cudaDevAttrGlobalMemoryBusWidth
ATTR_L2_CACHE_BYTES = 38  # cudaDevAttrL2CacheSize
ATTR_CLOCK_KHZ = 13  # cudaDevAttrClockRate (SM clock)
LIMIT_PERSISTING_L2 = 0x06  # cudaLimitPersistingL2CacheSize
STREAM_ATTR_ACCESS_POLICY = 1  # cudaStreamAttributeAccessPolicyWindow (= cudaLaunchAttributeAccessPolicyWindow)
LAUNCH_ATTR_VALUE_BYTES = 64  # sizeof(cudaLaunchAttributeValue), CUDA 12: room for the window struct
_CUDART = []


def _cudart():
    """The CUDA runtime cupy already loaded (same primary context), for the calls cupy does not bind."""
    if not _CUDART:
        if __package__:  # imported as porter's module (the parent)
            from porter.gates.parity import loader
        else:  # loaded by path in the parity child, beside loader.py
            import loader
        lib = loader.cuda_runtime()
        if lib is not None:
            lib.cudaCtxResetPersistingL2Cache.restype = ctypes.c_int
            lib.cudaStreamSetAttribute.restype = ctypes.c_int
            lib.cudaStreamSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
            lib.cudaGetLastError.restype = ctypes.c_int
        _CUDART.append(lib)
    return _CUDART[0]

_HOLD_SRC = r"""
extern "C" __global__ void porter_parity_hold(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"""


class DeviceError(Exception):
    """A CUDA runtime error; after one the context may be unusable."""


class Fenced:
    """One allocation laid out as [guard | payload | guard]; the unit sees the payload.

    The guard bytes are fresh random bytes (os.urandom) per buffer, so no
    candidate can know them, and any write just outside the payload shows."""

    def __init__(self, dev: "Device", nbytes: int, guard: int = GUARD_BYTES):
        self.dev = dev
        self.nbytes = int(nbytes)
        self.guard = int(guard)
        self.base = dev.malloc(self.nbytes + 2 * self.guard)
        self.ptr = self.base + self.guard
        self.before = os.urandom(self.guard)
        self.after = os.urandom(self.guard)
        dev.write(self.base, self.before)
        dev.write(self.ptr + self.nbytes, self.after)

    def write(self, data: bytes) -> None:
        if len(data) != self.nbytes:
            raise ValueError(f"buffer holds {self.nbytes} bytes, got {len(data)}")
        if self.nbytes:
            self.dev.write(self.ptr, data)

    def read(self) -> bytes:
        return self.dev.read(self.ptr, self.nbytes) if self.nbytes else b""

    def guard_damage(self) -> list[dict]:
        """[{side, n_bytes, first}] for each guard that changed (first: distance from the payload)."""
        out = []
        got_b = self.dev.read(self.base, self.guard)
        got_a = self.dev.read(self.ptr + self.nbytes, self.guard)
        if got_b != self.before:
            a = np.frombuffer(self.before, np.uint8)
            b = np.frombuffer(got_b, np.uint8)
            d = np.flatnonzero(a != b)
            out.append({"side": "before", "n_bytes": int(d.size), "first": int(self.guard - 1 - d[-1])})
        if got_a != self.after:
            a = np.frombuffer(self.after, np.uint8)
            b = np.frombuffer(got_a, np.uint8)
            d = np.flatnonzero(a != b)
            out.append({"side": "after", "n_bytes": int(d.size), "first": int(d[0])})
        return out

    def free(self) -> None:
        self.dev.free(self.base)


class Device:
    kind = "abstract"

    def malloc(self, n: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def write(self, ptr: int, data: bytes) -> None: ...
    def read(self, ptr: int, n: int) -> bytes: ...
    def synchronize(self) -> None: ...
    def facts(self) -> dict: ...

    # stream probe and timing; the host device has no streams
    def reserve(self, n: int) -> None:
        """Make reads of up to n bytes allocation-free (the stream probe must not block)."""

    def sync_stream(self, stream: int) -> None:
        """Wait for `stream` alone (what a caller of the unit may rely on); the host has none."""

    def prewarm(self) -> None:
        """What can be made ready before a candidate is loaded (pre-started workers)."""

    def hold(self, stream: int, ns: int):
        return None

    def held(self, token) -> bool:
        return False

    def read_side(self, ptr: int, n: int) -> bytes:
        return self.read(ptr, n)

    def free_fraction(self) -> float:
        """Share of device memory still free."""
        return 1.0

    def flush_l2(self, stream: int) -> None:
        """Evict the L2 cache (a timed call must fetch its inputs from memory); no-op on the host."""

    def time_one(self, call, stream: int) -> float:
        t0 = time.perf_counter()
        call()
        return (time.perf_counter() - t0) * 1e3

    def reset_persisting_l2(self, stream: int) -> bool:
        """Return persisting L2 lines to normal and drop access-policy windows (True: done); the host has none."""
        return True

class HostDevice(Device):
    """Host memory standing in for device memory (CI, no GPU)."""

    kind = "host"

    def __init__(self):
        self._arrays: dict[int, np.ndarray] = {}

    def malloc(self, n: int) -> int:
        a = np.empty(max(int(n), 1) + 256, dtype=np.uint8)
        ptr = (a.ctypes.data + 255) // 256 * 256
        self._arrays[ptr] = a
        return ptr

    def free(self, ptr: int) -> None:
        self._arrays.pop(ptr, None)

    def write(self, ptr: int, data: bytes) -> None:
        ctypes.memmove(ptr, bytes(data), len(data))

    def read(self, ptr: int, n: int) -> bytes:
        return ctypes.string_at(ptr, n)

    def synchronize(self) -> None:
        pass

    def facts(self) -> dict:
        # no roofline for host memory, unless a test declares one ($PORTER_PARITY_HOST_PEAK_GBPS)
        peak = os.environ.get("PORTER_PARITY_HOST_PEAK_GBPS")
        return {"kind": "host", "name": "host memory (no GPU: CI stand-in)",
                "peak_gbps": float(peak) if peak else None, "peak_fp32_tflops": None}


class CudaDevice(Device):
    """cupy's runtime bindings; one device (the current one, respecting CUDA_VISIBLE_DEVICES)."""

    kind = "cuda"

    def __init__(self):
        import cupy

        self.cp = cupy
        self.rt = cupy.cuda.runtime
        self.device_id = self.rt.getDevice()
        self._call(self.rt.free, 0)  # create the primary context now, not inside the first timed call
        self.side = self._call(self.rt.streamCreateWithFlags, STREAM_NON_BLOCKING)
        self._pinned = 0
        self._pinned_size = 0
        self._hold = None
        self._flush, self._flush_n, self._flush_pass, self._events = 0, 0, 1, None

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self.cp.cuda.runtime.CUDARuntimeError as exc:
            raise DeviceError(str(exc)) from exc

    def malloc(self, n: int) -> int:
        return self._call(self.rt.malloc, max(int(n), 1))

    def free(self, ptr: int) -> None:
        self._call(self.rt.free, ptr)

    def write(self, ptr: int, data: bytes) -> None:
        buf = np.frombuffer(bytes(data), dtype=np.uint8)
        if buf.size:
            self._call(self.rt.memcpy, ptr, buf.ctypes.data, buf.size, H2D)

    def read(self, ptr: int, n: int) -> bytes:
        out = np.empty(int(n), dtype=np.uint8)
        if n:
            self._call(self.rt.memcpy, out.ctypes.data, ptr, int(n), D2H)
        return out.tobytes()

    def synchronize(self) -> None:
        self._call(self.rt.deviceSynchronize)

    def _pinned_buf(self, n: int) -> int:
        if n > self._pinned_size:
            if self._pinned:
                self._call(self.rt.freeHost, self._pinned)
            self._pinned = self._call(self.rt.hostAlloc, max(n, 4096), 0)
            self._pinned_size = max(n, 4096)
        return self._pinned

    def reserve(self, n: int) -> None:
        # cudaHostAlloc can synchronize the device: never let it happen while the stream is held
        self._pinned_buf(int(n))

    def _read_on(self, ptr: int, n: int, stream: int) -> bytes:
        if not n:
            return b""
        host = self._pinned_buf(n)
        self._call(self.rt.memcpyAsync, host, ptr, int(n), D2H, stream)
        self._call(self.rt.streamSynchronize, stream)
        return ctypes.string_at(host, n)

    def sync_stream(self, stream: int) -> None:
        self._call(self.rt.streamSynchronize, stream)

    def read_side(self, ptr: int, n: int) -> bytes:
        """Copy on a private non-blocking stream: ordered after nothing the unit enqueued."""
        return self._read_on(ptr, n, self.side)

    def prewarm(self) -> None:
        """Compile the hold kernel before any candidate is loaded: a pre-started worker's cupy
        cache is private to it (nothing compiled for one candidate is there for the next), so
        without this every verdict would pay NVRTC on its first probed call."""
        if self._hold is None:
            self._hold = self.cp.RawKernel(_HOLD_SRC, "porter_parity_hold")
        self._hold.compile()

    def hold(self, stream: int, ns: int):
        """Occupy `stream` with a kernel that spins for `ns` nanoseconds; returns an event
        recorded behind it (done = the hold is over)."""
        if self._hold is None:
            self._hold = self.cp.RawKernel(_HOLD_SRC, "porter_parity_hold")
        if stream:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ExternalStream: deprecated name, same object
                ext = self.cp.cuda.ExternalStream(int(stream))
        else:
            ext = self.cp.cuda.Stream.null  # the legacy default stream
        try:
            with ext:
                self._hold((1,), (1,), (np.uint64(ns),))
        except self.cp.cuda.runtime.CUDARuntimeError as exc:
            raise DeviceError(str(exc)) from exc
        ev = self._call(self.rt.eventCreateWithFlags, EVENT_DISABLE_TIMING)
        self._call(self.rt.eventRecord, ev, stream)
        return ev

    def held(self, token) -> bool:
        status = self.rt.eventQuery(token)
        if status == CUDA_ERROR_NOT_READY:
            return True
        if status != 0:
            raise DeviceError(f"cudaEventQuery: error {status}")
        return False

    def release(self, token) -> None:
        self._call(self.rt.eventSynchronize, token)
        self._call(self.rt.eventDestroy, token)

    def free_fraction(self) -> float:
        free, total = self._call(self.rt.memGetInfo)
        return free / total if total else 1.0

    def flush_l2(self, stream: int) -> None:
        if not self._flush:
            try:
                l2 = int(self.rt.deviceGetAttribute(ATTR_L2_CACHE_BYTES, self.device_id))
            except Exception:  # noqa: BLE001
                l2 = 0
            self._flush_n = 2 * max(l2, 64 << 20)  # twice L2 (or 64 MiB when unknown): nothing survives
            self._flush = self.malloc(self._flush_n)
        self._call(self.rt.memsetAsync, self._flush, self._flush_pass & 0xFF, self._flush_n, stream)
        self._flush_pass += 1

    def reset_persisting_l2(self, stream: int) -> bool:
        """A candidate can pin its inputs in L2 (cudaLimitPersistingL2CacheSize plus an access-policy window
        on the stream, or a launch attribute) so that a flush by plain writes does not evict them: before
        each timed call the persisting carve-out goes back to 0, every persisting line is reset to normal
        (cudaCtxResetPersistingL2Cache) and the unit's stream loses any window.  False where the runtime
        refused one of them (recorded: the evidence says the reset was not made)."""
        ok = True
        try:
            self.rt.deviceSetLimit(LIMIT_PERSISTING_L2, 0)
        except Exception:  # noqa: BLE001 - an old runtime or a GPU without persisting L2 (pre-sm_80)
            ok = False
        cudart = _cudart()
        if cudart is None:
            return False
        if cudart.cudaCtxResetPersistingL2Cache() != 0:
            ok = False
        attr = ctypes.create_string_buffer(LAUNCH_ATTR_VALUE_BYTES)  # an all-zero window: num_bytes 0
        if stream and cudart.cudaStreamSetAttribute(ctypes.c_void_p(stream), STREAM_ATTR_ACCESS_POLICY, attr) != 0:
            ok = False
        cudart.cudaGetLastError()  # nothing refused here may be blamed on the next call
        return ok

    def time_one(self, call, stream: int) -> float:
        if not self._events:
            self._events = (self._call(self.rt.eventCreate), self._call(self.rt.eventCreate))
        start, end = self._events
        self._call(self.rt.eventRecord, start, stream)
        call()
        self._call(self.rt.eventRecord, end, stream)
        self._call(self.rt.eventSynchronize, end)
        return float(self._call(self.rt.eventElapsedTime, start, end))

    def facts(self) -> dict:
        props = self.rt.getDeviceProperties(self.device_id)
        name = props.get("name", b"?")
        name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)

        def attr(code, key):
            try:
                return int(self.rt.deviceGetAttribute(code, self.device_id))
            except Exception:  # noqa: BLE001 - older/newer runtimes drop some attributes
                v = props.get(key)
                return int(v) if v else None

        clock_khz = attr(ATTR_MEMORY_CLOCK_KHZ, "memoryClockRate")
        bus_bits = attr(ATTR_BUS_WIDTH_BITS, "memoryBusWidth")
        peak = 2.0 * clock_khz * 1e3 * (bus_bits / 8) / 1e9 if clock_khz and bus_bits else None
        sm_khz, n_sm = attr(ATTR_CLOCK_KHZ, "clockRate"), props.get("multiProcessorCount")
        # FP32 lanes per SM: 64 on sm_80 (A100), 128 on sm_86 and later (Ada, Hopper, Blackwell)
        lanes = 64 if (props.get("major"), props.get("minor")) == (8, 0) else 128
        tflops = 2.0 * lanes * n_sm * sm_khz * 1e3 / 1e12 if sm_khz and n_sm and props.get("major", 0) >= 8 else None
        return {
            "kind": "cuda",
            "name": name,
            "compute_capability": f"{props.get('major')}.{props.get('minor')}",
            "multiprocessors": props.get("multiProcessorCount"),
            "memory_bytes": props.get("totalGlobalMem"),
            "memory_clock_khz": clock_khz,
            "memory_bus_bits": bus_bits,
            "peak_gbps": round(peak, 1) if peak else None,
            "peak_fp32_tflops": round(tflops, 1) if tflops else None,
            "l2_bytes": attr(ATTR_L2_CACHE_BYTES, "l2CacheSize"),
            "driver_api_version": self.rt.driverGetVersion(),
            "runtime_version": self.rt.runtimeGetVersion(),
            "cupy": self.cp.__version__,
        }


def make_device(kind: str) -> Device:
    if kind == "cuda":
        return CudaDevice()
    if kind == "host":
        return HostDevice()
    raise ValueError(f"unknown device kind {kind!r}")


def sleep_ms(ms: float) -> None:
    time.sleep(ms / 1e3)
