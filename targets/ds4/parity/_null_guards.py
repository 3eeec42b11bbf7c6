"""NULL tensors upstream refuses before it reads anything: one error case per such tensor, per op.

Each op below opens (after `(void)x;` casts) with one `if (...) return 0;` (or `{ return 0; }`), whose top-level `||` terms
include `!p` for every tensor p listed (named as the header names the parameter at that position): passed NULL, upstream returns 0 having touched nothing.  A port
that drops that check dereferences NULL (a crash) or returns success; the op's spec never passed NULL
before, so neither was seen (minimoe's mutation table: dropped guards were 19 of its 30 survivors).
tests/test_ds4_null_guards.py reads each op's first statement in the checkout and holds this table to it,
both ways: every name here is guarded there, and every tensor guarded there is named here.

An op whose whole body is `return launcher(a, b, ...);` with its own parameters as the arguments is
read through the launcher: the launcher's first statement is then the first thing run (the indexer
scores, the Q8_0 matmul, routed MoE for one token).  Not listed: ops that open with another statement
(an environment switch between fused and unfused kernels), a guard this reading cannot parse, or a
definition whose parameters do not line up with the header's (routed MoE's batch call): no case is made
from them here.

The case is the op's first untimed ok case with that one tensor NULL (ds4's contract: 0 is failure).
"""
from __future__ import annotations

import dataclasses

from porter.spec import Call, In, InOut, Null, Out, Same, Shape, SpecError, UnitSpec

NULL_GUARDED: dict[str, tuple[str, ...]] = {
    "ds4_gpu_add_tensor": ("out", "a", "b"),
    "ds4_gpu_attention_decode_heads_tensor": ("heads", "q", "raw_kv"),
    "ds4_gpu_attention_decode_mixed_batch_heads_tensor": ("heads", "q", "raw_kv"),
    "ds4_gpu_attention_decode_raw_batch_heads_tensor": ("heads", "q", "raw_kv"),
    "ds4_gpu_attention_indexed_mixed_batch_heads_tensor": ("heads", "q", "raw_kv", "comp_kv", "topk"),
    "ds4_gpu_attention_output_low_q8_tensor": ("low", "heads"),
    "ds4_gpu_attention_output_q8_batch_tensor": ("out", "low", "heads"),
    "ds4_gpu_attention_prefill_masked_mixed_heads_tensor": ("heads", "q", "raw_kv"),
    "ds4_gpu_attention_prefill_raw_heads_tensor": ("heads", "q", "raw_kv"),
    "ds4_gpu_attention_prefill_static_mixed_heads_tensor": ("heads", "q", "raw_kv"),
    "ds4_gpu_compressor_prefill_ratio4_replay_tensor": ("comp_cache", "state_kv", "state_score", "kv", "sc"),
    "ds4_gpu_compressor_prefill_state_ratio4_tensor": ("state_kv", "state_score", "kv_tail", "sc_tail"),
    "ds4_gpu_compressor_prefill_tensor": ("comp_cache", "state_kv", "state_score", "kv", "sc"),
    "ds4_gpu_compressor_store_batch_tensor": ("kv", "sc", "state_kv", "state_score"),
    "ds4_gpu_compressor_update_tensor": ("kv_cur", "sc_cur", "state_kv", "state_score", "comp_cache"),
    "ds4_gpu_directional_steering_project_tensor": ("x", "directions"),
    "ds4_gpu_dsv4_fp8_kv_quantize_tensor": ("x",),
    "ds4_gpu_dsv4_indexer_qat_tensor": ("x",),
    "ds4_gpu_dsv4_topk_mask_tensor": ("mask", "topk"),
    "ds4_gpu_embed_token_hc_tensor": ("out_hc",),
    "ds4_gpu_embed_tokens_hc_tensor": ("out_hc", "tokens"),
    "ds4_gpu_hc_expand_add_split_tensor": ("out_hc", "block_out", "block_add", "residual_hc", "split"),
    "ds4_gpu_hc_expand_split_tensor": ("out_hc", "block_out", "residual_hc", "split"),
    "ds4_gpu_hc_expand_tensor": ("out_hc", "block_out", "residual_hc", "post", "comb"),
    "ds4_gpu_hc_split_sinkhorn_tensor": ("out", "mix"),
    "ds4_gpu_hc_split_weighted_sum_tensor": ("out", "split", "mix", "residual_hc"),
    "ds4_gpu_hc_weighted_sum_split_tensor": ("out", "residual_hc", "split"),
    "ds4_gpu_hc_weighted_sum_tensor": ("out", "residual_hc", "weights"),
    "ds4_gpu_head_rms_norm_tensor": ("x",),
    "ds4_gpu_indexer_score_one_tensor": ("scores", "q", "weights", "index_comp"),
    "ds4_gpu_indexer_scores_decode_batch_tensor": ("scores", "q", "weights", "index_comp"),
    "ds4_gpu_indexer_scores_prefill_tensor": ("scores", "q", "weights", "index_comp"),
    "ds4_gpu_indexer_topk_tensor": ("selected", "scores"),
    "ds4_gpu_matmul_f16_pair_tensor": ("out_a", "out_b", "x"),
    "ds4_gpu_matmul_f16_tensor": ("out", "x"),
    "ds4_gpu_matmul_f32_tensor": ("out", "x"),
    "ds4_gpu_matmul_q8_0_tensor": ("out", "x"),
    "ds4_gpu_output_hc_weights_tensor": ("out", "pre"),
    "ds4_gpu_repeat_hc_tensor": ("out", "row"),
    "ds4_gpu_rms_norm_plain_rows_tensor": ("out", "x"),
    "ds4_gpu_rms_norm_plain_tensor": ("out", "x"),
    "ds4_gpu_rms_norm_weight_rows_tensor": ("out", "x"),
    "ds4_gpu_rms_norm_weight_tensor": ("out", "x"),
    "ds4_gpu_rope_tail_tensor": ("x",),
    "ds4_gpu_routed_moe_one_tensor": ("out", "gate", "up", "mid", "experts", "selected", "weights", "x"),
    "ds4_gpu_router_select_batch_tensor": ("selected", "weights", "probs", "logits", "tokens"),
    "ds4_gpu_router_select_tensor": ("selected", "weights", "probs", "logits"),
    "ds4_gpu_store_raw_kv_batch_tensor": ("raw_cache", "kv"),
    "ds4_gpu_store_raw_kv_tensor": ("raw_cache", "kv"),
    "ds4_gpu_swiglu_tensor": ("out", "gate", "up"),
}

