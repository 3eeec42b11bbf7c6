"""Metal scanning: the offset-preserving pre-pass, kernels, instantiations, function constants, slices.

minimoe expectations are literal (targets/minimoe/metal/*.metal); ds4's run on
$PORTER_DS4_SOURCE (default external/ds4) and skip with the reason when absent.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import NO_DS4

from porter.target.scan import scan
from porter.target.scan.common import IDENT, mask_comments
from porter.target.scan.metal import loop_macros, prepare, scan_metal
from porter.target.scan.slice import closure, metal_slice
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
DS4 = Path(os.environ.get("PORTER_DS4_SOURCE") or REPO / "external" / "ds4")
needs_ds4 = pytest.mark.skipif(not (DS4 / "ds4_gpu.h").is_file(),
                               reason=NO_DS4)


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    t = load_target(REPO, "minimoe")
    if not (t.metal_host.is_file() and t.metal_sources):
        pytest.skip("targets/minimoe has no Metal sources yet")
    return t, scan(t, cache_dir=tmp_path_factory.mktemp("scan-cache"))


@pytest.fixture(scope="module")
def ds4(tmp_path_factory):
    if not (DS4 / "ds4_gpu.h").is_file():
        pytest.skip(NO_DS4)
    t = load_target(REPO, "ds4", DS4)
    return t, scan(t, cache_dir=tmp_path_factory.mktemp("scan-cache"))


# ---------------------------------------------------------------- pre-pass

SNIPPET = b"""
#define FOR_UNROLL(x) _Pragma("clang loop unroll(full)") for (x)
constant short FC_nsg [[function_constant(FC_BASE + 1)]];
// a comment naming kernel device [[buffer(9)]]
template [[host_name("kernel_x_f16")]] kernel kern_t kernel_x<half>;
[[host_name("kernel_plain_alias")]]
kernel void kernel_plain(
        constant args_t & args,
        device const char * src [[buffer(3)]],
        device       float * dst,
        threadgroup  float * shmem [[threadgroup(0)]],
        uint3 tgpig[[threadgroup_position_in_grid]]) {
    FOR_UNROLL (short i = 0; i < 4; ++i) { dst[i] = 0; }
}
"""


def test_prepass_keeps_every_offset_and_newline():
    p = prepare("snippet.metal", SNIPPET, loop_macros([SNIPPET]))
    assert len(p.parsed) == len(SNIPPET)
    assert [i for i, c in enumerate(p.parsed) if c == 10] == [i for i, c in enumerate(SNIPPET) if c == 10]
    assert b"[[" not in p.parsed and b"kernel void" not in p.parsed and b"device const" not in p.parsed
    # what was blanked is recorded, with its offset; comments are not attributes
    assert [a[2] for a in p.attrs] == ['function_constant(FC_BASE + 1)', 'host_name("kernel_x_f16")',
                                       'host_name("kernel_plain_alias")', 'buffer(3)', 'threadgroup(0)',
                                       'threadgroup_position_in_grid']
    for start, end, content in p.attrs:
        assert SNIPPET[start:end].decode() .startswith("[[")
    assert "buffer(9)" not in [a[2] for a in p.attrs]
    # the loop macro became a `for` of the same length
    i = SNIPPET.index(b"FOR_UNROLL (short")
    assert p.parsed[i : i + 10] == b"for       "


def test_snippet_kernels_params_and_instantiation():
    m = scan_metal([("snippet.metal", SNIPPET)])
    assert m.files[0].error_nodes == 0
    k = m.kernel("kernel_plain")
    assert k.host_name == "kernel_plain_alias" and not k.template
    assert [(p.name, p.address_space, p.buffer, p.buffer_implicit) for p in k.params] == [
        ("args", "constant", 0, True), ("src", "device", 3, False), ("dst", "device", 1, True),
        ("shmem", "threadgroup", None, False), ("tgpig", None, None, False)]
    assert k.params[1].decl == "device const char * src"
    assert k.params[4].attributes == ("threadgroup_position_in_grid",)
    assert [(i.host_name, i.template, i.args, i.type_name) for i in m.instantiations] == [
        ("kernel_x_f16", "kernel_x", ("half",), "kern_t")]
    assert m.host_names["kernel_x_f16"].kernel == "kernel_x"
    assert m.host_names["kernel_plain_alias"].kernel == "kernel_plain"
    assert [(f.name, f.index_expr, f.index) for f in m.function_constants] == [("FC_nsg", "FC_BASE + 1", None)]


# ---------------------------------------------------------------- minimoe (literal)

MINI_KERNELS = [  # (function, template?) in file order: attention, common, dense, moe, rows
    ("kernel_attn_window_f32", False), ("kernel_get_rows_f16", False), ("kernel_mul_mv", True),
    ("kernel_mul_mv_f16_f32", False), ("kernel_mul_mv_q4_k_f32_v0", False), ("kernel_debug_checksum_f32", False),
    ("kernel_debug_dump_f32", False), ("kernel_router_topk_f32", False), ("kernel_mul_mv_id", True),
    ("kernel_moe_weighted_sum_f32", False), ("kernel_rms_norm", True), ("kernel_rope_tail_f32", False),
    ("kernel_add_f32", False), ("kernel_swiglu_f32", False),
]
MINI_INSTANTIATIONS = {
    "kernel_mul_mv_q8_0_f32": ("kernel_mul_mv", ("block_q8_0",)),
    "kernel_mul_mv_q4_k_f32": ("kernel_mul_mv", ("block_q4_k",)),
    "kernel_mul_mv_id_iq2_xxs_f32": ("kernel_mul_mv_id", ("block_iq2_xxs",)),
    "kernel_mul_mv_id_q2_k_f32": ("kernel_mul_mv_id", ("block_q2_k",)),
    "kernel_rms_norm_plain_f32": ("kernel_rms_norm", ("1",)),
    "kernel_rms_norm_weight_f32": ("kernel_rms_norm", ("2",)),
}


def test_minimoe_inventory(mini):
    _, s = mini
    m = s.metal
    assert {f.path: f.error_nodes for f in m.files} == {
        "metal/attention.metal": 0, "metal/common.metal": 0, "metal/dense.metal": 0, "metal/moe.metal": 0,
        "metal/rows.metal": 0}
    assert [(k.name, k.template) for k in m.kernels] == MINI_KERNELS
    assert {i.host_name: (i.template, i.args) for i in m.instantiations} == MINI_INSTANTIATIONS
    assert sorted(m.host_names) == sorted(
        [k for k, t in MINI_KERNELS if not t] + list(MINI_INSTANTIATIONS))
    assert len(m.host_names) == 17
    assert [(f.name, f.type, f.index) for f in m.function_constants] == [("FC_attn_has_sinks", "bool", 0)]


def test_minimoe_kernel_params(mini):
    _, s = mini
    k = s.metal.kernel("kernel_rms_norm")
    assert k.template and k.template_params == "<short F>"
    assert [(p.name, p.buffer) for p in k.params if p.buffer is not None] == [
        ("args", 0), ("src0", 1), ("w", 2), ("dst", 3)]
    assert k.params[4].attributes == ("threadgroup(0)",) and k.params[4].address_space == "threadgroup"


def test_minimoe_slice_is_self_contained(mini):
    t, s = mini
    text = metal_slice(t, ["kernel_rms_norm_plain_f32"], s)
    assert "template [[host_name(\"kernel_rms_norm_plain_f32\")]]" in text
    assert "kernel void kernel_rms_norm(" in text
    assert "struct mini_args_rms_norm" in text and "threadgroup_sum" in text
    assert "kernel_rope_tail_f32" not in text and "kernel_mul_mv_id" not in text
    _assert_self_contained(s.metal, ["kernel_rms_norm_plain_f32"], text)
    for name in s.metal.host_names:
        syms, unknown = closure(s.metal, [name])
        assert not unknown
        _assert_self_contained(s.metal, [name], "\n".join(x.text for x in syms))


def test_slice_of_unknown_name_says_so(mini):
    t, s = mini
    assert "no Metal kernel, host name or symbol named kernel_nope" in metal_slice(t, ["kernel_nope"], s)


def _assert_self_contained(metal, names, text):
    """Every identifier of the slice that some Metal file defines at top level is defined in the slice."""
    defined_anywhere = {n for sym in metal.symbols for n in sym.names}
    syms, _ = closure(metal, names)
    defined_here = {n for sym in syms for n in sym.names}
    used = {t.decode() for t in IDENT.findall(mask_comments(text.encode()))}
    missing = sorted((used & defined_anywhere) - defined_here)
    assert not missing, f"slice of {names} uses {missing} without defining them"


# ---------------------------------------------------------------- ds4

DS4_METAL_FILES = ["ds4_metal.m:ds4_gpu_source", "metal/argsort.metal", "metal/bin.metal", "metal/concat.metal",
                   "metal/cpy.metal", "metal/dense.metal", "metal/dsv4_hc.metal", "metal/dsv4_kv.metal",
                   "metal/dsv4_misc.metal", "metal/dsv4_rope.metal", "metal/flash_attn.metal", "metal/get_rows.metal",
                   "metal/glu.metal", "metal/moe.metal", "metal/norm.metal", "metal/repeat.metal",
                   "metal/set_rows.metal", "metal/softmax.metal", "metal/sum_rows.metal", "metal/unary.metal"]


@needs_ds4
def test_ds4_metal_parses_without_error_nodes(ds4):
    _, s = ds4
    counts = {f.path: f.error_nodes for f in s.metal.files}
    print("ERROR nodes per Metal file:", counts)
    assert list(counts) == DS4_METAL_FILES  # the prelude embedded in ds4_metal.m comes first, as the host prepends it
    assert counts == {f: 0 for f in DS4_METAL_FILES}


@needs_ds4
def test_ds4_kernel_and_host_name_counts(ds4):
    _, s = ds4
    m = s.metal
    print(f"ds4: {len(m.kernels)} kernel functions ({sum(k.template for k in m.kernels)} templates), "
          f"{len(m.instantiations)} instantiations, {len(m.host_names)} host names, "
          f"{len(m.function_constants)} function constants")
    assert len(m.kernels) == 69
    assert sum(k.template for k in m.kernels) == 22
    assert len(m.instantiations) == 58
    assert len(m.host_names) == 105
    assert len(m.function_constants) == 35
    assert m.duplicate_host_names == []
    # the prelude's kernel and the function constants' indices folded through its macros
    assert m.host_names["kernel_touch_u8_stride"].file == "ds4_metal.m:ds4_gpu_source"
    fc = {f.name: f.index for f in m.function_constants}
    assert fc["FC_mul_mv_nsg"] == 600 and fc["FC_bin_op"] == 1300
    fa = m.host_names["kernel_flash_attn_ext_f16_dk512_dv512"]
    assert fa.kernel == "kernel_flash_attn_ext" and fa.template_args[0] == "FA_NONVEC_TYPES"


@needs_ds4
def test_ds4_slices(ds4):
    t, s = ds4
    text = metal_slice(t, ["kernel_mul_mv_q8_0_f32"], s)
    for needle in ("struct block_q8_0", "#define FC_MUL_MV 600", "#define FOR_UNROLL(x)",
                   "constant short FC_mul_mv_nsg", "void kernel_mul_mv_q8_0_f32_impl(", "helper_mv_reduce_and_write",
                   "kernel void kernel_mul_mv_q8_0_f32("):
        assert needle in text, needle
    # prelude definitions come before the file that uses them
    assert text.index("struct block_q8_0") < text.index("kernel_mul_mv_q8_0_f32_impl")
    assert "kernel_flash_attn_ext" not in text
    fa = metal_slice(t, ["kernel_flash_attn_ext_f16_dk512_dv512"], s)
    assert "#define FA_NONVEC_TYPES" in fa and "#undef FA_NONVEC_TYPES" in fa
    assert fa.index("#define FA_NONVEC_TYPES") < fa.index("#undef FA_NONVEC_TYPES")
    for name in s.metal.host_names:
        syms, unknown = closure(s.metal, [name])
        assert not unknown
        _assert_self_contained(s.metal, [name], "\n".join(x.text for x in syms))
    assert re.search(r"// ---- metal/dense\.metal:\d+ ----", text)
