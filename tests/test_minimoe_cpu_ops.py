"""targets/minimoe/mini_cpu.c against the numpy references, op by op.

mini_cpu.c is compiled into a temporary shared library and driven through
ctypes with the API's own tensor functions (alloc / write / read / free); the
ctypes prototypes are derived from mini_gpu.h itself (porter.target.cparse), so a
signature drift fails here.  The model map is the fixture GGUF's bytes in a
numpy buffer; weights are the fixture's real tensors, plus a synthetic map for
the Q4_K variant the fixture does not contain.  Shapes: the model's real sizes
and odd ones (n_tokens 1, 3, 7; other head counts, windows and positions).

Every output tensor is pre-filled with NaN (an op that writes nothing fails),
inputs are checked unchanged after the call, and the max abs error of each op
is printed in a table at the end of the module.

Tolerances (err = max |cpu - ref|, scale = max(1, max |ref|)):
  * exact: embed (F16 -> F32 widening is exact) and the router's expert ids
    (compared exactly, ties included);
  * 1e-6 * scale for elementwise ops (add, swiglu, rms norms, rope): a few
    float32 roundings per value;
  * 5e-5 * scale for reductions over <= 512 terms (matmuls, attention, routed
    experts, router weights): the reference accumulates in float64, a backend
    may accumulate in float32, whose error grows ~ sqrt(K) * 2^-24 * sum|terms|
    (K = 256: ~1e-6 typical, 1.5e-5 worst case).  Any real bug (a wrong
    block layout, a missing scale, an off-by-one window) is >= 1e-2.
  * checksum: 1e-5 relative to sum |x| (resp. sum x^2).
"""
from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import show_if_verbose

import gguf

import reference.minimoe_ops as ops
import reference.quant as rq
from reference.minimoe_model import MiniMoeModel
from reference.quant import QT

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "targets" / "minimoe"
# PORTER_MINIMOE_CPU_SRC points the module at another CPU backend source (a
# deliberately broken copy, say, to see these tests catch it).
CPU_SRC = Path(os.environ.get("PORTER_MINIMOE_CPU_SRC", TARGET / "mini_cpu.c"))
HEADER = TARGET / "mini_gpu.h"

TOL_ELEM = 1e-6
TOL_REDUCE = 5e-5

REPORT: list[tuple[str, str, float, float]] = []   # (op, case, max abs err, allowed)


# ---------------------------------------------------------------------------
# Library, tensors, fixture
# ---------------------------------------------------------------------------

_CTYPES = {
    "int": ctypes.c_int, "void": None, "float": ctypes.c_float,
    "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64, "int32_t": ctypes.c_int32,
}


def _ctype(text: str):
    t = re.sub(r"\bconst\b", "", text).replace(" ", "")
    if t.endswith("*"):
        return ctypes.c_void_p
    if t not in _CTYPES:
        raise AssertionError(f"no ctypes mapping for C type {text!r}")
    return _CTYPES[t]


def _bind(lib):
    """Sets restype/argtypes of every API function from the header's declarations."""
    from porter.target.cparse import parse_api_header

    fns = parse_api_header(HEADER, "mini_gpu_")
    assert len(fns) == 24, [f.name for f in fns]
    for f in fns:
        fn = getattr(lib, f.name)            # AttributeError: the backend lacks an API function
        fn.restype = _ctype(f.return_type)
        fn.argtypes = [_ctype(p.type) for p in f.params]
    return fns


