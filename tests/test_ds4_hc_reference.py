"""reference.ds4_hc_ops checked against second formulations (pure numpy, CI; no ds4 checkout).

Each op is computed a second way -- scalar loops written from ds4.c's CPU
functions (float32 where ds4.c computes in float32, so they also measure the
rounding a right kernel may show), our own F16 bit decoder, a repeated-argmax
router -- and the two must agree within the spec's tolerance.  Then, on the
spec's own inputs, a plausible wrong variant (eps ignored, weight ignored, a
row or token skipped, an off-by-one, a transposed matrix, ties the other way)
must land far outside that tolerance: a tolerance that lets it through means
nothing.
"""
import math
from pathlib import Path

import numpy as np
import pytest

from porter.gates.parity.compare import compare_exact, float_metrics, tolerance_violations
from porter.spec import _load_module
from reference import ds4_hc_ops as ref

SPECS = Path(__file__).resolve().parents[1] / "targets" / "ds4" / "parity"
F = np.float32


def spec(unit):
    return _load_module(SPECS / f"ds4_gpu_{unit}_tensor.py", "ds4test").SPEC


def case(unit, label, seed=7):
    """(shape, call) of the spec's shape whose label starts with `label`, built for one seed."""
    s = spec(unit)
    shape = next(sh for sh in s.shapes if sh.label.startswith(label))
    return s, shape, s.build(shape, None, np.random.default_rng(seed))


def arr(call, name):
    a = call.args[name]
    return a.array


def within(got, want, tol):
    m = float_metrics(got, want)
    return not tolerance_violations(m, tol.nmse, tol.max_err_rms, tol.max_abs), m


