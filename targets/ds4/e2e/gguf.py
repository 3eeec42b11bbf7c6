"""A synthetic DeepSeek V4 Flash GGUF with ds4's real widths, names and types, for N layers.

ds4 accepts exactly one model shape (the DS4_* constants of ds4.c) and checks
every tensor's type and dimensions (weights_validate_layout) and the model's
metadata (config_validate_model).  Built with DS4_N_LAYER = N (porter's
scratch build), it accepts this file: the real tensor set of layers 0..N-1 at
full width, filled with random VALID blocks (finite block scales, every code in
range), plus a tokenizer table holding the special tokens ds4 looks up.

Layer kinds follow ds4_layer_compress_ratio: layers 0-1 dense attention (ratio
0), then even layers ratio 4 with the indexer, odd layers ratio 128; layers
0-2 route by token hash (ffn_gate_tid2eid).  So 5 layers reach every kind.

Sizes: ~5.5 GB for 2 layers, ~11.5 GB for 5 (the routed experts dominate).
Never committed; written under the run's scratch folder on the GPU machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

# ds4.c's fixed shape (its enum of DS4_* constants) and the floats it checks.
DS4_DIMS = {
    "N_EMBD": 4096, "N_VOCAB": 129280, "N_HEAD": 64, "N_HEAD_KV": 1, "N_HEAD_DIM": 512, "N_VALUE_DIM": 512,
    "N_ROT": 64, "N_OUT_GROUP": 8, "N_LORA_Q": 1024, "N_LORA_O": 1024, "N_EXPERT": 256, "N_EXPERT_USED": 6,
    "N_EXPERT_SHARED": 1, "N_FF_EXP": 2048, "N_HASH_LAYER": 3, "N_SWA": 128, "N_INDEXER_HEAD": 64,
    "N_INDEXER_HEAD_DIM": 128, "N_INDEXER_TOP_K": 512, "N_HC": 4, "N_HC_SINKHORN_ITER": 20,
}
DS4_FLOATS = {
    "rope.freq_base": 10000.0, "rope.scaling.factor": 16.0, "rope.scaling.yarn_beta_fast": 32.0,
    "rope.scaling.yarn_beta_slow": 1.0, "attention.compress_rope_freq_base": 160000.0,
    "expert_weights_scale": 1.5, "attention.layer_norm_rms_epsilon": 1.0e-6, "hyper_connection.epsilon": 1.0e-6,
}
ROPE_ORIG_CTX = 65536
SWIGLU_CLAMP_EXP = 10.0
SPECIAL_TOKENS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                  "<think>", "</think>", "｜DSML｜"]


def compress_ratio(il: int) -> int:
    """ds4_layer_compress_ratio: 0 for layers 0-1, then 4 (even) / 128 (odd)."""
    if il < 2:
        return 0
    return 4 if il % 2 == 0 else 128


@dataclass(frozen=True)
class TensorSpec:
    name: str
    type: str  # GGML type name: F32, F16, Q8_0, IQ2_XXS, Q2_K, I32
    ne: tuple[int, ...]  # GGUF order: ne[0] is the contiguous dimension (ds4's dim[0])


def tensor_specs(n_layer: int, d: dict = DS4_DIMS, expert_types: tuple[str, str] = ("IQ2_XXS", "Q2_K")) -> list[TensorSpec]:
    E, V, HC = d["N_EMBD"], d["N_VOCAB"], d["N_HC"]
    hc_dim, hc_mix = E * HC, 2 * HC + HC * HC
    q_dim = d["N_HEAD"] * d["N_HEAD_DIM"]
    out_low = d["N_OUT_GROUP"] * d["N_LORA_O"]
    gate_up, down = expert_types
    out = [TensorSpec("token_embd.weight", "F16", (E, V)),
           TensorSpec("output_hc_base.weight", "F32", (HC,)),
           TensorSpec("output_hc_fn.weight", "F16", (hc_dim, HC)),
           TensorSpec("output_hc_scale.weight", "F32", (1,)),
           TensorSpec("output_norm.weight", "F32", (E,)),
           TensorSpec("output.weight", "Q8_0", (E, V))]
    for il in range(n_layer):
        b = f"blk.{il}."
        r = compress_ratio(il)
        out += [TensorSpec(b + "hc_attn_fn.weight", "F16", (hc_dim, hc_mix)),
                TensorSpec(b + "hc_attn_scale.weight", "F32", (3,)),
                TensorSpec(b + "hc_attn_base.weight", "F32", (hc_mix,)),
                TensorSpec(b + "attn_norm.weight", "F32", (E,)),
                TensorSpec(b + "attn_q_a.weight", "Q8_0", (E, d["N_LORA_Q"])),
                TensorSpec(b + "attn_q_a_norm.weight", "F32", (d["N_LORA_Q"],)),
                TensorSpec(b + "attn_q_b.weight", "Q8_0", (d["N_LORA_Q"], q_dim)),
                TensorSpec(b + "attn_kv.weight", "Q8_0", (E, d["N_HEAD_DIM"])),
                TensorSpec(b + "attn_kv_a_norm.weight", "F32", (d["N_HEAD_DIM"],)),
                TensorSpec(b + "attn_sinks.weight", "F32", (d["N_HEAD"],)),
                TensorSpec(b + "attn_output_a.weight", "Q8_0",
                           (d["N_HEAD_DIM"] * (d["N_HEAD"] // d["N_OUT_GROUP"]), out_low)),
                TensorSpec(b + "attn_output_b.weight", "Q8_0", (out_low, E))]
        if r:
            cw = (2 if r == 4 else 1) * d["N_HEAD_DIM"]
            out += [TensorSpec(b + "attn_compressor_ape.weight", "F16", (cw, r)),
                    TensorSpec(b + "attn_compressor_kv.weight", "F16", (E, cw)),
                    TensorSpec(b + "attn_compressor_gate.weight", "F16", (E, cw)),
                    TensorSpec(b + "attn_compressor_norm.weight", "F32", (d["N_HEAD_DIM"],))]
        if r == 4:
            iw = 2 * d["N_INDEXER_HEAD_DIM"]
            out += [TensorSpec(b + "indexer.attn_q_b.weight", "F16",
                               (d["N_LORA_Q"], d["N_INDEXER_HEAD"] * d["N_INDEXER_HEAD_DIM"])),
                    TensorSpec(b + "indexer.proj.weight", "F16", (E, d["N_INDEXER_HEAD"])),
                    TensorSpec(b + "indexer_compressor_ape.weight", "F16", (iw, r)),
                    TensorSpec(b + "indexer_compressor_kv.weight", "F16", (E, iw)),
                    TensorSpec(b + "indexer_compressor_gate.weight", "F16", (E, iw)),
                    TensorSpec(b + "indexer_compressor_norm.weight", "F32", (d["N_INDEXER_HEAD_DIM"],))]
        out += [TensorSpec(b + "hc_ffn_fn.weight", "F16", (hc_dim, hc_mix)),
                TensorSpec(b + "hc_ffn_scale.weight", "F32", (3,)),
                TensorSpec(b + "hc_ffn_base.weight", "F32", (hc_mix,)),
                TensorSpec(b + "ffn_norm.weight", "F32", (E,)),
                TensorSpec(b + "ffn_gate_inp.weight", "F16", (E, d["N_EXPERT"])),
                TensorSpec(b + "exp_probs_b.bias", "F32", (d["N_EXPERT"],)),
                TensorSpec(b + "ffn_gate_exps.weight", gate_up, (E, d["N_FF_EXP"], d["N_EXPERT"])),
                TensorSpec(b + "ffn_up_exps.weight", gate_up, (E, d["N_FF_EXP"], d["N_EXPERT"])),
                TensorSpec(b + "ffn_down_exps.weight", down, (d["N_FF_EXP"], E, d["N_EXPERT"])),
                TensorSpec(b + "ffn_gate_shexp.weight", "Q8_0", (E, d["N_FF_EXP"])),
                TensorSpec(b + "ffn_up_shexp.weight", "Q8_0", (E, d["N_FF_EXP"])),
                TensorSpec(b + "ffn_down_shexp.weight", "Q8_0", (d["N_FF_EXP"], E))]
        if il < d["N_HASH_LAYER"]:
            out.append(TensorSpec(b + "ffn_gate_tid2eid.weight", "I32", (d["N_EXPERT_USED"], V)))
    return out


def metadata(n_layer: int, d: dict = DS4_DIMS) -> dict[str, tuple[str, object]]:
    """key -> (gguf kind, value) for every key config_validate_model reads."""
    p = "deepseek4."
    u32 = {"block_count": n_layer, "embedding_length": d["N_EMBD"], "vocab_size": d["N_VOCAB"],
           "attention.head_count": d["N_HEAD"], "attention.head_count_kv": d["N_HEAD_KV"],
           "attention.key_length": d["N_HEAD_DIM"], "attention.value_length": d["N_VALUE_DIM"],
           "rope.dimension_count": d["N_ROT"], "attention.q_lora_rank": d["N_LORA_Q"],
           "attention.output_lora_rank": d["N_LORA_O"], "attention.output_group_count": d["N_OUT_GROUP"],
           "expert_count": d["N_EXPERT"], "expert_used_count": d["N_EXPERT_USED"],
           "expert_feed_forward_length": d["N_FF_EXP"], "expert_shared_count": d["N_EXPERT_SHARED"],
           "hash_layer_count": d["N_HASH_LAYER"], "expert_group_count": 0, "expert_group_used_count": 0,
           "attention.sliding_window": d["N_SWA"], "attention.indexer.head_count": d["N_INDEXER_HEAD"],
           "attention.indexer.key_length": d["N_INDEXER_HEAD_DIM"], "attention.indexer.top_k": d["N_INDEXER_TOP_K"],
           "hyper_connection.count": d["N_HC"], "hyper_connection.sinkhorn_iterations": d["N_HC_SINKHORN_ITER"]}
    out: dict[str, tuple[str, object]] = {p + k: ("u32", v) for k, v in u32.items()}
    out[p + "context_length"] = ("u64", 1048576)
    out[p + "rope.scaling.original_context_length"] = ("u64", ROPE_ORIG_CTX)
    out.update({p + k: ("f32", v) for k, v in DS4_FLOATS.items()})
    out[p + "expert_weights_norm"] = ("bool", True)
    out[p + "attention.compress_ratios"] = ("u32[]", [compress_ratio(i) for i in range(n_layer)])
    out[p + "swiglu_clamp_exp"] = ("f32[]", [SWIGLU_CLAMP_EXP] * n_layer)
    return out


def byte_level_chars() -> list[str]:
    """The 256 one-byte tokens of a byte-level BPE vocabulary (GPT-2's byte -> printable char map)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def vocabulary(n_vocab: int) -> list[str]:
    """n_vocab distinct token strings: the 256 byte tokens first (any text encodes, one token per
    byte when no merge applies), filler tokens, and ds4's special tokens last."""
    head = byte_level_chars()
    plain = [f"<t{i}>" for i in range(n_vocab - len(head) - len(SPECIAL_TOKENS))]
    return head + plain + SPECIAL_TOKENS


def _scale(name: str, fan_in: int) -> tuple[float, float]:
    """(mean, std) of a tensor's values: norms near 1, biases and mixes small, matrices 1/sqrt(fan_in)."""
    if "norm" in name or name.endswith("_scale.weight"):
        return 1.0, 0.1
    if name.endswith("_base.weight") or name.endswith(".bias") or "_ape." in name:
        return 0.0, 0.1
    if name.endswith("attn_sinks.weight") or name == "token_embd.weight":
        return 0.0, 1.0
    return 0.0, 1.0 / np.sqrt(fan_in)


POOL_BLOCKS = 1 << 16


def pooled_blocks(qtype: str, n_rows: int, n_cols: int, scale: float, rng: np.random.Generator,
                  pools: dict) -> np.ndarray:
    """(n_rows, row_bytes) of valid blocks drawn from a pool of POOL_BLOCKS random valid blocks.

    Writing 11 GB of freshly randomised blocks takes minutes in numpy; gathering from a pool of
    65,536 distinct valid blocks (per type and scale) takes seconds, and every block is still a
    valid one with its own scale and codes.  Rows repeat blocks in random order, never whole rows."""
    from reference import quant as rq

    key = (qtype, round(float(scale), 12))
    pool = pools.get(key)
    if pool is None:
        bs = rq.block_elems(qtype)
        pool = rq.random_blocks(qtype, POOL_BLOCKS, bs, rng, scale=scale)  # one block per pool row
        pools[key] = pool
    blocks_per_row = n_cols // rq.block_elems(qtype)
    idx = rng.integers(0, POOL_BLOCKS, size=n_rows * blocks_per_row, dtype=np.int32)
    return pool[idx].reshape(n_rows, blocks_per_row * pool.shape[1])


def tensor_data(spec: TensorSpec, rng: np.random.Generator, pools: dict | None = None) -> np.ndarray:
    """The tensor's contents: float arrays for F32/F16/I32, raw valid blocks (uint8 rows) for quant types."""
    from reference import quant as rq

    shape = tuple(reversed(spec.ne))  # row-major, outermost first
    mean, std = _scale(spec.name, spec.ne[0])
    if spec.type == "I32":  # token -> expert ids: distinct ids per token (43 is odd, so k*43 mod 256 differ)
        n_used, n_vocab = spec.ne
        t = np.arange(n_vocab, dtype=np.int64)[:, None]
        k = np.arange(n_used, dtype=np.int64)[None, :]
        return ((t * 7 + k * 43) % 256).astype(np.int32)
    if spec.type in ("F32", "F16"):
        vals = rng.standard_normal(shape, dtype=np.float32)
        vals *= np.float32(std)
        vals += np.float32(mean)
        return vals if spec.type == "F32" else vals.astype(np.float16)
    n_rows = int(np.prod(shape[:-1]))
    if pools is None:
        raw = rq.random_blocks(spec.type, n_rows, spec.ne[0], rng, scale=std)
    else:
        raw = pooled_blocks(spec.type, n_rows, spec.ne[0], std, rng, pools)
    return raw.reshape(*shape[:-1], raw.shape[-1])


def write_gguf(path: Path, n_layer: int, *, seed: int = 0, d: dict = DS4_DIMS, log=None,
               zero_weights: bool = False) -> Path:
    """Write the synthetic model, one tensor in memory at a time.

    zero_weights: write only the header and tensor table and extend the file to its full size
    without data (a sparse file of zero weights, every block valid with scale 0).  For a smoke
    run of ds4's loader and the accessor on a machine that cannot hold the real data."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "deepseek4")
    for key, (kind, value) in metadata(n_layer, d).items():
        {"u32": w.add_uint32, "u64": w.add_uint64, "f32": w.add_float32, "bool": w.add_bool}.get(
            kind, lambda k, v: None)(key, value)
        if kind == "u32[]":
            w.add_array(key, [int(x) for x in value])  # gguf-py writes ints as INT32: ds4 accepts int32/uint32
        elif kind == "f32[]":
            w.add_array(key, [float(x) for x in value])
    w.add_array("tokenizer.ggml.tokens", vocabulary(d["N_VOCAB"]))
    # one merge of two filler tokens: a merge table must exist, and no prompt text ever forms it
    w.add_array("tokenizer.ggml.merges", ["<t0> <t1>"])
    specs = tensor_specs(n_layer, d)
    qt = gguf.GGMLQuantizationType
    for s in specs:
        dtype = {"F32": np.float32, "F16": np.float16, "I32": np.int32}.get(s.type, np.uint8)
        nbytes = _nbytes(s)
        shape = tuple(reversed(s.ne))
        if dtype is np.uint8:
            bs, ts = gguf.GGML_QUANT_SIZES[qt[s.type]]
            shape = (*shape[:-1], shape[-1] // bs * ts)
        w.add_tensor_info(s.name, shape, np.dtype(dtype), nbytes, raw_dtype=qt[s.type])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    if zero_weights:
        f = w.fout[0]
        f.flush()
        start = -(-f.tell() // w.data_alignment) * w.data_alignment
        f.truncate(start + sum(-(-_nbytes(s) // w.data_alignment) * w.data_alignment for s in specs))
        f.close()
        return path
    pools: dict = {}
    for s in specs:
        arr = tensor_data(s, rng, pools)
        w.write_tensor_data(arr)
        if log:
            log(f"{s.name} {s.type} {list(s.ne)}")
    w.close()
    return path


def _nbytes(s: TensorSpec) -> int:
    import gguf

    bs, ts = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[s.type]]
    n = int(np.prod(s.ne))
    return n // bs * ts


def total_bytes(n_layer: int, d: dict = DS4_DIMS) -> int:
    return sum(_nbytes(s) for s in tensor_specs(n_layer, d))