class Backend:
    def __init__(self, lib):
        self.lib = lib
        self.live: list[int] = []

    def alloc(self, nbytes: int) -> int:
        t = self.lib.mini_gpu_tensor_alloc(int(nbytes))
        assert t, "mini_gpu_tensor_alloc returned NULL"
        self.live.append(t)
        return t

    def tensor(self, arr: np.ndarray) -> int:
        a = np.ascontiguousarray(arr)
        t = self.alloc(a.nbytes)
        assert self.lib.mini_gpu_tensor_write(t, 0, a.ctypes.data, a.nbytes) == 0
        return t

    def output(self, n: int, dtype=np.float32) -> int:
        """An output tensor of n elements pre-filled with NaN (or -7 for ints)."""
        fill = np.full(n, np.nan if np.dtype(dtype).kind == "f" else -7, dtype=dtype)
        return self.tensor(fill)

    def read(self, t: int, n: int, dtype=np.float32) -> np.ndarray:
        out = np.empty(n, dtype=dtype)
        assert self.lib.mini_gpu_synchronize() == 0
        assert self.lib.mini_gpu_tensor_read(t, 0, out.ctypes.data, out.nbytes) == 0
        return out

    def free_all(self) -> None:
        for t in self.live:
            self.lib.mini_gpu_tensor_free(t)
        self.live.clear()


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if not CPU_SRC.exists():
        pytest.skip("targets/minimoe/mini_cpu.c does not exist yet (helper A writes it)")
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc/gcc/clang) on PATH")
    so = tmp_path_factory.mktemp("cpu") / "libmini_cpu.so"
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-I", str(TARGET), "-o", str(so), str(CPU_SRC), "-lm"],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"mini_cpu.c does not compile:\n{r.stderr}"
    L = ctypes.CDLL(str(so))
    _bind(L)
    assert L.mini_gpu_init() == 0
    yield L
    L.mini_gpu_cleanup()


@pytest.fixture()
def be(lib):
    b = Backend(lib)
    yield b
    b.free_all()


class Fixture:
    def __init__(self, path: Path):
        self.path = path
        self.map = np.fromfile(path, dtype=np.uint8)
        self.size = int(self.map.size)
        self.ptr = self.map.ctypes.data
        r = gguf.GGUFReader(str(path))
        self.off = {t.name: int(t.data_offset) for t in r.tensors}


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Fixture:
    import importlib.util

    spec = importlib.util.spec_from_file_location("minimoe_make_fixture", TARGET / "make_fixture.py")
    mf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mf)
    return Fixture(mf.write_fixture(tmp_path_factory.mktemp("fx") / "minimoe.gguf", seed=0))


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    yield
    lines = ["", "mini_cpu.c vs numpy reference: max abs error per op"]
    width = max((len(op) for op, *_ in REPORT), default=0)
    for op, case, err, tol in REPORT:
        lines.append(f"  {op:<{width}}  {case:<34} max_abs={err:.3e}  allowed={tol:.1e}")
    if REPORT:
        show_if_verbose(request.config, lines)


def check(op: str, case: str, got, want, tol: float, scale: float | None = None) -> None:
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    want = np.asarray(want, dtype=np.float64).reshape(-1)
    assert got.shape == want.shape
    assert np.all(np.isfinite(got)), f"{op} {case}: non-finite output (left unwritten?)"
    err = float(np.abs(got - want).max()) if got.size else 0.0
    if scale is None:
        scale = max(1.0, float(np.abs(want).max()) if want.size else 0.0)
    allowed = tol * scale
    REPORT.append((op, case, err, allowed))
    assert err <= allowed, f"{op} {case}: max abs err {err:.3e} > {allowed:.3e}"


def unchanged(be: Backend, t: int, arr: np.ndarray, what: str) -> None:
    a = np.ascontiguousarray(arr)
    back = be.read(t, a.size, a.dtype).reshape(a.shape)
    assert back.tobytes() == a.tobytes(), f"input {what} was modified"


N_TOKS = [1, 3, 7]


# ---------------------------------------------------------------------------
# Runtime
# ---------------------------------------------------------------------------

def test_tensor_runtime_roundtrip_view_copy(lib, be):
    a = np.arange(16, dtype=np.float32)
    t = be.tensor(a)
    assert lib.mini_gpu_tensor_bytes(t) == 64
    v = lib.mini_gpu_tensor_view(t, 16, 32)
    assert v and lib.mini_gpu_tensor_bytes(v) == 32
    back = np.empty(8, np.float32)
    assert lib.mini_gpu_tensor_read(v, 0, back.ctypes.data, 32) == 0
    assert np.array_equal(back, a[4:12])
    d = be.output(16)
    assert lib.mini_gpu_tensor_copy(d, 8, t, 0, 16) == 0
    got = be.read(d, 16)
    assert np.array_equal(got[2:6], a[:4]) and np.all(np.isnan(got[:2]))
    assert lib.mini_gpu_tensor_read(t, 60, back.ctypes.data, 8) != 0          # past the end
    assert lib.mini_gpu_tensor_view(t, 60, 8) is None
    lib.mini_gpu_tensor_free(v)
    assert np.array_equal(be.read(t, 16), a)                                   # freeing a view keeps base


