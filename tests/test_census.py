"""GGUF census: tensor types from the header only, the quant variants each unit needs, flags.

The ds4-layout files are written here with gguf.GGUFWriter from the tensor
names, types and dims ds4.c binds and validates (weights_bind /
weights_validate_layout): header only, no tensor data at all, which is also
the proof that the census never reads tensor data.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest

from conftest import NO_DS4

from porter.errors import PorterError
from porter.target.scan.census import census, load_rules, quant_types_in, read_header

REPO = Path(__file__).resolve().parents[1]
DS4 = Path(os.environ.get("PORTER_DS4_SOURCE") or REPO / "external" / "ds4")
DS4_TARGET = SimpleNamespace(name="ds4", dir=REPO / "targets" / "ds4")

# ds4.c's fixed shape (enum at the top of ds4.c)
N_LAYER, N_EMBD, N_VOCAB, N_HEAD, HEAD_DIM = 43, 4096, 129280, 64, 512
N_OUT_GROUP, N_LORA_Q, N_LORA_O, N_EXPERT, N_EXPERT_USED, N_FF_EXP = 8, 1024, 1024, 256, 6, 2048
N_HASH_LAYER, N_INDEXER_HEAD, N_INDEXER_HEAD_DIM, N_HC = 3, 64, 128, 4
HC_DIM, HC_MIX = N_EMBD * N_HC, 2 * N_HC + N_HC * N_HC


def ds4_tensors() -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, GGML type, ne in GGUF order) as ds4.c expects them, routed experts IQ2_XXS gate/up + Q2_K down."""
    t = [("token_embd.weight", "F16", (N_EMBD, N_VOCAB)),
         ("output_hc_base.weight", "F32", (N_HC,)),
         ("output_hc_fn.weight", "F16", (HC_DIM, N_HC)),
         ("output_hc_scale.weight", "F32", (1,)),
         ("output_norm.weight", "F32", (N_EMBD,)),
         ("output.weight", "Q8_0", (N_EMBD, N_VOCAB))]
    for il in range(N_LAYER):
        b = f"blk.{il}."
        ratio = 0 if il < 2 else (4 if il % 2 == 0 else 128)
        t += [(b + "hc_attn_fn.weight", "F16", (HC_DIM, HC_MIX)), (b + "hc_attn_scale.weight", "F32", (3,)),
              (b + "hc_attn_base.weight", "F32", (HC_MIX,)), (b + "attn_norm.weight", "F32", (N_EMBD,)),
              (b + "attn_q_a.weight", "Q8_0", (N_EMBD, N_LORA_Q)), (b + "attn_q_a_norm.weight", "F32", (N_LORA_Q,)),
              (b + "attn_q_b.weight", "Q8_0", (N_LORA_Q, N_HEAD * HEAD_DIM)),
              (b + "attn_kv.weight", "Q8_0", (N_EMBD, HEAD_DIM)), (b + "attn_kv_a_norm.weight", "F32", (HEAD_DIM,)),
              (b + "attn_sinks.weight", "F32", (N_HEAD,)),
              (b + "attn_output_a.weight", "Q8_0", (HEAD_DIM * (N_HEAD // N_OUT_GROUP), N_OUT_GROUP * N_LORA_O)),
              (b + "attn_output_b.weight", "Q8_0", (N_OUT_GROUP * N_LORA_O, N_EMBD))]
        if ratio:
            w = (2 if ratio == 4 else 1) * HEAD_DIM
            t += [(b + "attn_compressor_ape.weight", "F16", (w, ratio)),
                  (b + "attn_compressor_kv.weight", "F16", (N_EMBD, w)),
                  (b + "attn_compressor_gate.weight", "F16", (N_EMBD, w)),
                  (b + "attn_compressor_norm.weight", "F32", (HEAD_DIM,))]
        if ratio == 4:
            iw = 2 * N_INDEXER_HEAD_DIM
            t += [(b + "indexer.attn_q_b.weight", "F16", (N_LORA_Q, N_INDEXER_HEAD * N_INDEXER_HEAD_DIM)),
                  (b + "indexer.proj.weight", "F16", (N_EMBD, N_INDEXER_HEAD)),
                  (b + "indexer_compressor_ape.weight", "F16", (iw, ratio)),
                  (b + "indexer_compressor_kv.weight", "F16", (N_EMBD, iw)),
                  (b + "indexer_compressor_gate.weight", "F16", (N_EMBD, iw)),
                  (b + "indexer_compressor_norm.weight", "F32", (N_INDEXER_HEAD_DIM,))]
        t += [(b + "hc_ffn_fn.weight", "F16", (HC_DIM, HC_MIX)), (b + "hc_ffn_scale.weight", "F32", (3,)),
              (b + "hc_ffn_base.weight", "F32", (HC_MIX,)), (b + "ffn_norm.weight", "F32", (N_EMBD,)),
              (b + "ffn_gate_inp.weight", "F16", (N_EMBD, N_EXPERT)),
              (b + "exp_probs_b.bias", "F32", (N_EXPERT,)),
              (b + "ffn_gate_exps.weight", "IQ2_XXS", (N_EMBD, N_FF_EXP, N_EXPERT)),
              (b + "ffn_up_exps.weight", "IQ2_XXS", (N_EMBD, N_FF_EXP, N_EXPERT)),
              (b + "ffn_down_exps.weight", "Q2_K", (N_FF_EXP, N_EMBD, N_EXPERT)),
              (b + "ffn_gate_shexp.weight", "Q8_0", (N_EMBD, N_FF_EXP)),
              (b + "ffn_up_shexp.weight", "Q8_0", (N_EMBD, N_FF_EXP)),
              (b + "ffn_down_shexp.weight", "Q8_0", (N_FF_EXP, N_EMBD))]
        if il < N_HASH_LAYER:
            t.append((b + "ffn_gate_tid2eid.weight", "I32", (N_EXPERT_USED, N_VOCAB)))
    return t


def write_header_only(path: Path, tensors, arch: str = "deepseek4", overrides: dict[str, str] | None = None) -> Path:
    """A GGUF with metadata and tensor infos but not one byte of tensor data."""
    w = gguf.GGUFWriter(str(path), arch)
    for name, typ, ne in tensors:
        for pat, new in (overrides or {}).items():
            if fnmatch.fnmatchcase(name, pat):
                typ = new
        qt = gguf.GGMLQuantizationType[typ]
        block, tsize = gguf.GGML_QUANT_SIZES[qt]
        shape = list(reversed(ne))  # numpy order
        n_bytes = int(np.prod(ne)) * tsize // block
        if block > 1:
            shape[-1] = shape[-1] // block * tsize  # the writer takes quantized shapes in bytes
            dtype = np.uint8
        else:
            dtype = {"F32": np.float32, "F16": np.float16, "I32": np.int32}[typ]
        w.add_tensor_info(name, tuple(shape), np.dtype(dtype), n_bytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def ds4_rules():
    rules, where = load_rules(DS4_TARGET)
    assert where.endswith("census.toml") and rules
    return rules


@pytest.fixture(scope="module")
def ds4_file(tmp_path_factory):
    return write_header_only(tmp_path_factory.mktemp("gguf") / "ds4-header.gguf", ds4_tensors())


def test_header_only_file_census_never_reads_tensor_data(ds4_file):
    size = ds4_file.stat().st_size
    arch, tensors, header_only = read_header(ds4_file)
    assert arch == "deepseek4"
    assert header_only  # every tensor's data lies past the end of this file...
    assert size < 1 << 20 and sum(t.n_bytes for t in tensors) > 50 * (1 << 30)  # ...80+ GB of weights it never had
    by = {t.name: t for t in tensors}
    assert by["blk.7.ffn_gate_exps.weight"].type == "IQ2_XXS"
    assert by["blk.7.ffn_gate_exps.weight"].ne == (N_EMBD, N_FF_EXP, N_EXPERT)
    assert by["blk.7.ffn_gate_exps.weight"].shape == (N_EXPERT, N_FF_EXP, N_EMBD)
    assert by["blk.7.ffn_down_exps.weight"].n_bytes == N_EXPERT * N_EMBD * (N_FF_EXP // 256) * 84


def test_ds4_census_needs_iq2_xxs_and_q2_k_experts(ds4_file, ds4_rules):
    c = census(ds4_file, ds4_rules)
    assert c.unmatched == [] and c.flags == []
    assert c.types == {"F16": 359, "F32": 495, "I32": 3, "IQ2_XXS": 86, "Q2_K": 43, "Q8_0": 345}
    for unit in ("ds4_gpu_routed_moe_batch_tensor", "ds4_gpu_routed_moe_one_tensor"):
        u = c.unit(unit)
        assert u.required == {"IQ2_XXS": 86, "Q2_K": 43}
        assert "Q8_0" not in u.required  # no Q8_0 expert path is needed for this file
        assert u.absent == ["Q4_K"]  # ds4 can read Q4_K experts; this file has none
    assert c.unit("ds4_gpu_matmul_q8_0_tensor").required == {"Q8_0": 43 * 6 + 1}
    # output_hc_fn + hc_{attn,ffn}_fn + ffn_gate_inp + compressor kv/gate (41 layers) + indexer compressor kv/gate
    # and indexer q_b/proj (21 ratio-4 layers)
    assert c.unit("ds4_gpu_matmul_f16_tensor").required == {"F16": 1 + 43 * 2 + 43 + 41 * 2 + 21 * 2 + 21 * 2}
    assert c.unit("ds4_gpu_attention_output_q8_batch_tensor").required == {"Q8_0": 43 * 2}
    assert c.unit("ds4_gpu_embed_tokens_hc_tensor").required == {"F16": 1}


def test_ds4_census_with_kernel_variants(ds4_file, ds4_rules):
    if not (DS4 / "ds4_gpu.h").is_file():
        pytest.skip(NO_DS4)
    from porter.target.scan import scan
    from porter.target import load_target

    s = scan(load_target(REPO, "ds4", DS4), cache=False)
    c = census(ds4_file, ds4_rules, {u: ad.kernels for u, ad in s.host.api.items()})
    moe = c.unit("ds4_gpu_routed_moe_batch_tensor")
    assert moe.required == {"IQ2_XXS": 86, "Q2_K": 43} and moe.absent == ["Q4_K"]
    # attention output is the unit with the Q8_0 mul_mm_id kernels; experts have none
    assert c.unit("ds4_gpu_attention_output_q8_batch_tensor").required == {"Q8_0": 86}


def test_small_projections_in_q8_0_are_flagged(tmp_path, ds4_rules):
    # an abliterated/requantised GGUF: ds4 reads these small projections as F16
    small = {"blk.*.attn_compressor_kv.weight": "Q8_0", "blk.*.attn_compressor_gate.weight": "Q8_0",
             "blk.*.indexer.proj.weight": "Q8_0"}
    f = write_header_only(tmp_path / "abliterated.gguf", ds4_tensors(), overrides=small)
    c = census(f, ds4_rules)
    flagged_tensors = {fl.tensor for fl in c.flags}
    assert "blk.2.attn_compressor_kv.weight" in flagged_tensors and "blk.4.indexer.proj.weight" in flagged_tensors
    assert len(c.flags) == 41 * 2 + 21
    flagged_units = {u for fl in c.flags for u in fl.units}
    assert flagged_units == {"ds4_gpu_matmul_f16_tensor", "ds4_gpu_matmul_f16_pair_tensor"}
    assert c.unit("ds4_gpu_matmul_f16_pair_tensor").flags == [
        "Q8_0 where F16 is expected (blk.*.attn_compressor_kv.weight | blk.*.attn_compressor_gate.weight | "
        "blk.*.indexer_compressor_kv.weight | blk.*.indexer_compressor_gate.weight)"]
    fl = next(x for x in c.flags if x.tensor == "blk.2.attn_compressor_kv.weight")
    assert fl.type == "Q8_0" and fl.expected == ("F16",) and "would refuse or misread it" in fl.message
    assert not c.unit("ds4_gpu_routed_moe_batch_tensor").flags
    # the Q8_0 matmul does not claim the flagged tensors
    assert c.unit("ds4_gpu_matmul_q8_0_tensor").required == {"Q8_0": 43 * 6 + 1}


def test_q8_0_experts_are_flagged_not_silently_needed(tmp_path, ds4_rules):
    f = write_header_only(tmp_path / "q8-experts.gguf", ds4_tensors(), overrides={"blk.*.ffn_*_exps.weight": "Q8_0"})
    c = census(f, ds4_rules)
    moe = c.unit("ds4_gpu_routed_moe_batch_tensor")
    assert moe.required == {} and moe.flags and {x.type for x in c.flags} == {"Q8_0"}
    assert len(c.flags) == 43 * 3


def test_quant_types_in_kernel_names():
    assert quant_types_in(["kernel_mul_mv_id_q2_K_f32", "kernel_mul_mm_id_iq2_xxs_f16", "kernel_cpy_f32_f16",
                           "kernel_mul_mv_q8_0_f32", "kernel_mul_mv_q4_k_f32_v0"]) == ["Q2_K", "IQ2_XXS", "Q8_0", "Q4_K"]


def test_not_a_gguf_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(PorterError, match=r"is not a GGUF file \(it starts with b.not "):
        read_header(bad)
    with pytest.raises(PorterError, match="does not exist"):
        read_header(tmp_path / "missing.gguf")


# ---------------------------------------------------------------- minimoe

def _fixture(tmp_path: Path) -> Path:
    script = REPO / "targets" / "minimoe" / "make_fixture.py"
    if not script.is_file():
        pytest.skip("targets/minimoe/make_fixture.py not written yet")
    spec = importlib.util.spec_from_file_location("minimoe_make_fixture", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return Path(mod.write_fixture(tmp_path / "minimoe.gguf"))


def test_minimoe_fixture_census_builtin_table(tmp_path):
    rules, where = load_rules(SimpleNamespace(name="minimoe", dir=REPO / "targets" / "minimoe"))
    path = _fixture(tmp_path)
    kernels = {"mini_gpu_matmul_q4_k_tensor": ["kernel_mul_mv_q4_k_f32"],
               "mini_gpu_matmul_q8_0_tensor": ["kernel_mul_mv_q8_0_f32"]}
    c = census(path, rules, kernels, where)
    assert c.architecture == "minimoe" and not c.header_only
    assert c.unmatched == [] and c.flags == []
    assert c.types == {"F16": 3, "F32": 7, "IQ2_XXS": 4, "Q2_K": 2, "Q8_0": 9}
    req = {u: x.required for u, x in c.units.items()}
    assert req == {
        "mini_gpu_embed_rows_tensor": {"F16": 1},
        "mini_gpu_rms_norm_weight_rows_tensor": {"F32": 5},
        "mini_gpu_matmul_q8_0_tensor": {"Q8_0": 9},
        "mini_gpu_attention_window_tensor": {"F32": 2},
        "mini_gpu_matmul_f16_tensor": {"F16": 2},
        "mini_gpu_routed_gate_up_iq2_xxs_tensor": {"IQ2_XXS": 4},
        "mini_gpu_routed_down_q2_k_tensor": {"Q2_K": 2},
        "mini_gpu_matmul_q4_k_tensor": {},
    }
    assert c.unit("mini_gpu_matmul_q4_k_tensor").absent == ["Q4_K"]  # the abandoned variant: nothing in the file


# ---------------------------------------------------------------- the compressor's ape, the Q4_K variant


def test_compressor_ape_is_read_by_every_compressor_unit(ds4_file, ds4_rules):
    """ds4.c reads `ape` directly in three compressor calls and, through the `ape` parameter of
    metal_graph_refresh_ratio4_compressor_state, in ds4_gpu_compressor_prefill_state_ratio4_tensor."""
    c = census(ds4_file, ds4_rules)
    # 41 compressed layers have attn_compressor_ape, the 21 ratio-4 ones also indexer_compressor_ape
    for unit in ("ds4_gpu_compressor_prefill_tensor", "ds4_gpu_compressor_update_tensor",
                 "ds4_gpu_compressor_prefill_ratio4_replay_tensor", "ds4_gpu_compressor_prefill_state_ratio4_tensor"):
        assert c.unit(unit).required.get("F16") == 41 + 21, unit
        assert c.unit(unit).examples["F16"].endswith("compressor_ape.weight")


def test_q4_k_expert_file_is_the_q4_variant(tmp_path, ds4_rules):
    from porter.target.scan.census import load_variants

    variants = load_variants(DS4_TARGET)
    assert [v.name for v in variants] == ["q2", "q4", "mtp"]
    q2 = census(write_header_only(tmp_path / "q2.gguf", ds4_tensors()), ds4_rules, variants=variants)
    assert q2.variant == "q2" and q2.variant_notes == []
    q4_file = write_header_only(tmp_path / "q4.gguf", ds4_tensors(), overrides={"blk.*.ffn_*_exps.weight": "Q4_K"})
    q4 = census(q4_file, ds4_rules, variants=variants)
    assert q4.variant == "q4" and q4.flags == []
    moe = q4.unit("ds4_gpu_routed_moe_one_tensor")
    assert moe.required == {"Q4_K": 3 * 43} and sorted(moe.absent) == ["IQ2_XXS", "Q2_K"]


def test_a_mixed_expert_file_is_no_variant_and_says_why(tmp_path, ds4_rules):
    from porter.target.scan.census import load_variants

    # gate Q4_K with up IQ2_XXS: ds4.c refuses it ("routed gate/up experts use different quant types")
    mixed = write_header_only(tmp_path / "mixed.gguf", ds4_tensors(), overrides={"blk.*.ffn_gate_exps.weight": "Q4_K"})
    c = census(mixed, ds4_rules, variants=load_variants(DS4_TARGET))
    assert c.variant is None
    assert any(n.startswith("q2: blk.0.ffn_gate_exps.weight is Q4_K, IQ2_XXS expected (and 42 more)") for n in c.variant_notes)
    assert any(n.startswith("q4: blk.0.ffn_up_exps.weight is IQ2_XXS, Q4_K expected") for n in c.variant_notes)
    assert "mtp: no tensor of this file matches its patterns" in c.variant_notes
