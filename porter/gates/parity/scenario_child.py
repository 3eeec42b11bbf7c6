"""The child side of a scenario spec: executes a plan of kind "scenario" (see scenario.py).

child.py hands such a plan here.  For each case it makes the calls in order
through ctypes (argument and return types from the API header, bound in the
parent), keeps the tensor handles the calls return, and records what each step
saw: return values, the host buffers calls wrote, raw tensor bytes read through
the target's descriptor on a stream ordered after nothing of the unit's, device
memory in use.  It holds the unit's stream with device.py's timed kernel when a
script asks, so work enqueued next stays pending until something waits for it.
It judges nothing: scenario.judge does, in the parent.

Loaded by path, like device.py and compare.py: numpy, ctypes and device.py
only -- nothing of porter.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
import traceback
from pathlib import Path

import numpy as np

KIND = "scenario"

_CT = {"u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
       "f32": ctypes.c_float, "f64": ctypes.c_double, "bool": ctypes.c_bool,
       "tensor": ctypes.c_void_p, "cvoid": ctypes.c_void_p, "void": ctypes.c_void_p, "cstr": ctypes.c_char_p}
_RT = {"none": None, "handle": ctypes.c_void_p, "ptr": ctypes.c_void_p, "u32": ctypes.c_uint32,
       "u64": ctypes.c_uint64, "i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float,
       "f64": ctypes.c_double, "bool": ctypes.c_bool}


class _Desc(ctypes.Structure):
    """The target's tensor descriptor {void *data; uint64_t bytes; int32_t owner} (mini_cuda.cuh; ds4's
    struct ds4_gpu_tensor has the same layout)."""

    _fields_ = [("data", ctypes.c_void_p), ("bytes", ctypes.c_uint64), ("owner", ctypes.c_int32)]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]


class _Fatal(Exception):
    def __init__(self, check: str, detail: str):
        super().__init__(detail)
        self.check, self.detail = check, detail


class ScenarioChild:
    def __init__(self, plan_dir: Path, plan: dict):
        self.dir = Path(plan_dir)
        self.plan = plan
        self.progress = open(self.dir / "progress.jsonl", "a", buffering=1)
        self.results: dict = {"kind": KIND, "cases": [], "fatal": None, "complete": False, "device": None}
        self.outputs: dict[str, np.ndarray] = {}
        self.maps: dict[str, np.ndarray] = {}
        self.fds: dict[str, int] = {}
        self.hold_token = None

    def step(self, **fields) -> None:
        self.progress.write(json.dumps(fields) + "\n")
        self.progress.flush()

    def save(self) -> None:
        tmp = self.dir / "results.json.tmp"
        tmp.write_text(json.dumps(self.results))
        os.replace(tmp, self.dir / "results.json")

    def load(self, devmod) -> None:
        plan = self.plan
        self.step(step="load", library=plan["library"])
        try:
            self.lib = ctypes.CDLL(plan["library"], mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as exc:
            raise _Fatal("load", f"cannot load {Path(plan['library']).name}: {exc}") from None
        self.fns = {}
        for name, sig in plan["functions"].items():
            f = getattr(self.lib, name, None)
            if f is None:
                raise _Fatal("load", f"{Path(plan['library']).name} does not export {name}")
            f.argtypes = [_CT[k] for k in sig["params"]]
            f.restype = _RT[sig["ret"]]
            self.fns[name] = (f, sig)
        h = plan.get("harness") or {}
        self.last_error = getattr(self.lib, "cudaGetLastError", None) if self.dev.kind == "cuda" else None
        if self.last_error is not None:
            self.last_error.restype, self.last_error.argtypes = ctypes.c_int, []
        name_fn = getattr(self.lib, "cudaGetErrorName", None) if self.last_error is not None else None
        if name_fn is not None:
            name_fn.restype, name_fn.argtypes = ctypes.c_char_p, [ctypes.c_int]
        self.error_name = name_fn
        self.stream = None
        if self.dev.kind == "cuda":
            if h.get("stream") == "legacy":
                self.stream = 0
            elif h.get("stream"):
                sf = getattr(self.lib, h["stream"], None)
                if sf is not None:
                    sf.restype, sf.argtypes = ctypes.c_void_p, []
                    self.stream = sf() or 0
        self.mallinfo2 = None
        if self.dev.kind == "host":
            try:
                libc = ctypes.CDLL(None)
                self.mallinfo2 = libc.mallinfo2
                self.mallinfo2.restype, self.mallinfo2.argtypes = _MallInfo2, []
            except (OSError, AttributeError):
                self.mallinfo2 = None

    def _err(self) -> str | None:
        if self.last_error is None:
            return None
        e = int(self.last_error())
        if e == 0:
            return None
        n = self.error_name(e) if self.error_name is not None else None
        return f"{n.decode() if n else 'cudaError'} ({e})"

    def _map(self, path: str) -> int:
        if path not in self.maps:
            self.maps[path] = np.memmap(path, dtype=np.uint8, mode="r")  # PROT_READ, MAP_SHARED: a real mmap
        return self.maps[path].ctypes.data

    def _fd(self, path: str) -> int:
        if path not in self.fds:
            self.fds[path] = os.open(path, os.O_RDONLY)
        return self.fds[path]

    def _mem(self) -> int | None:
        if self.dev.kind == "cuda":
            free_b, total_b = self.dev.rt.memGetInfo()
            return int(total_b) - int(free_b)
        if self.mallinfo2 is not None:
            m = self.mallinfo2()
            return int(m.uordblks) + int(m.hblkhd)
        return None

    def _raw(self, ptr: int, n: int) -> bytes:
        if self.dev.kind == "cuda":
            return self.dev.read_side(ptr, n)
        return ctypes.string_at(ptr, n)

    def run_case(self, case: dict, arrays) -> None:
        cid = case["id"]
        crec = {"id": cid, "steps": []}
        self.results["cases"].append(crec)
        handles: dict[str, int | None] = {}
        rets: dict[str, int | None] = {}
        peeks = [s["n"] for s in case["steps"] if s["op"] == "peek"]
        if peeks:
            self.dev.reserve(max(peeks))  # allocation-free side reads: nothing may synchronize during a hold
        for st in case["steps"]:
            sid, op = st["id"], st["op"]
            self.step(case=cid, step=f"{sid} {op}" + (f" {st['fn']}" if op == "call" else ""))
            rec: dict = {"id": sid, "op": op}
            if op == "call":
                f, sig = self.fns[st["fn"]]
                keep, cargs, outs = [], [], []
                for i, (a, k) in enumerate(zip(st["args"], sig["params"])):
                    kind = a["k"]
                    if kind == "tensor":
                        cargs.append(handles.get(a["name"]))
                    elif kind == "null":
                        cargs.append(None)
                    elif kind == "in":
                        data = np.asarray(arrays[f"{cid}.{a['npz']}"], dtype=np.uint8).tobytes()
                        buf = ctypes.create_string_buffer(data, max(len(data), 1))
                        keep.append(buf)
                        cargs.append(ctypes.cast(buf, ctypes.c_void_p))
                    elif kind == "out":
                        pre = np.asarray(arrays[f"{cid}.{a['npz']}"], dtype=np.uint8).tobytes()
                        buf = ctypes.create_string_buffer(pre, max(a["n"], 1))
                        keep.append(buf)
                        outs.append((i, buf, a["n"]))
                        cargs.append(ctypes.cast(buf, ctypes.c_void_p))
                    elif kind == "str":
                        cargs.append(a["v"].encode())
                    elif kind == "map":
                        cargs.append(self._map(a["path"]))
                    elif kind == "fd":
                        cargs.append(self._fd(a["path"]))
                    else:
                        cargs.append(a["v"])
                t0 = time.perf_counter()
                ret = f(*cargs)
                rec["ms"] = round((time.perf_counter() - t0) * 1e3, 3)
                if sig["ret"] in ("handle", "ptr"):
                    ret = int(ret) if ret else 0
                elif ret is not None:
                    ret = int(ret) if not isinstance(ret, float) else float(ret)
                rec["ret"] = ret
                rets[sid] = ret
                if st.get("save"):
                    handles[st["save"]] = ret or None
                for i, buf, n in outs:
                    self.outputs[f"{cid}.{sid}.out{i}"] = np.frombuffer(ctypes.string_at(buf, n), np.uint8).copy()
                rec["err"] = self._err()
            elif op in ("peek", "desc"):
                h = handles.get(st["tensor"])
                if not h:
                    rec["refused"] = f"no tensor {st['tensor']} (its allocating call failed)"
                else:
                    d = _Desc.from_address(h)
                    rec["desc"] = {"data": int(d.data or 0), "bytes": int(d.bytes), "owner": int(d.owner)}
                    if op == "peek":
                        if st["offset"] + st["n"] > d.bytes or not d.data:
                            rec["refused"] = (f"descriptor holds {d.bytes} bytes at {d.data or 0:#x}: cannot read "
                                              f"[{st['offset']}, {st['offset'] + st['n']})")
                        else:
                            raw = self._raw(int(d.data) + st["offset"], st["n"])
                            self.outputs[f"{cid}.{sid}"] = np.frombuffer(raw, np.uint8).copy()
            elif op == "host":
                p = rets.get(st["ptr_step"])
                if not p:
                    rec["refused"] = f"{st['ptr_step']} returned NULL"
                else:
                    self.outputs[f"{cid}.{sid}"] = np.frombuffer(ctypes.string_at(p + st["offset"], st["n"]),
                                                                 np.uint8).copy()
            elif op == "hold":
                if self.stream is not None and self.hold_token is None:
                    self.hold_token = self.dev.hold(self.stream, int(st["ms"] * 1e6))
                    rec["held"] = True
            elif op == "release":
                if self.hold_token is not None:
                    self.dev.release(self.hold_token)
                    self.hold_token = None
            elif op == "mem":
                rec["mem"] = self._mem()
            crec["steps"].append(rec)
        if self.hold_token is not None:
            self.dev.release(self.hold_token)
            self.hold_token = None

    def run(self, devmod) -> int:
        try:
            self.dev = devmod.make_device(self.plan["mode"])
            self.results["device"] = self.dev.facts()
            self.load(devmod)
            arrays = np.load(self.dir / "inputs.npz")
            for case in self.plan["cases"]:
                self.run_case(case, arrays)
                self.save()
                self.save_outputs()
            self.results["complete"] = True
            return 0
        except _Fatal as exc:
            self.results["fatal"] = {"check": exc.check, "detail": exc.detail, "at": None}
            return 4 if exc.check == "load" else 3
        except devmod.DeviceError as exc:
            self.results["fatal"] = {"check": "cuda-error", "detail": str(exc), "at": None}
            return 3
        finally:
            self.save()
            try:
                self.save_outputs()
            except Exception:  # noqa: BLE001 - best effort after a fatal error
                pass

    def save_outputs(self) -> None:
        np.savez(self.dir / "outputs.npz", **self.outputs)


def child_main(plan_dir: Path, plan: dict) -> int:
    """Entry point from child.py for plans of kind "scenario"."""
    import device as devmod  # sibling module, loaded by path by child.py

    try:
        return ScenarioChild(Path(plan_dir), plan).run(devmod)
    except Exception:  # noqa: BLE001 - a harness bug: say so on stderr, exit distinctly
        traceback.print_exc()
        return 5