# ---------------------------------------------------------------------------
# Ops on the fixture's real tensors
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", N_TOKS + [32])
def test_embed_rows(lib, be, fx, n):
    rng = np.random.default_rng(n)
    tok = rng.integers(0, 512, n).astype(np.int32)
    tok[0] = 511
    if n > 1:
        tok[1] = 0
    ttok = be.tensor(tok)
    out = be.output(n * 256)
    assert lib.mini_gpu_embed_rows_tensor(out, ttok, fx.ptr, fx.size, fx.off["token_embd.weight"], 512, 256, n) == 0
    want = ops.embed_rows(tok, fx.map, fx.off["token_embd.weight"], 512, 256, n)
    check("embed_rows", f"n_tokens={n}", be.read(out, n * 256), want, 0.0)
    unchanged(be, ttok, tok, "tokens")


@pytest.mark.parametrize("n_rows,n", [(1, 64), (3 * 4, 64), (7 * 4, 64), (7, 256), (5, 33)])
def test_rms_norm_plain_rows(lib, be, n_rows, n):
    rng = np.random.default_rng(n_rows)
    x = (rng.standard_normal(n_rows * n) * 3).astype(np.float32)
    tx, out = be.tensor(x), be.output(n_rows * n)
    assert lib.mini_gpu_rms_norm_plain_rows_tensor(out, tx, n, n_rows, 1e-6) == 0
    check("rms_norm_plain_rows", f"rows={n_rows} n={n}", be.read(out, n_rows * n),
          ops.rms_norm_plain_rows(x, n, n_rows, 1e-6), TOL_ELEM)
    unchanged(be, tx, x, "x")


@pytest.mark.parametrize("name", ["blk.0.attn_norm.weight", "blk.1.ffn_norm.weight", "output_norm.weight"])
@pytest.mark.parametrize("n_rows", N_TOKS)
def test_rms_norm_weight_rows(lib, be, fx, name, n_rows):
    rng = np.random.default_rng(n_rows)
    x = rng.standard_normal(n_rows * 256).astype(np.float32)
    tx, out = be.tensor(x), be.output(n_rows * 256)
    assert lib.mini_gpu_rms_norm_weight_rows_tensor(out, tx, fx.ptr, fx.size, fx.off[name], 256, n_rows, 1e-6) == 0
    check("rms_norm_weight_rows", f"{name.split('.weight')[0]} rows={n_rows}", be.read(out, n_rows * 256),
          ops.rms_norm_weight_rows(x, fx.map, fx.off[name], 256, n_rows, 1e-6), TOL_ELEM)


MATMULS = [
    ("matmul_q8_0", "blk.0.attn_q.weight", 256, 256),
    ("matmul_q8_0", "blk.1.attn_k.weight", 256, 64),
    ("matmul_q8_0", "blk.0.attn_v.weight", 256, 64),
    ("matmul_q8_0", "blk.1.attn_output.weight", 256, 256),
    ("matmul_q8_0", "output.weight", 256, 512),
    ("matmul_f16", "blk.0.ffn_gate_inp.weight", 256, 8),
    ("matmul_f16", "token_embd.weight", 256, 512),
]


@pytest.mark.parametrize("op,name,in_dim,out_dim", MATMULS, ids=[f"{m[0]}-{m[1]}" for m in MATMULS])
@pytest.mark.parametrize("n_tok", N_TOKS)
def test_matmul_fixture_weights(lib, be, fx, op, name, in_dim, out_dim, n_tok):
    rng = np.random.default_rng(n_tok + out_dim)
    x = rng.standard_normal(n_tok * in_dim).astype(np.float32)
    tx, out = be.tensor(x), be.output(n_tok * out_dim)
    fn = getattr(lib, f"mini_gpu_{op}_tensor")
    assert fn(out, fx.ptr, fx.size, fx.off[name], in_dim, out_dim, tx, n_tok) == 0
    want = getattr(ops, op)(fx.map, fx.off[name], in_dim, out_dim, x, n_tok)
    check(op, f"{name.replace('.weight', '')} n_tok={n_tok}", be.read(out, n_tok * out_dim), want, TOL_REDUCE)
    unchanged(be, tx, x, "x")


