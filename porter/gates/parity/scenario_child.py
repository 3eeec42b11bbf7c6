"""The calls of a scenario plan (kind "scenario", see scenario.py), run by child.py.

child.py loads the library (loader.py) and hands each case here: the calls are
made in order through ctypes (argument and return types from the API header,
bound in the parent), the tensor handles the calls return are kept, and what
each step saw is recorded: return values, the host buffers calls wrote, raw
tensor bytes read through the target's descriptor on a stream ordered after
nothing of the unit's, device memory in use.  It holds the unit's stream with
device.py's timed kernel when a script asks, so work enqueued next stays
pending until something waits for it.  It judges nothing: scenario.judge does,
in the parent.

Loaded by path, like device.py and compare.py: numpy, ctypes and the siblings
only -- nothing of porter.
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

import loader  # sibling module, on the path child.py set

KIND = "scenario"

_CT = {"u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
       "f32": ctypes.c_float, "f64": ctypes.c_double, "bool": ctypes.c_bool,
       "tensor": ctypes.c_void_p, "cvoid": ctypes.c_void_p, "void": ctypes.c_void_p, "cstr": ctypes.c_char_p}
_RT = {"none": None, "handle": ctypes.c_void_p, "ptr": ctypes.c_void_p, "u32": ctypes.c_uint32,
       "u64": ctypes.c_uint64, "i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float,
       "f64": ctypes.c_double, "bool": ctypes.c_bool}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]


class ScenarioCalls:
    outputs_each_case = True

    def __init__(self, run):
        self.dev, self.plan, self.outputs, self.step = run.dev, run.plan, run.outputs, run.step
        self.results = run.results
        self.results["kind"] = KIND
        self.maps: dict[str, np.ndarray] = {}
        self.fds: dict[str, int] = {}
        self.hold_token = None
        self.fns = {}
        for name, sig in self.plan["functions"].items():
            f = loader.function(run.lib, name, _RT[sig["ret"]], [_CT[k] for k in sig["params"]], required=True)
            self.fns[name] = (f, sig)
        cuda = self.dev.kind == "cuda"
        self._err = loader.cuda_errors(run.lib) if cuda else (lambda: None)
        self.stream = loader.unit_stream(run.lib, self.plan.get("harness") or {}) if cuda else None
        self.mallinfo2 = None if cuda else loader.function(loader.libc(), "mallinfo2", _MallInfo2, [])

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
                    d = loader.Tensor.from_address(h)
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

    def finish(self) -> None:
        pass

