#!/usr/bin/env python3
"""Compare minimoe's CUDA backend (scripted good answers) with its CPU backend, op by op.

For a GPU machine.  Builds

  * libmini_cuda.so from cuda/mini_cuda_glue.cu + scripted/good/*.md (the one
    ```cuda block of each answer, compiled alone as the build gate does), and
  * libmini_cpu.so:  cc -O2 -shared -fPIC -o libmini_cpu.so mini_cpu.c -lm,

then, for each of the 14 op functions of mini_gpu.h, calls both backends
through ctypes with the SAME inputs (weights: the fixture's real tensors, read
from the same host copy of the GGUF file; activations: seeded, partly built
from the fixture's embedding rows), each through its own
tensor_alloc / tensor_write / tensor_read API, and prints a table: op, case,
shape, max abs error, max rel error (max abs error / max |cpu|), tolerance.
Index outputs (router top-k ids) must match exactly; error cases (bad token or
expert id) must fail on both backends.  Exit status 1 if any row fails.

Needs python3 + numpy, nvcc and cc.  The fixture is read with a small built-in
GGUF parser, so the gguf package is not needed on the GPU machine:

    python3 targets/minimoe/tools/compare_cuda_cpu.py --fixture runs/fixtures/minimoe.gguf

Without --fixture it uses runs/fixtures/minimoe.gguf and, if that is missing
and gguf is importable, writes it with targets/minimoe/make_fixture.py.
--dry-run builds both libraries, runs every case on the CPU backend only (no
CUDA call is made), and prints the plan; --self-test runs the whole comparison
with a second copy of the CPU library in place of the CUDA one (no GPU needed;
every row must come out exact).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TOOLS = Path(__file__).resolve().parent
TARGET_DIR = TOOLS.parent
ROOT = TARGET_DIR.parents[1]
sys.path.insert(0, str(TOOLS))
import build_scripted  # noqa: E402

DEFAULT_FIXTURE = ROOT / "runs" / "fixtures" / "minimoe.gguf"

# Tolerances on max|cuda-cpu| / max|cpu| (the CPU backend accumulates in double,
# the CUDA one in float with a different summation order).
TOL = {
    "embed_rows": 0.0,          # a widening copy: exact
    "rms_norm_plain_rows": 1e-5,
    "rms_norm_weight_rows": 1e-5,
    "matmul_q8_0": 1e-4,
    "matmul_f16": 1e-4,
    "matmul_q4_k": 1e-4,
    "rope_tail": 1e-5,
    "attention_window": 1e-4,
    "router_topk": 1e-5,        # weights; ids exact
    "routed_gate_up_iq2_xxs": 1e-4,
    "routed_down_q2_k": 1e-4,
    "swiglu": 1e-5,
    "add": 0.0,                 # one float add: exact
    "debug_checksum": 1e-4,
}

# --------------------------------------------------------------------------- GGUF

_GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGML_TYPES = {0: "F32", 1: "F16", 8: "Q8_0", 10: "Q2_K", 12: "Q4_K", 16: "IQ2_XXS"}


@dataclass
class TensorInfo:
    name: str
    ne: tuple[int, ...]          # GGUF order (innermost first)
    type: str
    offset: int                  # absolute offset in the file / map

    @property
    def shape(self) -> tuple[int, ...]:  # row-major, outermost first
        return tuple(reversed(self.ne))


@dataclass
class Gguf:
    path: Path
    data: bytes
    meta: dict = field(default_factory=dict)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)


def read_gguf(path: Path) -> Gguf:
    """A minimal GGUF v2/v3 reader: metadata, tensor table, absolute data offsets."""
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        s = data[pos : pos + n].decode("utf-8", "replace")
        pos += n
        return s

    def value(t: int):
        if t in _GGUF_SCALAR:
            return take(_GGUF_SCALAR[t])
        if t == 8:
            return string()
        if t == 9:
            it, n = take("<I"), take("<Q")
            return [value(it) for _ in range(n)]
        raise ValueError(f"{path}: unknown GGUF value type {t}")

    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4
    version = take("<I")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} not supported")
    n_tensors, n_kv = take("<Q"), take("<Q")
    g = Gguf(Path(path), data)
    for _ in range(n_kv):
        key = string()
        g.meta[key] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("<I")
        ne = tuple(take("<Q") for _ in range(nd))
        ttype = take("<I")
        off = take("<Q")
        infos.append((name, ne, ttype, off))
    align = int(g.meta.get("general.alignment", 32))
    data_start = (pos + align - 1) // align * align
    for name, ne, ttype, off in infos:
        g.tensors[name] = TensorInfo(name, ne, GGML_TYPES.get(ttype, f"type{ttype}"), data_start + off)
    return g


def f16_rows(g: Gguf, name: str) -> np.ndarray:
    t = g.tensors[name]
    assert t.type == "F16", t
    n = int(np.prod(t.ne))
    return np.frombuffer(g.data, dtype=np.float16, count=n, offset=t.offset).reshape(t.shape).astype(np.float32)


# ------------------------------------------------------------------------ backends

U64, U32, I32, F32, VP = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p
T = VP  # mini_gpu_tensor *

SIGNATURES = {
    "mini_gpu_init": (ctypes.c_int, []),
    "mini_gpu_cleanup": (None, []),
    "mini_gpu_tensor_alloc": (T, [U64]),
    "mini_gpu_tensor_free": (None, [T]),
    "mini_gpu_tensor_write": (ctypes.c_int, [T, U64, VP, U64]),
    "mini_gpu_tensor_read": (ctypes.c_int, [T, U64, VP, U64]),
    "mini_gpu_synchronize": (ctypes.c_int, []),
    "mini_gpu_embed_rows_tensor": (ctypes.c_int, [T, T, VP, U64, U64, U32, U32, U32]),
    "mini_gpu_rms_norm_plain_rows_tensor": (ctypes.c_int, [T, T, U32, U32, F32]),
    "mini_gpu_rms_norm_weight_rows_tensor": (ctypes.c_int, [T, T, VP, U64, U64, U32, U32, F32]),
    "mini_gpu_matmul_q8_0_tensor": (ctypes.c_int, [T, VP, U64, U64, U64, U64, T, U64]),
    "mini_gpu_matmul_f16_tensor": (ctypes.c_int, [T, VP, U64, U64, U64, U64, T, U64]),
    "mini_gpu_matmul_q4_k_tensor": (ctypes.c_int, [T, VP, U64, U64, U64, U64, T, U64]),
    "mini_gpu_rope_tail_tensor": (ctypes.c_int, [T, U32, U32, U32, U32, U32, F32]),
    "mini_gpu_attention_window_tensor": (ctypes.c_int, [T, T, T, T, VP, U64, U64, U32, U32, U32, U32, U32, F32]),
    "mini_gpu_router_topk_tensor": (ctypes.c_int, [T, T, T, U32, U32, U32]),
    "mini_gpu_routed_gate_up_iq2_xxs_tensor": (ctypes.c_int, [T, T, VP, U64, U64, U64, U32, U32, U32, T, T, U32, U32]),
    "mini_gpu_routed_down_q2_k_tensor": (ctypes.c_int, [T, VP, U64, U64, U32, U32, U32, T, T, T, U32, U32]),
    "mini_gpu_swiglu_tensor": (ctypes.c_int, [T, T, T, U64]),
    "mini_gpu_add_tensor": (ctypes.c_int, [T, T, T, U64]),
    "mini_gpu_debug_checksum_tensor": (ctypes.c_int, [T, T, U64]),
}


class In:
    """An input tensor: its host array is written into a fresh backend tensor."""

    def __init__(self, arr: np.ndarray):
        self.arr = np.ascontiguousarray(arr)


class Out:
    """An output tensor of `count` elements of dtype, pre-filled with NaN / -1 sentinels."""

    def __init__(self, count: int, dtype=np.float32):
        self.count, self.dtype = count, np.dtype(dtype)

    def initial(self) -> np.ndarray:
        fill = np.nan if self.dtype.kind == "f" else -7
        return np.full(self.count, fill, dtype=self.dtype)


class InOut(In):
    """In place: written first, read back after the call."""


def _preload_cudart() -> None:
    """Make libcudart findable when the CUDA lib dir is not on the loader path."""
    nvcc = Path(build_scripted.nvcc()).resolve()
    for d in (nvcc.parent.parent / "lib64", nvcc.parent.parent / "lib"):
        for so in sorted(d.glob("libcudart.so*")):
            try:
                ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


class Backend:
    def __init__(self, name: str, lib_path: Path):
        self.name = name
        try:
            self.lib = ctypes.CDLL(str(lib_path))
        except OSError:
            _preload_cudart()
            self.lib = ctypes.CDLL(str(lib_path))
        for fn, (res, args) in SIGNATURES.items():
            f = getattr(self.lib, fn)
            f.restype, f.argtypes = res, args
        self.live: list[int] = []

    def init(self) -> None:
        rc = self.lib.mini_gpu_init()
        if rc != 0:
            raise RuntimeError(f"{self.name}: mini_gpu_init() returned {rc}")

    def tensor(self, arr: np.ndarray) -> int:
        t = self.lib.mini_gpu_tensor_alloc(arr.nbytes)
        if not t:
            raise RuntimeError(f"{self.name}: tensor_alloc({arr.nbytes}) failed")
        self.live.append(t)
        if arr.nbytes and self.lib.mini_gpu_tensor_write(t, 0, arr.ctypes.data, arr.nbytes) != 0:
            raise RuntimeError(f"{self.name}: tensor_write failed")
        return t

    def read(self, t: int, count: int, dtype) -> np.ndarray:
        out = np.empty(count, dtype=dtype)
        if out.nbytes and self.lib.mini_gpu_tensor_read(t, 0, out.ctypes.data, out.nbytes) != 0:
            raise RuntimeError(f"{self.name}: tensor_read failed")
        return out

    def free_all(self) -> None:
        for t in self.live:
            self.lib.mini_gpu_tensor_free(t)
        self.live.clear()

    def call(self, fn: str, args: list) -> tuple[int, list[np.ndarray]]:
        """Run one op: tensors are made from In/Out/InOut args; returns rc and the outputs read back."""
        c_args, outs = [], []
        for a in args:
            if isinstance(a, Out):
                t = self.tensor(a.initial())
                outs.append((t, a.count, a.dtype))
                c_args.append(t)
            elif isinstance(a, In):
                t = self.tensor(a.arr)
                if isinstance(a, InOut):
                    outs.append((t, a.arr.size, a.arr.dtype))
                c_args.append(t)
            else:
                c_args.append(a)
        rc = getattr(self.lib, fn)(*c_args)
        sync = self.lib.mini_gpu_synchronize()
        results = [self.read(t, n, dt) for t, n, dt in outs]
        self.free_all()
        return (rc if rc != 0 else sync), results


# -------------------------------------------------------------------------- cases

@dataclass
class Case:
    op: str            # key of TOL (the function is mini_gpu_<op>_tensor)
    label: str
    shape: str
    args: list
    expect_error: bool = False
    exact_outputs: tuple[int, ...] = ()  # output indices compared exactly (ids)

    @property
    def fn(self) -> str:
        return f"mini_gpu_{self.op}_tensor"


def _q4_k_blocks(rng: np.random.Generator, n_blocks: int) -> bytes:
    """Valid random Q4_K super-blocks (the fixture has no Q4_K tensor)."""
    blk = np.zeros((n_blocks, 144), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.5, n_blocks) * 2e-3).astype(np.float16)
    dmin = (rng.uniform(0.5, 1.5, n_blocks) * 1e-3).astype(np.float16)
    blk[:, 0:2] = d.view(np.uint8).reshape(n_blocks, 2)
    blk[:, 2:4] = dmin.view(np.uint8).reshape(n_blocks, 2)
    blk[:, 4:144] = rng.integers(0, 256, (n_blocks, 140), dtype=np.uint8)
    return blk.tobytes()


def build_cases(g: Gguf, seed: int) -> tuple[list[Case], list]:
    """Every case with its inputs; returns the cases and the host buffers they point into."""
    rng = np.random.default_rng(seed)
    m = g.meta
    V = int(m["minimoe.vocab_size"])
    E = int(m["minimoe.embedding_length"])
    H = int(m["minimoe.attention.head_count"])
    D = int(m["minimoe.attention.key_length"])
    R = int(m["minimoe.rope.dimension_count"])
    X = int(m["minimoe.expert_count"])
    K = int(m["minimoe.expert_used_count"])
    FF = int(m["minimoe.expert_feed_forward_length"])
    W = int(m["minimoe.attention.sliding_window"])
    base = float(m["minimoe.rope.freq_base"])
    eps = float(m["minimoe.attention.layer_norm_rms_epsilon"])

    # one host copy of the whole file: both backends read weights from it
    keep = []
    fmap = ctypes.create_string_buffer(g.data, len(g.data))
    keep.append(fmap)
    MAP, SIZE = ctypes.addressof(fmap), len(g.data)
    off = lambda name: g.tensors[name].offset  # noqa: E731
    emb = f16_rows(g, "token_embd.weight")

    def acts(tokens) -> np.ndarray:  # real embedding rows, RMS-normalised like the engine's xn
        h = emb[np.asarray(tokens)]
        return (h / np.sqrt((h.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps)).astype(np.float32)

    def normal(*shape, scale=1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    cases: list[Case] = []
    for n in (7, 1):
        toks = rng.integers(0, V, n, dtype=np.int32)
        cases.append(Case("embed_rows", f"n={n}", f"{n}x{E} from [{V}][{E}] F16",
                          [Out(n * E), In(toks), MAP, SIZE, off("token_embd.weight"), V, E, n]))
    bad = np.array([3, V, 5], dtype=np.int32)
    cases.append(Case("embed_rows", "bad id", f"token {V} of {V}",
                      [Out(3 * E), In(bad), MAP, SIZE, off("token_embd.weight"), V, E, 3], expect_error=True))

    for rows, n, label in ((7 * H, D, "q heads"), (5, E, "odd rows")):
        x = normal(rows, n, scale=3.0)
        cases.append(Case("rms_norm_plain_rows", label, f"{rows}x{n}", [Out(rows * n), In(x), n, rows, eps]))
    for layer, n_tok in ((0, 7), (1, 1)):
        x = emb[rng.integers(0, V, n_tok)] * 5
        cases.append(Case("rms_norm_weight_rows", f"blk.{layer} n={n_tok}", f"{n_tok}x{E}",
                          [Out(n_tok * E), In(x), MAP, SIZE, off(f"blk.{layer}.attn_norm.weight"), E, n_tok, eps]))

    for name, n_tok in (("blk.0.attn_q.weight", 7), ("blk.1.attn_k.weight", 13), ("blk.0.attn_output.weight", 9),
                        ("output.weight", 1)):
        out_dim, in_dim = g.tensors[name].shape
        x = acts(rng.integers(0, V, n_tok))
        cases.append(Case("matmul_q8_0", f"{name} n={n_tok}", f"[{out_dim}][{in_dim}] x {n_tok}",
                          [Out(n_tok * out_dim), MAP, SIZE, off(name), in_dim, out_dim, In(x), n_tok]))
    for name, n_tok in (("blk.0.ffn_gate_inp.weight", 7), ("token_embd.weight", 3)):
        out_dim, in_dim = g.tensors[name].shape
        x = acts(rng.integers(0, V, n_tok))
        cases.append(Case("matmul_f16", f"{name} n={n_tok}", f"[{out_dim}][{in_dim}] x {n_tok}",
                          [Out(n_tok * out_dim), MAP, SIZE, off(name), in_dim, out_dim, In(x), n_tok]))
    # Q4_K: synthetic blocks in a second map (at an offset, like a tensor inside a file)
    q4_out, q4_in, q4_pad = 77, 512, 96
    q4 = b"\x00" * q4_pad + _q4_k_blocks(rng, q4_out * q4_in // 256)
    q4map = ctypes.create_string_buffer(q4, len(q4))
    keep.append(q4map)
    for n_tok in (5, 1):
        x = acts(rng.integers(0, V, n_tok * 2)).reshape(n_tok, q4_in)
        cases.append(Case("matmul_q4_k", f"synthetic n={n_tok}", f"[{q4_out}][{q4_in}] x {n_tok}",
                          [Out(n_tok * q4_out), ctypes.addressof(q4map), len(q4), q4_pad, q4_in, q4_out, In(x), n_tok]))

    for n_tok, n_head, pos0 in ((7, H, 0), (1, 1, 37), (5, H, 1000)):
        x = normal(n_tok, n_head, D)
        cases.append(Case("rope_tail", f"n={n_tok} heads={n_head} pos0={pos0}", f"{n_tok}x{n_head}x{D} rot {R}",
                          [InOut(x), n_tok, n_head, D, R, pos0, base]))

    scale = 1.0 / math.sqrt(D)
    for layer, n_tok, pos0 in ((0, 7, 0), (1, 9, 40), (0, 1, 63), (1, 45, 0)):
        n_kv = pos0 + n_tok
        q = normal(n_tok, H, D, scale=2.0)
        kc, vc = normal(n_kv, D, scale=2.0), normal(n_kv, D)
        cases.append(Case("attention_window", f"blk.{layer} n={n_tok} pos0={pos0}",
                          f"q {n_tok}x{H}x{D}, kv {n_kv}, window {W}",
                          [Out(n_tok * H * D), In(q), In(kc), In(vc), MAP, SIZE, off(f"blk.{layer}.attn_sinks.weight"),
                           n_tok, pos0, H, D, W, scale]))

    logits = normal(7, X, scale=2.0)
    logits[3] = 0.5                       # all equal: the lower indices win
    logits[4, [1, 6]] = logits[4].max() + 1.0   # tie for first place between experts 1 and 6
    cases.append(Case("router_topk", "n=7 with ties", f"{7}x{X} top {K}",
                      [Out(7 * K, np.int32), Out(7 * K), In(logits), X, 7, K], exact_outputs=(0,)))
    cases.append(Case("router_topk", "top 3 of 5", "4x5 top 3",
                      [Out(4 * 3, np.int32), Out(4 * 3), In(normal(4, 5)), 5, 4, 3], exact_outputs=(0,)))

    for layer, n_tok in ((0, 7), (1, 1)):
        x = acts(rng.integers(0, V, n_tok))
        ids = np.stack([rng.choice(X, K, replace=False) for _ in range(n_tok)]).astype(np.int32)
        cases.append(Case("routed_gate_up_iq2_xxs", f"blk.{layer} n={n_tok}", f"{n_tok}x{K} slots, [{X}][{FF}][{E}]",
                          [Out(n_tok * K * FF), Out(n_tok * K * FF), MAP, SIZE, off(f"blk.{layer}.ffn_gate_exps.weight"),
                           off(f"blk.{layer}.ffn_up_exps.weight"), E, FF, X, In(x), In(ids), n_tok, K]))
        mid = normal(n_tok, K, FF, scale=0.5)
        w = rng.uniform(0.1, 1.0, (n_tok, K)).astype(np.float32)
        w /= w.sum(-1, keepdims=True)
        cases.append(Case("routed_down_q2_k", f"blk.{layer} n={n_tok}", f"{n_tok}x{K} slots, [{X}][{E}][{FF}]",
                          [Out(n_tok * E), MAP, SIZE, off(f"blk.{layer}.ffn_down_exps.weight"), FF, E, X,
                           In(mid), In(ids), In(w), n_tok, K]))
    bad_ids = np.array([[0, X]], dtype=np.int32)
    cases.append(Case("routed_gate_up_iq2_xxs", "bad id", f"expert {X} of {X}",
                      [Out(K * FF), Out(K * FF), MAP, SIZE, off("blk.0.ffn_gate_exps.weight"),
                       off("blk.0.ffn_up_exps.weight"), E, FF, X, In(acts([1])), In(bad_ids), 1, K], expect_error=True))
    cases.append(Case("routed_down_q2_k", "bad id", f"expert {X} of {X}",
                      [Out(E), MAP, SIZE, off("blk.0.ffn_down_exps.weight"), FF, E, X,
                       In(normal(1, K, FF)), In(bad_ids), In(np.full((1, K), 0.5, np.float32)), 1, K], expect_error=True))

    for n in (7 * K * FF, 1001):
        cases.append(Case("swiglu", f"n={n}", f"{n}", [Out(n), In(normal(n, scale=3.0)), In(normal(n)), n]))
    for n in (7 * E, 1001):
        cases.append(Case("add", f"n={n}", f"{n}", [Out(n), In(normal(n)), In(normal(n)), n]))
    for n in (E, 100003):
        cases.append(Case("debug_checksum", f"n={n}", f"{n}", [Out(2), In(normal(n) + 0.25), n]))
    return cases, keep


# ------------------------------------------------------------------------ compare

def compare(case: Case, cpu: tuple[int, list], cuda: tuple[int, list]) -> dict:
    rc_cpu, out_cpu = cpu
    rc_cuda, out_cuda = cuda
    row = {"op": case.op, "case": case.label, "shape": case.shape, "tol": TOL[case.op],
           "rc_cpu": rc_cpu, "rc_cuda": rc_cuda, "max_abs": None, "max_rel": None, "ok": False, "note": ""}
    if case.expect_error:
        row["ok"] = rc_cpu != 0 and rc_cuda != 0
        row["note"] = "both reject" if row["ok"] else "an invalid id was accepted"
        return row
    if rc_cpu != 0 or rc_cuda != 0:
        row["note"] = f"rc cpu={rc_cpu} cuda={rc_cuda}"
        return row
    max_abs, max_rel, notes = 0.0, 0.0, []
    for i, (a, b) in enumerate(zip(out_cuda, out_cpu)):
        if i in case.exact_outputs:
            if not np.array_equal(a, b):
                notes.append(f"output {i} differs at {int(np.flatnonzero(a != b)[0])}")
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        if not np.all(np.isfinite(a64)):
            notes.append(f"output {i}: {int((~np.isfinite(a64)).sum())} non-finite (sentinel left?)")
            continue
        err = float(np.max(np.abs(a64 - b64))) if a.size else 0.0
        scale = float(np.max(np.abs(b64))) if b.size else 0.0
        max_abs = max(max_abs, err)
        max_rel = max(max_rel, err / scale if scale > 0 else (0.0 if err == 0 else math.inf))
    row["max_abs"], row["max_rel"] = max_abs, max_rel
    row["ok"] = not notes and max_rel <= TOL[case.op]
    row["note"] = "; ".join(notes)
    return row


def print_table(rows: list[dict]) -> None:
    hdr = f"{'op':<24} {'case':<28} {'shape':<34} {'max abs':>10} {'max rel':>10} {'tol':>8}  result"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        fa = "-" if r["max_abs"] is None else f"{r['max_abs']:.3e}"
        fr = "-" if r["max_rel"] is None else f"{r['max_rel']:.3e}"
        res = "ok" if r["ok"] else "FAIL"
        note = f"  ({r['note']})" if r["note"] else ""
        print(f"{r['op']:<24} {r['case'][:28]:<28} {r['shape'][:34]:<34} {fa:>10} {fr:>10} {r['tol']:>8.0e}  {res}{note}")


def run_cpu_plan(cpu: Backend, cases: list[Case]) -> list[tuple[Case, int, bool]]:
    """Every case on the CPU backend alone: valid inputs succeed with finite outputs, error cases fail."""
    out = []
    for c in cases:
        rc, outs = cpu.call(c.fn, c.args)
        finite = all(np.all(np.isfinite(o)) for o in outs if o.dtype.kind == "f")
        out.append((c, rc, (rc != 0) if c.expect_error else (rc == 0 and finite)))
    return out


# --------------------------------------------------------------------------- main

def build_cpu_lib(out_dir: Path) -> Path:
    lib = out_dir / "libmini_cpu.so"
    cmd = [os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-I", str(TARGET_DIR), "-o", str(lib),
           str(TARGET_DIR / "mini_cpu.c"), "-lm"]
    subprocess.run(cmd, check=True)
    return lib


def ensure_fixture(path: Path | None) -> Path:
    if path is not None:
        if not path.is_file():
            raise SystemExit(f"fixture {path} does not exist")
        return path
    if DEFAULT_FIXTURE.is_file():
        return DEFAULT_FIXTURE
    DEFAULT_FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, str(TARGET_DIR / "make_fixture.py"), str(DEFAULT_FIXTURE)], check=True)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"no fixture at {DEFAULT_FIXTURE} and make_fixture.py failed ({exc}); "
                         f"pass --fixture PATH (a fixture written where gguf is installed)") from exc
    return DEFAULT_FIXTURE


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", type=Path, default=None, help=f"minimoe GGUF (default {DEFAULT_FIXTURE})")
    ap.add_argument("--build-dir", type=Path, default=None, help="where the two libraries go (default: a temp dir)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--jobs", type=int, default=max(2, min(8, os.cpu_count() or 2)))
    ap.add_argument("--dry-run", action="store_true", help="build both libraries, run the CPU side only, print the plan")
    ap.add_argument("--json", type=Path, default=None, help="also write the table as JSON")
    ap.add_argument("--self-test", action="store_true",
                    help="no GPU: compare the CPU backend with a second copy of itself (checks this script)")
    args = ap.parse_args(argv)

    fixture = ensure_fixture(args.fixture)
    build_dir = args.build_dir or Path(tempfile.mkdtemp(prefix="minimoe_cmp_"))
    build_dir.mkdir(parents=True, exist_ok=True)
    cpu_lib = build_cpu_lib(build_dir)
    cuda_lib = build_scripted.build_library(build_dir, build_dir / "obj", args.jobs)
    missing = set(build_scripted.api_units()) - build_scripted.exported_symbols(cuda_lib)
    if missing:
        print(f"{cuda_lib}: missing exports {sorted(missing)}", file=sys.stderr)
        return 1
    print(f"fixture  {fixture} ({fixture.stat().st_size} bytes)")
    print(f"cpu      {cpu_lib}")
    print(f"cuda     {cuda_lib}")

    g = read_gguf(fixture)
    cases, keep = build_cases(g, args.seed)
    ops = sorted({c.op for c in cases})
    assert len(ops) == 14 and set(ops) == set(TOL), ops

    cpu = Backend("cpu", cpu_lib)
    cpu.init()
    if args.dry_run:
        Backend("cuda", cuda_lib)  # loads and binds all 21 entry points; calls nothing
        print(f"\nplan: {len(cases)} cases over {len(ops)} ops (CPU backend only; no CUDA call made)")
        bad = 0
        for c, rc, ok in run_cpu_plan(cpu, cases):
            bad += not ok
            print(f"  {c.fn:<40} {c.label:<30} {c.shape:<36} cpu rc={rc} {'ok' if ok else 'UNEXPECTED'}")
        return 1 if bad else 0

    if args.self_test:
        twin = build_dir / "libmini_cpu_twin.so"
        twin.write_bytes(cpu_lib.read_bytes())
        cuda = Backend("cpu-twin", twin)
    else:
        cuda = Backend("cuda", cuda_lib)
    cuda.init()
    rows = []
    for c in cases:
        rows.append(compare(c, cpu.call(c.fn, c.args), cuda.call(c.fn, c.args)))
    cuda.lib.mini_gpu_cleanup()
    del keep
    print()
    print_table(rows)
    failed = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} cases ok over {len(ops)} ops"
          + (f"; FAILED: {', '.join(sorted({r['op'] for r in failed}))}" if failed else ""))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