@pytest.mark.parametrize("op,qt", [("matmul_q4_k", QT.Q4_K), ("matmul_q8_0", QT.Q8_0), ("matmul_f16", QT.F16)])
@pytest.mark.parametrize("seed", [0, 1])
def test_matmul_synthetic_odd_shapes(lib, be, op, qt, seed):
    """Random valid blocks in a synthetic map at an unaligned offset; odd out_dim."""
    rng = np.random.default_rng(seed)
    in_dim, out_dim, n_tok = 512, 37, 5
    raw = rq.random_blocks(qt, out_dim, in_dim, rng)
    off = 13
    m = np.concatenate([np.full(off, 0xAB, np.uint8), raw.reshape(-1), np.full(9, 0xCD, np.uint8)])
    x = rng.standard_normal(n_tok * in_dim).astype(np.float32)
    tx, out = be.tensor(x), be.output(n_tok * out_dim)
    fn = getattr(lib, f"mini_gpu_{op}_tensor")
    assert fn(out, m.ctypes.data, m.size, off, in_dim, out_dim, tx, n_tok) == 0
    want = getattr(ops, op)(m, off, in_dim, out_dim, x, n_tok)
    check(op, f"synthetic {qt.name} {out_dim}x{in_dim} seed={seed}", be.read(out, n_tok * out_dim), want, TOL_REDUCE)
    # and through our independent decoder, to tie the chain together
    indep = rq.quant_matvec_blockwise(raw, qt, out_dim, in_dim, x.reshape(n_tok, in_dim))
    check(op, f"  vs independent decoder seed={seed}", be.read(out, n_tok * out_dim), indep, TOL_REDUCE)


@pytest.mark.parametrize("n_tok,n_head,head_dim,n_rot,pos0", [
    (1, 4, 64, 16, 0), (3, 4, 64, 16, 0), (7, 4, 64, 16, 37), (1, 1, 64, 16, 200),
    (5, 3, 8, 8, 9), (2, 2, 32, 2, 1000)])
def test_rope_tail(lib, be, n_tok, n_head, head_dim, n_rot, pos0):
    rng = np.random.default_rng(pos0 + n_tok)
    x = rng.standard_normal(n_tok * n_head * head_dim).astype(np.float32)
    tx = be.tensor(x)
    assert lib.mini_gpu_rope_tail_tensor(tx, n_tok, n_head, head_dim, n_rot, pos0, 10000.0) == 0
    want = ops.rope_tail(x, n_tok, n_head, head_dim, n_rot, pos0, 10000.0)
    check("rope_tail", f"t={n_tok} h={n_head} d={head_dim} rot={n_rot} pos0={pos0}",
          be.read(tx, x.size), want, TOL_ELEM)


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("n_tok,pos0,window", [(1, 0, 32), (3, 0, 32), (7, 0, 32), (7, 37, 32), (1, 60, 32),
                                               (3, 5, 4), (7, 0, 1000)])
def test_attention_window(lib, be, fx, layer, n_tok, pos0, window):
    n_head, head_dim = 4, 64
    rng = np.random.default_rng(n_tok * 1000 + pos0 + layer)
    n_pos = pos0 + n_tok
    # rms-normed q/k as in the engine: scores of std ~1 after the 1/8 scale
    q = ops.rms_norm_plain_rows(rng.standard_normal(n_tok * n_head * head_dim), head_dim, n_tok * n_head, 1e-6)
    k = ops.rms_norm_plain_rows(rng.standard_normal(n_pos * head_dim), head_dim, n_pos, 1e-6)
    v = rng.standard_normal(n_pos * head_dim).astype(np.float32)
    extra = np.full(3 * head_dim, np.nan, np.float32)                # cache rows past pos0+n_tok are not read
    tq, tk, tv = be.tensor(q), be.tensor(np.concatenate([k.reshape(-1), extra])), be.tensor(np.concatenate([v, extra]))
    out = be.output(q.size)
    sinks = fx.off[f"blk.{layer}.attn_sinks.weight"]
    assert lib.mini_gpu_attention_window_tensor(out, tq, tk, tv, fx.ptr, fx.size, sinks, n_tok, pos0,
                                                n_head, head_dim, window, 0.125) == 0
    want = ops.attention_window(q, k, v, fx.map, sinks, n_tok, pos0, n_head, head_dim, window, 0.125)
    check("attention_window", f"L{layer} t={n_tok} pos0={pos0} win={window}", be.read(out, q.size), want, TOL_REDUCE)
    unchanged(be, tq, q, "q")


