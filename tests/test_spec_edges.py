"""Specs strong at the numerical edges: every op spec declares its input distributions, every op
family has cases at a numerical edge (Shape.edge), and those cases bite.

The CPU evidence that they bite: a Python copy of the op with a numerical flaw (softmax without its
maximum, softplus without its cut-off, a norm without eps, an overflowing sigmoid) passes the spec's
ordinary cases -- the inputs every spec drew before -- and fails its edge cases; where a float32
emulation of the stable algorithm the known-good uses is cheap, it passes the edge cases (the edge
is within what a right float32 kernel computes).  Judged with the spec's own tolerances
(porter.gates.parity.compare).  The same flaws as mutants of the known-goods (targets/ds4/mutants.toml,
targets/minimoe/adversarial/manifest.toml) are calibrated on a GPU; the host stand-ins
(tests/test_ds4_*host*.py, test_ds4_calibration.py) run the edge cases through the parity child.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from conftest import NO_DS4

from porter.calibration.calibrator import inputs_table
from porter.gates.parity import compare
from porter.gates.parity.scenario import is_scenario
from porter.spec import Exact, inputs_facts, load_specs
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
F = np.float32


def _checkout() -> Path | None:
    p = REPO / "external" / "ds4"
    return p.resolve() if (p / "ds4_gpu.h").is_file() else None


CHECKOUT = _checkout()
needs_checkout = pytest.mark.skipif(CHECKOUT is None, reason=NO_DS4 + " (the ds4 specs bind against its ds4_gpu.h)")

# every op family with a known-good that is stable at an edge has cases there
EDGE_UNITS = {
    "ds4": {"ds4_gpu_attention_prefill_raw_heads_tensor", "ds4_gpu_attention_prefill_static_mixed_heads_tensor",
            "ds4_gpu_attention_prefill_masked_mixed_heads_tensor", "ds4_gpu_attention_decode_heads_tensor",
            "ds4_gpu_attention_decode_raw_batch_heads_tensor", "ds4_gpu_attention_decode_mixed_batch_heads_tensor",
            "ds4_gpu_attention_indexed_mixed_batch_heads_tensor", "ds4_gpu_router_select_tensor",
            "ds4_gpu_router_select_batch_tensor", "ds4_gpu_rms_norm_plain_tensor", "ds4_gpu_rms_norm_plain_rows_tensor",
            "ds4_gpu_rms_norm_weight_tensor", "ds4_gpu_rms_norm_weight_rows_tensor", "ds4_gpu_head_rms_norm_tensor",
            "ds4_gpu_dsv4_qkv_rms_norm_rows_tensor", "ds4_gpu_swiglu_tensor", "ds4_gpu_hc_split_sinkhorn_tensor",
            "ds4_gpu_hc_split_weighted_sum_tensor", "ds4_gpu_hc_split_weighted_sum_norm_tensor",
            "ds4_gpu_compressor_update_tensor", "ds4_gpu_compressor_prefill_tensor", "ds4_gpu_indexer_topk_tensor",
            "ds4_gpu_matmul_f32_tensor", "ds4_gpu_matmul_f16_tensor", "ds4_gpu_matmul_f16_pair_tensor",
            "ds4_gpu_matmul_q8_0_tensor", "ds4_gpu_matmul_q8_0_hc_expand_tensor",
            "ds4_gpu_shared_down_hc_expand_q8_0_tensor", "ds4_gpu_shared_gate_up_swiglu_q8_0_tensor"},
    "minimoe": {"mini_gpu_attention_window_tensor", "mini_gpu_router_topk_tensor", "mini_gpu_rms_norm_plain_rows_tensor",
                "mini_gpu_rms_norm_weight_rows_tensor", "mini_gpu_swiglu_tensor"},
}


def _target(name):
    if name == "ds4" and CHECKOUT is None:
        pytest.skip(NO_DS4)
    return load_target(REPO, name, CHECKOUT if name == "ds4" else None)


def _op_specs(name):
    return {u: s for u, s in load_specs(_target(name)).items() if not is_scenario(s)}


@pytest.mark.parametrize("name", ["ds4", "minimoe"])
def test_every_op_spec_declares_its_inputs_and_each_family_has_edge_cases(name):
    specs = _op_specs(name)
    assert [u for u, s in specs.items() if not s.inputs.strip()] == []
    with_edges = {u for u, s in specs.items() if inputs_facts(s)["edges"]}
    assert EDGE_UNITS[name] <= with_edges, sorted(EDGE_UNITS[name] - with_edges)
    for u in EDGE_UNITS[name]:  # an edge case is a case the spec runs: never an error case
        assert all(sh.expect == "ok" for sh in specs[u].shapes if sh.edge), u


def test_the_calibration_table_shows_inputs_and_edge_counts():
    report = {"inputs": {"mini_gpu_swiglu_tensor": {"inputs": "gate ~ N(0, 9)", "cases": 5, "edges": ["a", "b"]},
                         "mini_gpu_add_tensor": {"inputs": "", "cases": 3, "edges": []},
                         "mini_gpu_init": {"inputs": "", "cases": 0, "edges": []}}}
    lines = inputs_table(report, "mini_gpu_").splitlines()
    assert any(ln.split()[:3] == ["swiglu", "5", "2"] and ln.endswith("gate ~ N(0, 9)") for ln in lines)
    assert any(ln.split()[0] == "add" and ln.endswith("UNDECLARED") for ln in lines)  # a spec without it shows
    assert not any(ln.split()[0] == "init" for ln in lines)  # runtime scenarios draw no numbers


# ---------------------------------------------------------------------------
# the CPU evidence: a flawed copy passes the ordinary cases and fails the edge cases
# ---------------------------------------------------------------------------

def _passes(spec, call, got: dict) -> bool:
    for name, tol in spec.outputs.items():
        ref, out = np.asarray(call.expect[name]), np.asarray(got[name])
        if isinstance(tol, Exact):
            if not np.array_equal(ref.reshape(-1), out.reshape(-1)):
                return False
            continue
        m = compare.float_metrics(out.reshape(ref.shape).astype(np.float32), ref)
        if compare.tolerance_violations(m, tol.nmse, tol.max_err_rms, tol.max_abs):
            return False
    return True


def _cases(spec, labels, seed=7, ctx=None):
    """{label: Call} of the named cases (inputs and the true reference's outputs)."""
    calls = {sh.label: spec.build(sh, ctx, np.random.default_rng(seed)) for sh in spec.shapes if sh.label in labels}
    assert set(calls) == set(labels), set(labels) - set(calls)
    return calls


def _judge(spec, calls, op):
    """{label: passes} for op(call.args) on each case."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return {lab: _passes(spec, call, op(call.args)) for lab, call in calls.items()}


def _verdicts(spec, labels, op, seed=7, ctx=None):
    return _judge(spec, _cases(spec, labels, seed, ctx), op)


def _edge_labels(spec, limit=None):
    return [sh.label for sh in spec.shapes if sh.edge and (limit is None or limit(sh))]


def _sinks(args, n_head):
    off = args["sinks_offset"]
    return args["model_map"].array[off:off + 4 * n_head].view("<f4").astype(F)


def _softmax_rows(s, sinks, stable: bool):
    """float32 softmax over the last axis with the sinks' mass in the denominator, as a kernel takes it."""
    m = np.maximum(s.max(axis=-1), sinks) if stable else np.zeros(s.shape[:-1], F)
    w = np.exp((s - m[..., None]).astype(F), dtype=F)
    return w, (w.sum(axis=-1, dtype=F) + np.exp((sinks - m).astype(F), dtype=F)).astype(F)


def _ds4_prefill_raw(stable):
    def op(a):
        nt, nh, hd, win = a["n_tokens"], a["n_head"], a["head_dim"], a["window"]
        q, kv, sinks = a["q"].array.reshape(nt, nh, hd), a["raw_kv"].array.reshape(nt, hd), _sinks(a, nh)
        out = np.zeros((nt, nh, hd), F)
        for t in range(nt):
            rows = kv[max(0, t + 1 - win) if win else 0:t + 1]
            w, den = _softmax_rows((q[t] @ rows.T * F(1 / np.sqrt(hd))).astype(F), sinks, stable)
            out[t] = (w @ rows) / den[:, None]
        return {"heads": out}
    return op


@needs_checkout
def test_ds4_attention_softmax_without_its_max_fails_only_the_shifted_scores():
    spec = _op_specs("ds4")["ds4_gpu_attention_prefill_raw_heads_tensor"]
    small = lambda sh: sh.dims["n_tokens"] * sh.dims["n_head"] <= 500  # noqa: E731 - CPU time
    ordinary = [sh.label for sh in spec.shapes if not sh.edge and sh.expect == "ok" and small(sh)]
    edges = _edge_labels(spec, small)
    assert len(ordinary) >= 3 and len(edges) >= 2
    assert all(_verdicts(spec, ordinary, _ds4_prefill_raw(stable=False)).values())  # blind without the edges
    assert not any(_verdicts(spec, edges, _ds4_prefill_raw(stable=False)).values())
    assert all(_verdicts(spec, edges, _ds4_prefill_raw(stable=True)).values())  # float32, max subtracted: inside


@needs_checkout
def test_ds4_router_softplus_without_its_cutoff_fails_only_the_huge_logits(monkeypatch):
    from reference import ds4_hc_ops as ref

    spec = _op_specs("ds4")["ds4_gpu_router_select_tensor"]
    ordinary = [sh.label for sh in spec.shapes if not sh.edge and sh.expect == "ok" and not sh.dims["hash_mode"]]
    edges = _edge_labels(spec)
    assert ordinary and edges

    def fragile_probs(logits):  # float32 log1p(exp(x)) above -20: inf past 88.7
        z = np.asarray(logits, F)
        return np.sqrt(np.where(z < -20, np.exp(z, dtype=F), np.log1p(np.exp(z, dtype=F), dtype=F)), dtype=F)

    def op(a):
        sel, w, probs, _ = ref.router_select(a["model_map"].array, a["bias_offset"], a["hash_offset"],
                                             a["hash_rows"], a["token"], 0, 0, a["has_bias"], a["hash_mode"],
                                             a["logits"].array)
        return {"selected": sel, "weights": w, "probs": probs}

    calls = _cases(spec, ordinary + edges)  # inputs and references before the flaw goes in
    assert all(_judge(spec, calls, op).values())  # the reference through this harness: every case passes
    monkeypatch.setattr(ref, "router_probs", fragile_probs)
    verdicts = _judge(spec, calls, op)
    assert all(verdicts[lab] for lab in ordinary)
    assert not any(verdicts[lab] for lab in edges)


@needs_checkout
def test_ds4_norm_without_eps_fails_the_rows_near_zero():
    from reference import ds4_hc_ops as ref

    spec = _op_specs("ds4")["ds4_gpu_rms_norm_weight_rows_tensor"]

    def op(a):  # the reference with eps 0: x / sqrt(mean square)
        return {"out": ref.rms_norm_weight_rows(a["x"].array, a["model_map"].array, a["weight_offset"], a["n"],
                                                a["rows"], 0.0)}

    edges = _edge_labels(spec)
    assert edges and not any(_verdicts(spec, edges, op).values())


@needs_checkout
def test_ds4_swiglu_with_an_overflowing_sigmoid_fails_only_the_far_gates():
    spec = _op_specs("ds4")["ds4_gpu_swiglu_tensor"]
    small = lambda sh: sh.dims["n"] <= 4096  # noqa: E731

    def op(a):
        g, u, c = a["gate"].array.astype(F), a["up"].array.astype(F), F(a["clamp"])
        if c > F(1e-6):
            g, u = np.minimum(g, c), np.clip(u, -c, c)
        e = np.exp(g, dtype=F)
        return {"out": (g * (e / (F(1) + e)) * u * F(a["weight"])).astype(F)}

    ordinary = [sh.label for sh in spec.shapes if not sh.edge and small(sh) and sh.expect == "ok"]
    edges = _edge_labels(spec)
    assert ordinary and edges
    assert all(_verdicts(spec, ordinary, op).values())
    # the unclamped case overflows; under the clamp (g <= 10) the flawed form is harmless, as upstream's
    verdicts = _verdicts(spec, edges, op)
    assert [lab for lab, ok in verdicts.items() if not ok] == [sh.label for sh in spec.shapes
                                                              if sh.edge and sh.dims["clamp"] == 0]


def _sinkhorn32(stable):
    """hc4_split_one (ds4_cuda.cu) in float32, row by row: the combine softmax with or without its max."""
    def one(mix, sc, base, iters, eps):
        out, lin = np.zeros(24, F), (lambda i, s: F(F(mix[i] * s) + base[i]))
        for i in range(4):
            out[i] = F(1) / (F(1) + np.exp(-lin(i, sc[0]), dtype=F)) + eps
            out[4 + i] = F(2) / (F(1) + np.exp(-lin(4 + i, sc[1]), dtype=F))
        c = np.array([lin(8 + i, sc[2]) for i in range(16)], F).reshape(4, 4)
        m = c.max(axis=1, keepdims=True) if stable else np.zeros((4, 1), F)
        c = np.exp(c - m, dtype=F)
        c = (c / c.sum(axis=1, keepdims=True, dtype=F) + eps).astype(F)
        c = (c / (c.sum(axis=0, keepdims=True, dtype=F) + eps)).astype(F)
        for _ in range(1, iters):
            c = (c / (c.sum(axis=1, keepdims=True, dtype=F) + eps)).astype(F)
            c = (c / (c.sum(axis=0, keepdims=True, dtype=F) + eps)).astype(F)
        out[8:] = c.reshape(-1)
        return out

    def op(a):
        mm = a["model_map"].array
        sc = mm[a["scale_offset"]:a["scale_offset"] + 12].view("<f4")
        base = mm[a["base_offset"]:a["base_offset"] + 96].view("<f4")
        mix = a["mix"].array.reshape(-1, 24)
        return {"out": np.stack([one(r, sc, base, a["sinkhorn_iters"], F(a["eps"])) for r in mix])}
    return op


@needs_checkout
def test_ds4_sinkhorn_softmax_without_its_max_fails_only_the_shifted_combine():
    spec = _op_specs("ds4")["ds4_gpu_hc_split_sinkhorn_tensor"]
    small = lambda sh: sh.dims["n_rows"] <= 8  # noqa: E731
    ordinary = [sh.label for sh in spec.shapes if not sh.edge and sh.expect == "ok" and small(sh)]
    edges = _edge_labels(spec, small)
    assert ordinary and edges
    assert all(_verdicts(spec, ordinary, _sinkhorn32(stable=False)).values())
    assert not any(_verdicts(spec, edges, _sinkhorn32(stable=False)).values())
    # float32 with the max, against the float64 reference under the spec's NMSE 1e-11: inside
    assert all(_verdicts(spec, edges, _sinkhorn32(stable=True)).values())


# ---- ds4 projections: cancelling sums and outputs past f16's range ---------------------------

def _dense_w(a, key, rows, n, dtype):
    off = a[key]
    return a["model_map"].array[off:off + rows * n * np.dtype(dtype).itemsize].view(dtype).reshape(rows, n).astype(F)


def _q8_w(a, key, rows, n):
    from reference import quant

    blocks = (n + 31) // 32
    raw = a["model_map"].array[a[key]:a[key] + rows * blocks * 34].reshape(rows, blocks * 34)
    b = raw.reshape(rows, blocks, 34)
    d = b[:, :, :2].copy().view("<f2").reshape(rows, blocks).astype(F)
    q = b[:, :, 2:].view(np.int8).astype(np.int32)
    assert np.allclose(quant.dequantize(raw, "Q8_0", (rows, blocks * 32))[:1], (q * d[:, :, None]).reshape(rows, -1)[:1])
    return d, q


def _accumulate(terms, half: bool, chunk):
    """Sum the last axis of float32 terms as a kernel does.  half=False: 32 float32 lane sums over
    a strided split, then their float32 sum (upstream's warp reduction; its Q8 block sums).  half=True:
    the flaw -- split-K partials of `chunk` terms, each stored and accumulated in float16."""
    if not half:
        k = terms.shape[-1]
        t = np.pad(terms, [(0, 0)] * (terms.ndim - 1) + [(0, -k % 32)]).astype(F)
        return t.reshape(*terms.shape[:-1], -1, 32).sum(axis=-2, dtype=F).sum(axis=-1, dtype=F)
    k = terms.shape[-1]
    t = np.pad(terms, [(0, 0)] * (terms.ndim - 1) + [(0, -k % chunk)]).astype(F)
    parts = t.reshape(*terms.shape[:-1], -1, chunk).sum(axis=-1, dtype=F).astype(np.float16)
    acc = np.zeros(terms.shape[:-1], np.float16)
    for c in range(parts.shape[-1]):
        acc = (acc + parts[..., c]).astype(np.float16)
    return acc.astype(F)


def _project(w, x, half):
    """float32 W x per token (W float32 rows), accumulated by _accumulate (256-term split-K chunks)."""
    return np.stack([_accumulate((w * xt[None, :]).astype(F), half, 256) for xt in np.atleast_2d(x)])


def _project_q8(d, q, x, half):
    """Upstream's Q8_0 path: x quantized per block (d = amax/127), integer block dots, float32 block
    sums d_w d_x isum (the flaw: split-K chunks of 8 blocks in float16)."""
    from reference import ds4_ops as ops

    xq, xd = ops.quantize_q8_0_activation(np.atleast_2d(x))
    rows = []
    for t in range(xq.shape[0]):
        isum = np.einsum("obk,bk->ob", q, xq[t].reshape(-1, 32).astype(np.int32))
        rows.append(_accumulate((d * xd[t][None, :] * isum.astype(F)).astype(F), half, 8))
    return np.stack(rows)


def _hc(block, a, extra=0.0):
    n_hc, n_embd = a["n_hc"], a["n_embd"]
    split, res = a["split"].array.astype(np.float64), a["residual_hc"].array.astype(np.float64)
    post, comb = split[n_hc:2 * n_hc], split[2 * n_hc:]
    y = block[:n_embd].astype(np.float64) + extra
    return np.stack([y * post[h] + sum(comb[h + s * n_hc] * res[s] for s in range(n_hc)) for h in range(n_hc)])


def _projection_ops(half):
    """{unit: op(args) -> outputs} emulating each projection with float32 (or the f16 flaw) sums."""
    def f32(a):
        w = _dense_w(a, "weight_offset", a["out_dim"], a["in_dim"], "<f4")
        return {"out": _project(w, a["x"].array, half)}

    def f16(a):
        w = _dense_w(a, "weight_offset", a["out_dim"], a["in_dim"], "<f2")
        return {"out": _project(w, a["x"].array, half)}

    def pair(a):
        wa = _dense_w(a, "weight_a_offset", a["out_dim"], a["in_dim"], "<f2")
        wb = _dense_w(a, "weight_b_offset", a["out_dim"], a["in_dim"], "<f2")
        return {"out_a": _project(wa, a["x"].array, half), "out_b": _project(wb, a["x"].array, half)}

    def q8(a):
        d, q = _q8_w(a, "weight_offset", a["out_dim"], a["in_dim"])
        return {"out": _project_q8(d, q, a["x"].array.reshape(a["n_tok"], -1), half)}

    def hc_expand(a):
        d, q = _q8_w(a, "weight_offset", a["out_dim"], a["in_dim"])
        block = _project_q8(d, q, a["x"].array, half)[0]
        return {"block_out": block, "out_hc": _hc(block, a)}

    def shared_down(a):
        d, q = _q8_w(a, "weight_offset", a["out_dim"], a["in_dim"])
        block = _project_q8(d, q, a["shared_mid"].array, half)[0]
        return {"shared_out": block, "out_hc": _hc(block, a, a["routed_out"].array[:a["n_embd"]])}

    def gate_up(a):
        c = F(a["clamp"])
        g, u = (_project_q8(*_q8_w(a, k, a["out_dim"], a["in_dim"]), a["x"].array, half)[0]
                for k in ("gate_offset", "up_offset"))
        gc, uc = (np.minimum(g, c), np.clip(u, -c, c)) if c > F(1e-6) else (g, u)
        with np.errstate(over="ignore"):
            mid = (gc / (F(1) + np.exp(-gc, dtype=F)) * uc).astype(F)
        return {"gate": g, "up": u, "mid": mid}

    return {"ds4_gpu_matmul_f32_tensor": f32, "ds4_gpu_matmul_f16_tensor": f16, "ds4_gpu_matmul_f16_pair_tensor": pair,
            "ds4_gpu_matmul_q8_0_tensor": q8, "ds4_gpu_matmul_q8_0_hc_expand_tensor": hc_expand,
            "ds4_gpu_shared_down_hc_expand_q8_0_tensor": shared_down,
            "ds4_gpu_shared_gate_up_swiglu_q8_0_tensor": gate_up}


def _cheap(sh):  # CPU time: at most ~4M multiply-adds a case
    d = sh.dims
    n_tok = d.get("n_tok", 1)
    return sh.expect == "ok" and not d.get("vocab") and n_tok * d["in_dim"] * d.get("out_dim", d.get("n_embd", 0)) <= 1 << 25


@needs_checkout
@pytest.mark.parametrize("unit", sorted(_projection_ops(False)))
def test_ds4_projections_with_f16_partial_sums_fail_only_the_edge_cases(unit):
    from porter.spec import Context

    spec = _op_specs("ds4")[unit]
    # at 16384 wide the ordinary cases already catch f16 partials (64 chunks): the edges matter below
    ordinary = [sh.label for sh in spec.shapes if not sh.edge and _cheap(sh) and sh.dims["in_dim"] <= 8192]
    edges = _edge_labels(spec, _cheap)
    assert ordinary and edges and {e.split(",")[0] for e in edges} >= {"edge: cancelling halves"}
    calls = _cases(spec, ordinary + edges, ctx=Context(None, None))
    stable = _judge(spec, calls, _projection_ops(half=False)[unit])
    flawed = _judge(spec, calls, _projection_ops(half=True)[unit])
    assert all(stable.values()), [lab for lab, ok in stable.items() if not ok]  # float32 sums: inside every bound
    assert all(flawed[lab] for lab in ordinary), [lab for lab in ordinary if not flawed[lab]]  # blind without edges
    assert not any(flawed[lab] for lab in edges), [lab for lab in edges if flawed[lab]]


@needs_checkout
def test_ds4_cancelling_inputs_cancel_and_sit_on_an_exact_grid():
    """The cancelling case is what it says: outputs ~1e3 below the sum of their terms' magnitudes,
    and x exact under Q8_0 activation quantization and F16 (so every upstream path meets the reference)."""
    from porter.spec import Context
    from reference import ds4_ops as ops

    spec = _op_specs("ds4")["ds4_gpu_matmul_q8_0_tensor"]
    lab = "edge: cancelling halves, attn_kv 4096->512, decode"
    a = _cases(spec, [lab], ctx=Context(None, None))[lab].args
    d, q = _q8_w(a, "weight_offset", 512, 4096)
    w, x = (q * d[:, :, None]).reshape(512, 4096).astype(np.float64), a["x"].array.astype(np.float64)
    ratio = np.median((np.abs(w) @ np.abs(x).T).ravel() / np.abs(w @ x.T).ravel())
    assert ratio > 300, ratio
    xq, xd = ops.quantize_q8_0_activation(a["x"].array)
    assert np.array_equal((xq.reshape(1, -1, 32) * xd[:, :, None]).reshape(1, -1), a["x"].array)
    assert np.array_equal(a["x"].array.astype(np.float16).astype(F), a["x"].array)


# ---- minimoe ---------------------------------------------------------------------------------

def _fixture_ctx():
    from porter.spec import Context

    return Context.for_target(_target("minimoe"))


def _mini_verdicts(spec, labels, op, seed=7):
    return _verdicts(spec, labels, op, seed, _fixture_ctx())


def _mini_attention(stable):
    def op(a):
        nt, p0, nh, hd, win, scale = (a["n_tokens"], a["pos0"], a["n_head"], a["head_dim"], a["window"],
                                      F(a["scale"]))
        q, k, v = a["q"].array.reshape(nt, nh, hd), a["k_cache"].array, a["v_cache"].array
        sinks, out = _sinks(a, nh), np.zeros((nt, nh, hd), F)
        for t in range(nt):
            p = p0 + t
            lo = max(0, p - win + 1)
            w, den = _softmax_rows((q[t] @ k[lo:p + 1].T * scale).astype(F), sinks, stable)
            out[t] = (w @ v[lo:p + 1]) / den[:, None]
        return {"out": out}
    return op


def test_minimoe_attention_softmax_without_its_max_fails_only_the_shifted_scores():
    spec = _op_specs("minimoe")["mini_gpu_attention_window_tensor"]
    ordinary = [sh.label for sh in spec.shapes if not sh.edge and sh.expect == "ok" and not sh.timed]
    edges = _edge_labels(spec)
    assert ordinary and edges
    assert all(_mini_verdicts(spec, ordinary, _mini_attention(stable=False)).values())
    assert not any(_mini_verdicts(spec, edges, _mini_attention(stable=False)).values())
    assert all(_mini_verdicts(spec, edges, _mini_attention(stable=True)).values())


def test_minimoe_router_softmax_without_its_max_fails_only_the_shifted_logits():
    from reference import minimoe_ops as ops

    spec = _op_specs("minimoe")["mini_gpu_router_topk_tensor"]

    def op(a):  # the right experts, weights from float32 expf(logit) without the max
        ids, _ = ops.router_topk(a["logits"].array, a["n_expert"], a["n_tokens"], a["top_k"])
        lg = a["logits"].array.reshape(a["n_tokens"], a["n_expert"]).astype(F)
        chosen = np.exp(np.take_along_axis(lg, ids.astype(np.int64), axis=1), dtype=F)
        return {"expert_ids": ids, "expert_weights": (chosen / chosen.sum(axis=1, keepdims=True, dtype=F)).astype(F)}

    ordinary = [sh.label for sh in spec.shapes if not sh.edge and sh.expect == "ok" and not sh.timed]
    assert ordinary and _edge_labels(spec)
    assert all(_mini_verdicts(spec, ordinary, op).values())
    assert not any(_mini_verdicts(spec, _edge_labels(spec), op).values())


def test_minimoe_norm_without_eps_fails_the_rows_near_zero():
    from reference import minimoe_ops as ops

    spec = _op_specs("minimoe")["mini_gpu_rms_norm_plain_rows_tensor"]
    op = lambda a: {"out": ops.rms_norm_plain_rows(a["x"].array, a["n"], a["n_rows"], 0.0)}  # noqa: E731
    assert _edge_labels(spec)
    assert not any(_mini_verdicts(spec, _edge_labels(spec), op).values())


def test_minimoe_swiglu_with_an_overflowing_sigmoid_fails_the_far_gates():
    spec = _op_specs("minimoe")["mini_gpu_swiglu_tensor"]

    def op(a):
        g = a["gate"].array.astype(F)
        e = np.exp(g, dtype=F)
        return {"out": (g * (e / (F(1) + e)) * a["up"].array.astype(F)).astype(F)}

    assert _edge_labels(spec)
    assert not any(_mini_verdicts(spec, _edge_labels(spec), op).values())
    assert _mini_verdicts(spec, ["n=1", "n=7"], op) == {"n=1": True, "n=7": True}  # no far gate below n = 8


def test_edge_cases_change_no_ordinary_case():
    """The edge generators draw nothing for ordinary cases: their inputs are the ones calibrated before."""
    spec = _op_specs("minimoe")["mini_gpu_rms_norm_plain_rows_tensor"]
    sh = next(s for s in spec.shapes if not s.edge)
    a = spec.build(sh, None, np.random.default_rng(3)).args["x"].array
    rng = np.random.default_rng(3)
    scale = np.exp(rng.uniform(np.log(0.1), np.log(10.0), (sh.dims["rows"], 1)))
    assert np.array_equal(a, (rng.standard_normal((sh.dims["rows"], sh.dims["n"])) * scale).astype(np.float32))
    assert dataclasses.replace(sh).edge == ""