KEY = "null_tensor"


def base_shape(spec: UnitSpec) -> Shape:
    """The first ok case the spec does not time: real inputs, not a production-size one."""
    for s in spec.shapes:
        if s.expect == "ok" and not s.timed:
            return s
    raise SpecError(f"{spec.unit}: no untimed ok case to make the NULL-tensor cases from")


def with_null_tensors(spec: UnitSpec) -> UnitSpec:
    """`spec` with one expect="error" case per tensor NULL_GUARDED names for its unit: the base case's
    arguments with that tensor NULL.  The base is built as an error case (no reference is computed)."""
    tensors = NULL_GUARDED.get(spec.unit, ())
    if not tensors:
        return spec
    base = base_shape(spec)
    shapes = [Shape(f"error: {p} is NULL ({base.label})", dict(base.dims, **{KEY: p}), source=base.source,
                    expect="error", why=f"upstream's first check returns 0 for a NULL {p}")
              for p in tensors]
    build = spec.build

    def build_with_null(shape, ctx, rng):
        p = shape.dims.get(KEY)
        if p is None:
            return build(shape, ctx, rng)
        args = dict(build(shape, ctx, rng).args)
        if not isinstance(args.get(p), (In, InOut, Out)):
            raise SpecError(f"shape {shape.label!r}: {p} is {type(args.get(p)).__name__}, not a tensor of its own")
        if any(isinstance(b, Same) and b.param == p for b in args.values()):
            raise SpecError(f"shape {shape.label!r}: another parameter aliases {p}")
        args[p] = Null()
        return Call(args=args)

    return dataclasses.replace(spec, shapes=list(spec.shapes) + shapes, build=build_with_null)