def test_attention_window_odd_heads(lib, be, fx):
    """3 heads of 8 dims with the sinks of the 4-head fixture tensor (first 3 used)."""
    rng = np.random.default_rng(99)
    n_tok, pos0, n_head, head_dim, window = 5, 11, 3, 8, 6
    n_pos = pos0 + n_tok
    q = rng.standard_normal(n_tok * n_head * head_dim).astype(np.float32)
    k = rng.standard_normal(n_pos * head_dim).astype(np.float32)
    v = rng.standard_normal(n_pos * head_dim).astype(np.float32)
    tq, tk, tv, out = be.tensor(q), be.tensor(k), be.tensor(v), be.output(q.size)
    sinks = fx.off["blk.0.attn_sinks.weight"]
    assert lib.mini_gpu_attention_window_tensor(out, tq, tk, tv, fx.ptr, fx.size, sinks, n_tok, pos0,
                                                n_head, head_dim, window, 0.4) == 0
    want = ops.attention_window(q, k, v, fx.map, sinks, n_tok, pos0, n_head, head_dim, window, 0.4)
    check("attention_window", "h=3 d=8 pos0=11 win=6 scale=0.4", be.read(out, q.size), want, TOL_REDUCE)


def _router_case(lib, be, logits, n_expert, n_tok, top_k, case):
    tl, tids, tw = be.tensor(logits), be.output(n_tok * top_k, np.int32), be.output(n_tok * top_k)
    assert lib.mini_gpu_router_topk_tensor(tids, tw, tl, n_expert, n_tok, top_k) == 0
    ids, w = ops.router_topk(logits, n_expert, n_tok, top_k)
    got_ids = be.read(tids, n_tok * top_k, np.int32).reshape(n_tok, top_k)
    assert np.array_equal(got_ids, ids), f"router {case}: ids {got_ids.tolist()} != reference {ids.tolist()}"
    REPORT.append(("router_topk ids", case, 0.0, 0.0))
    check("router_topk weights", case, be.read(tw, n_tok * top_k), w, TOL_REDUCE)


@pytest.mark.parametrize("n_tok", N_TOKS + [64])
def test_router_topk_random(lib, be, n_tok):
    rng = np.random.default_rng(n_tok)
    logits = (rng.standard_normal(n_tok * 8) * 2).astype(np.float32)
    _router_case(lib, be, logits, 8, n_tok, 2, f"random n_tokens={n_tok}")