def far_outside(got, want, tol, factor=100.0):
    """Outside the tolerance by a wide margin: NMSE over factor x the bound (or not finite)."""
    ok, m = within(got, want, tol)
    if ok:
        return False
    if tol.max_abs == 0.0:  # bit-exact: the variant must differ in many places, not by a hair
        g, w = np.asarray(got, np.float64).reshape(-1), np.asarray(want, np.float64).reshape(-1)
        return int(np.sum(~((g == w) | (np.isnan(g) & np.isnan(w))))) >= max(1, w.size // 100)
    return m["nmse"] is None or m["nmse"] > factor * tol.nmse


# ---------------------------------------------------------------------------
# scalar building blocks written from ds4.c
# ---------------------------------------------------------------------------

def f16_bits_to_float(h: int) -> float:
    """IEEE half from its bits, by hand (ds4.c f16_to_f32): subnormals included."""
    s = -1.0 if h & 0x8000 else 1.0
    e, m = (h >> 10) & 0x1F, h & 0x3FF
    if e == 0:
        return s * m * 2.0 ** -24
    if e == 31:
        return s * (math.inf if m == 0 else math.nan)
    return s * (1 + m / 1024.0) * 2.0 ** (e - 15)


def rms_norm_scalar(row, eps, weight=None):
    """ds4.c rms_norm_no_weight / rms_norm_weight: double sum of squares, float32 scale."""
    ss = math.fsum(float(v) * float(v) for v in row)
    scale = F(1.0) / np.sqrt(F(ss / len(row)) + F(eps))
    w = weight if weight is not None else [F(1.0)] * len(row)
    return np.array([F(F(v) * scale) * F(wi) for v, wi in zip(row, w)], F)


def rms_norm_f32_tree(row, eps):
    """What a CUDA kernel does: float32 per-thread partial sums over a stride of 256 and a
    tree, rsqrtf-like float32 scale -- to measure the slack the norm tolerances need."""
    x = np.asarray(row, F)
    parts = np.zeros(256, F)
    for t in range(256):
        acc = F(0)
        for v in x[t::256]:
            acc = F(acc + F(v * v))
        parts[t] = acc
    step = 128
    while step:
        parts[:step] = parts[:step] + parts[step:2 * step]
        step //= 2
    scale = F(1) / np.sqrt(F(parts[0] / F(x.size)) + F(eps))
    return (x * scale).astype(F)


def sinkhorn_f32(mix, scale, base, n, iters, eps):
    """ds4.c hc_split_sinkhorn_one, statement by statement in float32."""
    out = np.zeros(2 * n + n * n, F)
    eps = F(eps)
    for i in range(n):
        z = F(F(mix[i]) * F(scale[0]) + F(base[i]))
        out[i] = F(F(1) / F(F(1) + np.exp(-z))) + eps
    for i in range(n):
        z = F(F(mix[n + i]) * F(scale[1]) + F(base[n + i]))
        out[n + i] = F(2) / F(F(1) + np.exp(-z))
    c = np.zeros(n * n, F)
    for dst in range(n):
        mx = F(-1e30)
        for src in range(n):
            v = F(F(mix[2 * n + src + dst * n]) * F(scale[2]) + F(base[2 * n + src + dst * n]))
            c[src + dst * n] = v
            mx = max(mx, v)
        s = F(0)
        for src in range(n):
            c[src + dst * n] = np.exp(F(c[src + dst * n] - mx))
            s = F(s + c[src + dst * n])
        inv = F(1) / s
        for src in range(n):
            c[src + dst * n] = F(F(c[src + dst * n] * inv) + eps)

    def normalise(fixed_is_dst):
        for a in range(n):
            idx = [(b + a * n) if fixed_is_dst else (a + b * n) for b in range(n)]
            s = F(0)
            for i in idx:
                s = F(s + c[i])
            inv = F(1) / F(s + eps)
            for i in idx:
                c[i] = F(c[i] * inv)

    normalise(False)  # columns: fixed src, summed over dst
    for _ in range(1, iters):
        normalise(True)
        normalise(False)
    out[2 * n:] = c
    return out


def hc_post_scalar(block, residual, post, comb, n_embd, n_hc):
    """ds4.c hc_post_one, one token."""
    out = np.zeros((n_hc, n_embd), np.float64)
    for dst in range(n_hc):
        for d in range(n_embd):
            acc = float(block[d]) * float(post[dst])
            for src in range(n_hc):
                acc += float(comb[dst + src * n_hc]) * float(residual[src][d])
            out[dst][d] = acc
    return out.astype(F)


def sigmoid_stable(x):
    """ds4.c sigmoid_stable's two branches."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


# ---------------------------------------------------------------------------
# embedding, repeat, add, mask
# ---------------------------------------------------------------------------

def test_embed_token_hc_matches_a_hand_f16_decoder_and_rejects_bf16():
    s, shape, call = case("embed_token_hc", "odd")
    m, off, d = call.args["model_map"].array, call.args["weight_offset"], shape.dims
    n_vocab, n_embd, n_hc, tok = d["n_vocab"], d["n_embd"], d["n_hc"], call.args["token"]
    bits = m[off:off + n_vocab * n_embd * 2].view("<u2").reshape(n_vocab, n_embd)
    row = [f16_bits_to_float(int(b)) for b in bits[tok]]
    want = np.array([row] * n_hc, F)
    assert np.array_equal(call.expect["out_hc"], want)
    assert np.any((np.abs(want) > 0) & (np.abs(want) < 6.1e-5))  # subnormals are in the data
    bf16 = np.array([[np.frombuffer((int(b) << 16).to_bytes(4, "little"), "<f4")[0] for b in bits[tok]]] * n_hc)
    assert far_outside(bf16, want, s.outputs["out_hc"])
    s, shape, call = case("embed_token_hc", "decode")
    got = call.expect["out_hc"]
    one_stream = got.copy()
    one_stream[1:] = np.nan  # streams never written
    assert far_outside(one_stream, got, s.outputs["out_hc"])


def test_embed_tokens_hc_rows_per_token_and_layout():
    s, shape, call = case("embed_tokens_hc", "odd")
    d = shape.dims
    m, off, toks = call.args["model_map"].array, call.args["weight_offset"], arr(call, "tokens")
    bits = m[off:off + d["n_vocab"] * d["n_embd"] * 2].view("<u2").reshape(d["n_vocab"], d["n_embd"])
    want = np.array([[[f16_bits_to_float(int(b)) for b in bits[t]]] * d["n_hc"] for t in toks], F)
    assert np.array_equal(call.expect["out_hc"], want)
    assert toks[0] == d["n_vocab"] - 1 and 0 in toks
    stream_major = want.transpose(1, 0, 2).reshape(want.shape)  # [hc][t][d] read as [t][hc][d]
    assert far_outside(stream_major, want, s.outputs["out_hc"])
    with pytest.raises(ValueError, match="outside the embedding table"):
        ref.embed_tokens_hc(np.array([d["n_vocab"]], np.int32), m, off, d["n_vocab"], 1, d["n_embd"], d["n_hc"])


def test_repeat_hc_and_add_scalar():
    s, shape, call = case("repeat_hc", "odd: 37")
    row = arr(call, "row")
    want = np.array([[row[d] for d in range(37)] for _ in range(3)], F)
    assert np.array_equal(call.expect["out"], want)
    interleaved = np.array([row[i // 3] for i in range(37 * 3)], F).reshape(3, 37)
    assert far_outside(interleaved, want, s.outputs["out"])

    s, shape, call = case("add", "odd 1000")
    a, b = arr(call, "a"), arr(call, "b")
    want = np.array([F(x) + F(y) for x, y in zip(a, b)], F)
    assert np.array_equal(call.expect["out"], want)
    assert far_outside((a + a).astype(F), want, s.outputs["out"])
    tail_lost = want.copy()
    tail_lost[768:] = np.nan  # a grid rounded down: the last partial block never written
    assert far_outside(tail_lost, want, s.outputs["out"])


def test_topk_mask_from_sets_and_the_off_by_one():
    s, shape, call = case("dsv4_topk_mask", "odd")
    d = shape.dims
    sel = arr(call, "topk")
    want = np.array([[0.0 if c in set(sel[t].tolist()) else -np.inf for c in range(d["n_comp"])]
                     for t in range(d["n_tokens"])], F)
    assert np.array_equal(call.expect["mask"], want)
    assert np.all((want == 0).sum(axis=1) == d["top_k"])
    for t in range(d["n_tokens"]):  # the first and last compressed row are among the chosen
        assert 0 in sel[t] and d["n_comp"] - 1 in sel[t]
    skipped = ref.dsv4_topk_mask(sel[:, :-1], d["n_comp"], d["n_tokens"], d["top_k"] - 1)
    ok, m = within(skipped, want, s.outputs["mask"])
    assert not ok and m["n_nonfinite"] == d["n_tokens"]  # one -inf per row where 0 is due
    zero_for_inf = np.where(np.isinf(want), 0, want)
    assert not within(zero_for_inf, want, s.outputs["mask"])[0]


# ---------------------------------------------------------------------------
# RMS norms
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("unit,label", [("rms_norm_plain", "odd 33"), ("rms_norm_plain", "n=3"),
                                        ("rms_norm_plain", "n=1")])
def test_rms_norm_plain_scalar(unit, label):
    s, shape, call = case(unit, label)
    x, eps = arr(call, "x"), shape.dims["eps"]
    want = rms_norm_scalar(x, eps)
    assert within(call.expect["out"], want, s.outputs["out"])[0]


def test_rms_norm_tolerance_covers_a_float32_kernel_and_rejects_eps_and_tail_faults():
    s, shape, call = case("rms_norm_plain", "decode")
    tol = s.outputs["out"]
    x = arr(call, "x")
    ok, m = within(rms_norm_f32_tree(x, shape.dims["eps"]), call.expect["out"], tol)
    assert ok and m["nmse"] < tol.nmse / 10, m  # a float32 tree reduction sits well inside
    s, shape, call = case("rms_norm_plain", "n=3")
    x = arr(call, "x")
    assert far_outside(rms_norm_scalar(x, 0.0), call.expect["out"], tol)
    s, shape, call = case("rms_norm_plain", "odd 4097")
    no_tail = call.expect["out"].copy()
    no_tail[4096:] = np.nan
    assert not within(no_tail, call.expect["out"], tol)[0]


def test_rms_norm_weight_rows_scalar_and_faults():
    s, shape, call = case("rms_norm_weight_rows", "odd: 5 rows")
    d, tol = shape.dims, s.outputs["out"]
    m, off = call.args["model_map"].array, call.args["weight_offset"]
    w = m[off:off + 4 * d["n"]].view("<f4")
    x = arr(call, "x")
    want = np.stack([rms_norm_scalar(r, d["eps"], w) for r in x])
    assert within(call.expect["out"], want, tol)[0]
    assert far_outside(np.stack([rms_norm_scalar(r, d["eps"]) for r in x]), want, tol)  # weight ignored
    shifted = want.copy()
    shifted[1:] = want[:-1]  # each row normalised with its neighbour's scale and values: a row skipped
    assert far_outside(shifted, want, tol)
    s, shape, call = case("rms_norm_weight_rows", "eps 0.5")
    x = arr(call, "x")
    m, off = call.args["model_map"].array, call.args["weight_offset"]
    assert far_outside(ref.rms_norm_weight_rows(x, m, off, 2, 3, 0.0), call.expect["out"], tol)


def test_rms_norm_weight_single_row_is_the_rows_op():
    s, shape, call = case("rms_norm_weight", "odd 33")
    m, off = call.args["model_map"].array, call.args["weight_offset"]
    w = m[off:off + 4 * 33].view("<f4")
    want = rms_norm_scalar(arr(call, "x"), shape.dims["eps"], w)
    assert within(call.expect["out"], want, s.outputs["out"])[0]
    s, shape, call = case("rms_norm_weight", "eps 0.5")
    m, off = call.args["model_map"].array, call.args["weight_offset"]
    assert far_outside(ref.rms_norm_weight(arr(call, "x"), m, off, 3, 0.0), call.expect["out"], s.outputs["out"])


def test_qkv_norm_two_independent_norms():
    s, shape, call = case("dsv4_qkv_rms_norm_rows", "odd")
    d = shape.dims
    m = call.args["model_map"].array
    qw = m[call.args["q_weight_offset"]:][:4 * d["q_n"]].view("<f4")
    kw = m[call.args["kv_weight_offset"]:][:4 * d["kv_n"]].view("<f4")
    q, kv = arr(call, "q"), arr(call, "kv")
    q_want = np.stack([rms_norm_scalar(r, d["eps"], qw) for r in q])
    kv_want = np.stack([rms_norm_scalar(r, d["eps"], kw) for r in kv])
    assert within(call.expect["q_out"], q_want, s.outputs["q_out"])[0]
    assert within(call.expect["kv_out"], kv_want, s.outputs["kv_out"])[0]
    kv_with_q_weight = np.stack([rms_norm_scalar(r, d["eps"], qw[:d["kv_n"]]) for r in kv])
    assert far_outside(kv_with_q_weight, kv_want, s.outputs["kv_out"])


def test_head_norm_scalar_and_eps():
    s, shape, call = case("head_rms_norm", "odd: 5 tokens")
    d = shape.dims
    x = arr(call, "x")
    want = np.array([[rms_norm_scalar(x[t, h], d["eps"]) for h in range(d["n_head"])] for t in range(d["n_tok"])])
    assert within(call.expect["x"], want, s.outputs["x"])[0]
    untouched = want.copy()
    untouched[1:] = x[1:]  # only the first token's heads normalised
    assert far_outside(untouched, want, s.outputs["x"])
    s, shape, call = case("head_rms_norm", "eps 0.5")
    d = shape.dims
    assert far_outside(ref.head_rms_norm(arr(call, "x"), d["n_tok"], d["n_head"], d["head_dim"], 0.0),
                       call.expect["x"], s.outputs["x"])


# ---------------------------------------------------------------------------
# hyper-connections
# ---------------------------------------------------------------------------

def _hc_inputs(call, n_rows):
    m = call.args["model_map"].array
    scale = m[call.args["scale_offset"]:][:12].view("<f4")
    base = m[call.args["base_offset"]:][:4 * 24].view("<f4")
    return scale, base


@pytest.mark.parametrize("label", ["7 tokens", "1 iteration", "3 iterations", "eps 0.1"])
def test_sinkhorn_matches_ds4c_in_float32(label):
    s, shape, call = case("hc_split_sinkhorn", label)
    d, tol = shape.dims, s.outputs["out"]
    scale, base = _hc_inputs(call, d["n_rows"])
    mix = arr(call, "mix")
    f32 = np.stack([sinkhorn_f32(r, scale, base, 4, d["iters"], d["eps"]) for r in mix])
    ok, m = within(f32, call.expect["out"], tol)
    assert ok and m["nmse"] < tol.nmse / 100, m  # ds4.c's own float32 rounding is far inside the bound
    comb = call.expect["out"][:, 8:].reshape(-1, 4, 4)  # [dst][src]
    if d["iters"] > 1 and d["eps"] < 1e-3:
        np.testing.assert_allclose(comb.sum(axis=1), 1.0, atol=1e-3)  # columns (over dst) normalised last


def test_sinkhorn_wrong_variants_are_far_outside():
    s, shape, call = case("hc_split_sinkhorn", "7 tokens")
    d, tol = shape.dims, s.outputs["out"]
    scale, base = _hc_inputs(call, d["n_rows"])
    mix, want = arr(call, "mix"), call.expect["out"]
    one_more = ref.hc_split_sinkhorn_rows(mix, scale, base, 4, d["iters"] + 1, d["eps"])
    ok, m = within(one_more, want, tol)
    assert not ok and m["nmse"] > 100 * tol.nmse, m  # round 21 still moves the matrix
    t_mix = mix.copy()
    t_mix[:, 8:] = mix[:, 8:].reshape(-1, 4, 4).transpose(0, 2, 1).reshape(-1, 16)
    t_base = base.copy()
    t_base[8:] = base[8:].reshape(4, 4).T.reshape(16)
    assert far_outside(ref.hc_split_sinkhorn_rows(t_mix, scale, t_base, 4, d["iters"], d["eps"]), want, tol)
    s, shape, call = case("hc_split_sinkhorn", "eps 0.1")
    d = shape.dims
    scale, base = _hc_inputs(call, d["n_rows"])
    no_pre_eps = ref.hc_split_sinkhorn_rows(arr(call, "mix"), scale, base, 4, d["iters"], d["eps"])
    no_pre_eps[:, :4] -= F(0.1)
    assert far_outside(no_pre_eps, call.expect["out"], tol)


def test_hc_weighted_sums_scalar_and_token_weights():
    s, shape, call = case("hc_weighted_sum", "odd")
    d, tol = shape.dims, s.outputs["out"]
    x, w = arr(call, "residual_hc"), arr(call, "weights")
    want = np.array([[math.fsum(float(x[t, h, e]) * float(w[t, h]) for h in range(d["n_hc"]))
                      for e in range(d["n_embd"])] for t in range(d["n_tokens"])], F)
    assert within(call.expect["out"], want, tol)[0]
    token0 = np.einsum("thd,h->td", x.astype(np.float64), w[0].astype(np.float64))
    assert far_outside(token0, want, tol)

    s, shape, call = case("hc_weighted_sum_split", "odd")
    d, tol = shape.dims, s.outputs["out"]
    x, sp = arr(call, "residual_hc"), arr(call, "split")
    assert sp.shape[1] == 2 * d["n_hc"] + d["n_hc"] ** 2
    want = np.array([[math.fsum(float(x[t, h, e]) * float(sp[t, h]) for h in range(d["n_hc"]))
                      for e in range(d["n_embd"])] for t in range(d["n_tokens"])], F)
    assert within(call.expect["out"], want, tol)[0]
    compact = ref.hc_weighted_sum(x, sp.reshape(-1), d["n_embd"], d["n_hc"], d["n_tokens"])
    assert far_outside(compact, want, tol)


def test_split_weighted_sum_and_norm_compose_ds4c_steps():
    s, shape, call = case("hc_split_weighted_sum", "odd: 5 tokens")
    d = shape.dims
    scale, base = _hc_inputs(call, d["n_rows"])
    mix, x = arr(call, "mix"), arr(call, "residual_hc")
    split = np.stack([sinkhorn_f32(r, scale, base, 4, d["iters"], 1e-6) for r in mix])
    out = np.einsum("thd,th->td", x.astype(np.float64), split[:, :4].astype(np.float64))
    assert within(call.expect["split"], split, s.outputs["split"])[0]
    assert within(call.expect["out"], out, s.outputs["out"])[0]
    with_post = np.einsum("thd,th->td", x.astype(np.float64), split[:, 4:8].astype(np.float64))
    assert far_outside(with_post, out, s.outputs["out"])

    s, shape, call = case("hc_split_weighted_sum_norm", "norm_eps 0.5")
    d = shape.dims
    scale, base = _hc_inputs(call, 1)
    m = call.args["model_map"].array
    w = m[call.args["norm_weight_offset"]:][:4 * d["n_embd"]].view("<f4")
    split = sinkhorn_f32(arr(call, "mix")[0], scale, base, 4, d["iters"], 1e-6)
    out = np.einsum("hd,h->d", arr(call, "residual_hc")[0].astype(np.float64), split[:4].astype(np.float64))
    norm = rms_norm_scalar(out.astype(F), d["norm_eps"], w)
    assert within(call.expect["norm_out"][0], norm, s.outputs["norm_out"])[0]
    assert far_outside(rms_norm_scalar(out.astype(F), 1e-6, w), norm, s.outputs["norm_out"])  # eps swapped
    assert far_outside(rms_norm_scalar(out.astype(F), d["norm_eps"]), norm, s.outputs["norm_out"])  # weight


@pytest.mark.parametrize("label", ["odd: 5 tokens", "decode"])
def test_output_hc_weights_two_branch_sigmoid(label):
    s, shape, call = case("output_hc_weights", label)
    d, tol = shape.dims, s.outputs["out"]
    m = call.args["model_map"].array
    sc = float(m[call.args["scale_offset"]:][:4].view("<f4")[0])
    base = m[call.args["base_offset"]:][:4 * d["n_hc"]].view("<f4")
    pre = arr(call, "pre")
    want = np.array([[sigmoid_stable(float(F(F(p) * F(sc) + F(base[h])))) + float(F(d["eps"]))
                      for h, p in enumerate(row)] for row in pre], F)
    assert within(call.expect["out"], want, tol)[0]
    no_scale = np.array([[sigmoid_stable(float(p) + float(base[h])) + d["eps"] for h, p in enumerate(row)]
                         for row in pre])
    assert far_outside(no_scale, want, tol)


def test_output_hc_weights_eps_case_rejects_no_eps():
    s, shape, call = case("output_hc_weights", "eps 0.25")
    assert far_outside(call.expect["out"] - F(0.25), call.expect["out"], s.outputs["out"])


@pytest.mark.parametrize("unit", ["hc_expand", "hc_expand_split", "hc_expand_add_split"])
def test_hc_expand_matches_hc_post_one(unit):
    s, shape, call = case(unit, "odd: 5 tokens")
    d, tol = shape.dims, s.outputs["out_hc"]
    n, e = d["n_hc"], d["n_embd"]
    block, res = arr(call, "block_out"), arr(call, "residual_hc")
    if unit == "hc_expand":
        post, comb = arr(call, "post"), arr(call, "comb")
    else:
        sp = arr(call, "split")
        post, comb = sp[:, n:2 * n], sp[:, 2 * n:]
    add = arr(call, "block_add") if "block_add" in call.args else np.zeros_like(block)
    blk = (block.astype(np.float64) + add).astype(np.float64)
    want = np.stack([hc_post_scalar(blk[t], res[t], post[t], comb[t], e, n) for t in range(d["n_tokens"])])
    assert within(call.expect["out_hc"], want, tol)[0]
    transposed = np.stack([hc_post_scalar(blk[t], res[t], post[t], comb[t].reshape(n, n).T.reshape(-1), e, n)
                           for t in range(d["n_tokens"])])
    assert far_outside(transposed, want, tol)
    if unit == "hc_expand_add_split":
        no_add = np.stack([hc_post_scalar(block[t], res[t], post[t], comb[t], e, n) for t in range(d["n_tokens"])])
        assert far_outside(no_add, want, tol)
        after_gate = no_add + add[:, None, :]
        assert far_outside(after_gate, want, tol)


# ---------------------------------------------------------------------------
# router
# ---------------------------------------------------------------------------

def _softplus(x):
    if x > 20:
        return x
    if x < -20:
        return math.exp(x)
    return math.log1p(math.exp(x))


def _route_scalar(logits, bias, table, tok, hash_mode):
    probs = [float(F(math.sqrt(float(F(_softplus(float(z))))))) for z in logits]
    score = [float(F(F(p) + F(b))) for p, b in zip(probs, bias)] if bias is not None else probs
    if hash_mode:
        sel = [int(v) for v in table[tok]]
    else:  # repeated argmax; the first (lowest) index among equal maxima
        left, sel = list(range(256)), []
        for _ in range(6):
            best = max(left, key=lambda i: (score[i], -i))
            sel.append(best)
            left.remove(best)
    total = max(sum(probs[e] for e in sel), 6.103515625e-5)
    return sel, [probs[e] / total * 1.5 for e in sel], probs


@pytest.mark.parametrize("label", ["decode", "unbiased", "hash routing: 129280", "hash routing, has_bias",
                                   "ties: logits of 6", "ties: logits of 5"])
def test_router_select_repeated_argmax(label):
    s, shape, call = case("router_select", label)
    d = shape.dims
    m = call.args["model_map"].array
    bias = m[call.args["bias_offset"]:][:1024].view("<f4") if d["has_bias"] and not d["hash_mode"] else None
    table = m[call.args["hash_offset"]:][:call.args["hash_rows"] * 24].view("<i4").reshape(-1, 6)
    sel, w, probs = _route_scalar(arr(call, "logits"), bias, table, call.args["token"], d["hash_mode"])
    assert call.expect["selected"].tolist() == sel
    assert within(call.expect["weights"], np.array(w), s.outputs["weights"])[0]
    assert within(call.expect["probs"], np.array(probs), s.outputs["probs"])[0]
    assert abs(float(np.sum(call.expect["weights"])) - 1.5) < 1e-5


def test_router_ties_and_bias_faults_are_caught():
    s, shape, call = case("router_select", "ties: logits of 6")
    keys = call.keys["selected"]
    want = call.expect["selected"]
    top = keys[want[0]]
    tied = np.flatnonzero(keys == top)
    assert tied.size > 6  # more equal scores than slots: the tie rule decides
    higher_first = tied[::-1][:6].astype(np.int32)
    res = compare_exact(higher_first, want, keys)
    assert not res.ok and res.tie_only
    s, shape, call = case("router_select", "decode")
    keys, probs = call.keys["selected"], call.expect["probs"]
    sel = call.expect["selected"]
    assert not np.array_equal(np.argsort(-probs, kind="stable")[:6], sel)  # the bias changes the choice
    biased = keys[sel].astype(np.float64)
    biased = biased / biased.sum() * 1.5
    assert far_outside(biased, call.expect["weights"], s.outputs["weights"])


def test_router_batch_rows_and_hash_scale():
    s, shape, call = case("router_select_batch", "hash routing: 7 tokens")
    m = call.args["model_map"].array
    table = m[call.args["hash_offset"]:][:call.args["hash_rows"] * 24].view("<i4").reshape(-1, 6)
    toks, lg = arr(call, "tokens"), arr(call, "logits")
    assert toks[0] == call.args["hash_rows"] - 1
    for t in range(len(toks)):
        sel, w, _ = _route_scalar(lg[t], None, table, int(toks[t]), True)
        assert call.expect["selected"][t].tolist() == sel
        assert within(call.expect["weights"][t], np.array(w), s.outputs["weights"])[0]
    assert far_outside(call.expect["weights"] / 1.5, call.expect["weights"], s.outputs["weights"])


# ---------------------------------------------------------------------------
# steering
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("label", ["odd: 3 rows", "odd: 2 rows", "width 1"])
def test_steering_scalar_and_faults(label):
    s, shape, call = case("directional_steering_project", label)
    d, tol = shape.dims, s.outputs["x"]
    x, dirs = arr(call, "x"), arr(call, "directions")
    dr = dirs[d["layer"]]
    want = np.array([[float(v) - float(F(d["scale"])) * math.fsum(float(a) * float(b) for a, b in zip(row, dr))
                      * float(di) for v, di in zip(row, dr)] for row in x], F)
    assert within(call.expect["x"], want, tol)[0]
    if d["width"] > 1:
        layer0 = ref.directional_steering_project(x, dirs, 0, d["width"], d["rows"], d["scale"])
        assert far_outside(layer0, want, tol)
    no_scale = ref.directional_steering_project(x, dirs, d["layer"], d["width"], d["rows"], 1.0)
    assert far_outside(no_scale, want, tol)
    assert far_outside(x, want, tol)  # the projection changes the rows by O(1)