def test_router_topk_ties_and_other_k(lib, be):
    logits = np.array([
        [1.0, 3.0, 3.0, 0.0, -1.0, 3.0, 2.0, 0.5],
        [0.0] * 8,
        [5.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0],
        [-1.0, -1.0, -1.0, 2.0, -1.0, -1.0, -1.0, 2.0],
        [-80.0, 50.0, -80.0, -80.0, -80.0, -80.0, -80.0, -80.0],   # underflowing p ties among the rest
    ], dtype=np.float32)
    _router_case(lib, be, logits.reshape(-1), 8, 5, 2, "constructed ties k=2")
    _router_case(lib, be, logits.reshape(-1), 8, 5, 3, "constructed ties k=3")
    rng = np.random.default_rng(3)
    _router_case(lib, be, rng.standard_normal(3 * 5).astype(np.float32), 5, 3, 5, "n_expert=5 k=5")
    _router_case(lib, be, rng.standard_normal(7 * 8).astype(np.float32), 8, 7, 1, "k=1")


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("n_tok", N_TOKS)
def test_routed_gate_up_and_down(lib, be, fx, layer, n_tok):
    rng = np.random.default_rng(10 * n_tok + layer)
    E, F, X, K = 256, 256, 8, 2
    x = ops.rms_norm_plain_rows(rng.standard_normal(n_tok * E), E, n_tok, 1e-6)
    logits = (rng.standard_normal(n_tok * X) * 2).astype(np.float32)
    ids, w = ops.router_topk(logits, X, n_tok, K)
    if n_tok >= 3:
        ids[2] = [5, 5]                                     # the same expert in both slots: still per slot
    g_off = fx.off[f"blk.{layer}.ffn_gate_exps.weight"]
    u_off = fx.off[f"blk.{layer}.ffn_up_exps.weight"]
    d_off = fx.off[f"blk.{layer}.ffn_down_exps.weight"]
    tx, tids = be.tensor(x), be.tensor(ids)
    tg, tu = be.output(n_tok * K * F), be.output(n_tok * K * F)
    assert lib.mini_gpu_routed_gate_up_iq2_xxs_tensor(tg, tu, fx.ptr, fx.size, g_off, u_off, E, F, X,
                                                      tx, tids, n_tok, K) == 0
    gate, up = ops.routed_gate_up_iq2_xxs(fx.map, g_off, u_off, E, F, X, x, ids, n_tok, K)
    check("routed_gate_up_iq2_xxs", f"L{layer} gate n_tok={n_tok}", be.read(tg, gate.size), gate, TOL_REDUCE)
    check("routed_gate_up_iq2_xxs", f"L{layer} up n_tok={n_tok}", be.read(tu, up.size), up, TOL_REDUCE)
    unchanged(be, tx, x, "x")
    unchanged(be, tids, ids, "expert_ids")

    mid = ops.swiglu(gate, up, gate.size)
    tm, tw, out = be.tensor(mid), be.tensor(w), be.output(n_tok * E)
    assert lib.mini_gpu_routed_down_q2_k_tensor(out, fx.ptr, fx.size, d_off, F, E, X, tm, tids, tw, n_tok, K) == 0
    want = ops.routed_down_q2_k(fx.map, d_off, F, E, X, mid, ids, w, n_tok, K)
    check("routed_down_q2_k", f"L{layer} n_tok={n_tok}", be.read(out, n_tok * E), want, TOL_REDUCE)
    unchanged(be, tm, mid, "mid")


@pytest.mark.parametrize("n", [1, 7, 1000, 3 * 2 * 256])
def test_swiglu_add_checksum(lib, be, n):
    rng = np.random.default_rng(n)
    g = (rng.standard_normal(n) * 4).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32)
    tg, tu, out = be.tensor(g), be.tensor(u), be.output(n)
    assert lib.mini_gpu_swiglu_tensor(out, tg, tu, n) == 0
    check("swiglu", f"n={n}", be.read(out, n), ops.swiglu(g, u, n), TOL_ELEM)
    unchanged(be, tg, g, "gate")

    out2 = be.output(n)
    assert lib.mini_gpu_add_tensor(out2, tg, tu, n) == 0
    check("add", f"n={n}", be.read(out2, n), ops.add(g, u, n), TOL_ELEM)
    assert lib.mini_gpu_add_tensor(tg, tg, tu, n) == 0                # out aliases a (the residual update)
    check("add", f"n={n} out aliases a", be.read(tg, n), ops.add(g, u, n), TOL_ELEM)

    cs = be.output(2)
    assert lib.mini_gpu_debug_checksum_tensor(cs, tu, n) == 0
    got = be.read(cs, 2)
    want = ops.debug_checksum(u, n)
    check("debug_checksum", f"sum n={n}", got[:1], want[:1], 1e-5, max(1.0, float(np.abs(u).sum())))
    check("debug_checksum", f"sumsq n={n}", got[1:], want[1:], 1e-5, max(1.0, float((u.astype(np.float64) ** 2).sum())))


# ---------------------------------------------------------------------------
# Errors the header calls errors
# ---------------------------------------------------------------------------

def test_errors_return_nonzero(lib, be, fx):
    emb = fx.off["token_embd.weight"]
    for bad in (512, -1):
        tok = be.tensor(np.array([3, bad], np.int32))
        assert lib.mini_gpu_embed_rows_tensor(be.output(512), tok, fx.ptr, fx.size, emb, 512, 256, 2) != 0
    with pytest.raises(ValueError):
        ops.embed_rows([3, 512], fx.map, emb, 512, 256, 2)

    x = be.tensor(np.ones(256, np.float32))
    q = fx.off["output.weight"]
    assert lib.mini_gpu_matmul_q8_0_tensor(be.output(512), fx.ptr, fx.size, fx.size - 100, 256, 512, x, 1) != 0
    assert lib.mini_gpu_matmul_q8_0_tensor(be.output(512), fx.ptr, fx.size, q, 250, 512, x, 1) != 0   # not /32

    ids = be.tensor(np.array([[0, 8]], np.int32))
    g = fx.off["blk.0.ffn_gate_exps.weight"]
    u = fx.off["blk.0.ffn_up_exps.weight"]
    d = fx.off["blk.0.ffn_down_exps.weight"]
    assert lib.mini_gpu_routed_gate_up_iq2_xxs_tensor(be.output(512), be.output(512), fx.ptr, fx.size, g, u,
                                                      256, 256, 8, x, ids, 1, 2) != 0
    w = be.tensor(np.array([0.5, 0.5], np.float32))
    assert lib.mini_gpu_routed_down_q2_k_tensor(be.output(256), fx.ptr, fx.size, d, 256, 256, 8,
                                                be.tensor(np.ones(512, np.float32)), ids, w, 1, 2) != 0


# ---------------------------------------------------------------------------
# End to end: the C engine on the CPU backend vs reference/minimoe_model.py
# ---------------------------------------------------------------------------

def _build_engine(tmp_path: Path) -> Path:
    if not (TARGET / "engine.c").exists() or not (TARGET / "Makefile").exists():
        pytest.skip("targets/minimoe/engine.c or Makefile does not exist yet (helper A writes them)")
    if shutil.which("make") is None:
        pytest.skip("no make on PATH")
    r = subprocess.run(["make", "-C", str(TARGET), "cpu", f"OUT={tmp_path}"], capture_output=True, text=True)
    assert r.returncode == 0, f"make cpu failed:\n{r.stdout}\n{r.stderr}"
    exe = tmp_path / "minimoe-cpu"
    assert exe.exists(), f"make cpu did not produce {exe}"
    return exe


def _run_engine(exe: Path, model: Path, prompt: list[int], n_decode: int) -> tuple[list[int], float]:
    r = subprocess.run([str(exe), str(model), "--prompt", ",".join(map(str, prompt)), "--decode", str(n_decode)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"engine failed:\n{r.stderr}"
    m = re.search(r"^tokens:((?: -?\d+)+)\s*$", r.stdout, re.M)
    assert m, f"no 'tokens:' line in engine output:\n{r.stdout}"
    s = re.search(r"sum=(-?[\d.]+)", r.stdout)
    return [int(t) for t in m.group(1).split()], (float(s.group(1)) if s else math.nan)


@pytest.mark.parametrize("prompt", [
    [1, 17, 42, 99, 256, 311, 7, 480],                    # the engine's default prompt
    [(7 * i + 3) % 512 for i in range(40)],              # longer than the window (32): the window slides
    [5],
])
def test_engine_tokens_match_reference_model(fx, tmp_path, prompt):
    exe = _build_engine(tmp_path)
    n_decode = 16
    got, got_sum = _run_engine(exe, fx.path, prompt, n_decode)
    model = MiniMoeModel(fx.path)
    traces: list = []
    want = model.generate(prompt, n_decode, traces)
    margins = [float(np.diff(np.sort(t.logits.astype(np.float64))[-2:])[0]) for t in traces]
    print(f"prompt len {len(prompt)}: engine {got}\n  reference {want}\n  min top-2 margin {min(margins):.4f}")
    assert got == want, (f"engine tokens differ from reference/minimoe_model.py at step "
                         f"{next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)} "
                         f"(reference top-2 margins {[round(x, 4) for x in margins]})")
    # the engine's digest sums round(logit*1000)/1000 over every logits row
    ref_sum = sum(float(np.sum(np.round(t.logits.astype(np.float64) * 1000.0) / 1000.0)) for t in traces)
    if not math.isnan(got_sum):
        assert abs(got_sum - ref_sum) < 0.05, (got_sum, ref_sum)
