"""Host dispatch map: API function -> dispatch sites -> kernel names (+ bindings, grids, UNRESOLVED).

Synthetic Objective-C snippets pin each resolution rule; minimoe's map is
literal; ds4's runs on $PORTER_DS4_SOURCE (default external/ds4), skipped when absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import NO_DS4

from porter.target.scan import _add_candidates, scan
from porter.target.scan.host import scan_host
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
DS4 = Path(os.environ.get("PORTER_DS4_SOURCE") or REPO / "external" / "ds4")
needs_ds4 = pytest.mark.skipif(not (DS4 / "ds4_gpu.h").is_file(),
                               reason=NO_DS4)

HOST = b"""
#define KIND_PLAIN 0
enum { MODE_A = 0, MODE_B = 1 };
static const char *k_names[] = { "kernel_plain", "kernel_weighted" };
static id<MTLComputePipelineState> g_cached_pipeline;
static NSMutableDictionary *g_cache;

static id<MTLComputePipelineState> get_pipeline(const char *name) {
    id<MTLComputePipelineState> hit = g_cache[[NSString stringWithUTF8String:name]];
    if (hit) return hit;
    NSString *fn_name = [NSString stringWithUTF8String:name];
    id<MTLFunction> fn = [g_library newFunctionWithName:fn_name];
    if (!fn) return nil;
    id<MTLComputePipelineState> p = [g_device newComputePipelineStateWithFunction:fn error:nil];
    return p;
}

static const char *variant_name(int q8, int r) {
    if (q8) {
        switch (r) {
        case 2: return "kernel_q8_r2";
        case 3:
        case 4: return "kernel_q8_r34";
        default: return NULL;
        }
    }
    return r == 2 ? "kernel_f16_r2" : "kernel_f16_rx";
}

static void encode(id<MTLComputePipelineState> pipeline, uint32_t n) {
    id<MTLComputeCommandEncoder> enc = g_enc;
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&n length:sizeof n atIndex:0];
    [enc setBuffer:g_buf offset:(NSUInteger)16 atIndex:KIND_PLAIN + 1];
    [enc dispatchThreadgroups:MTLSizeMake(n, 1, 1) threadsPerThreadgroup:MTLSizeMake(32, 1, 1)];
}

int api_init(void) {
    id<MTLFunction> fn = [g_library newFunctionWithName:@"kernel_first"];
    fn = [g_library newFunctionWithName:@"kernel_cached"];
    g_cached_pipeline = [g_device newComputePipelineStateWithFunction:fn error:nil];
    fn = [g_library newFunctionWithName:@"kernel_third"];
    return 0;
}

int api_table(int kind) {
    encode(get_pipeline(k_names[KIND_PLAIN]), 1);
    encode(get_pipeline(k_names[kind]), 2);
    return 0;
}

int api_global(void) {
    [g_enc setComputePipelineState:g_cached_pipeline];
    return 0;
}

int api_format(const char *type_name, int r) {
    char name[64];
    snprintf(name, sizeof name, "kernel_mul_mv_%s_f32", "q8_0");
    encode(get_pipeline(name), 1);
    snprintf(name, sizeof name, "kernel_mul_mv_%s_r%d", type_name, MODE_B + 1);
    encode(get_pipeline(name), 2);
    return 0;
}

int api_pruned(int r) {
    id<MTLComputePipelineState> p = get_pipeline(variant_name(1, r));
    id<MTLComputePipelineState> q = r > 2 ? get_pipeline("kernel_big") : get_pipeline("kernel_small");
    encode(p, 1);
    encode(q, 2);
    return 0;
}

int api_external(void) {
    encode(get_pipeline(name_from_elsewhere()), 1);
    return 0;
}

int api_struct(void) {
    my_dispatch d = make_dispatch();
    d.nsg = 8;
    encode(get_pipeline(d.function_name), d.nsg);
    return 0;
}

static my_dispatch make_dispatch(void) {
    return (my_dispatch) { .function_name = "kernel_from_struct", .nsg = 4 };
}

int api_nothing(void) { return 0; }
"""
API = ["api_init", "api_table", "api_global", "api_format", "api_pruned", "api_external", "api_struct", "api_nothing",
       "api_missing"]


@pytest.fixture(scope="module")
def synth():
    h = scan_host("synthetic.m", HOST, API)
    for ad in h.api.values():
        _add_candidates(ad, {"kernel_mul_mv_q8_0_r2", "kernel_mul_mv_f16_r2", "kernel_mul_mv_q8_0_f32", "kernel_other"})
    return h


def test_table_entry_by_constant_index_and_all_entries_by_parameter(synth):
    ad = synth.api["api_table"]
    assert [s.kernels for s in ad.sites] == [("kernel_plain",), ("kernel_plain", "kernel_weighted")]
    assert ad.helpers == ["encode"] and ad.unresolved == []


def test_global_pipeline_followed_to_its_creation(synth):
    # flow-sensitive: fn holds "kernel_cached" where the global is created, not every name fn ever held
    assert synth.api["api_global"].kernels == ["kernel_cached"]
    assert synth.api["api_init"].kernels == []  # creates pipelines, dispatches nothing


def test_snprintf_names_resolved_or_unresolved_with_pattern(synth):
    ad = synth.api["api_format"]
    assert ad.sites[0].kernels == ("kernel_mul_mv_q8_0_f32",)
    assert ad.sites[1].kernels == ()
    [u] = ad.sites[1].unresolved
    assert u.pattern == "kernel_mul_mv_%s_r%d"
    assert "parameter type_name of api_format" in u.reason and u.where.startswith("encode:")
    assert u.candidates == ("kernel_mul_mv_f16_r2", "kernel_mul_mv_q8_0_r2")  # MODE_B + 1 == 2 was folded
    assert ad.unresolved == [u]


def test_branches_on_known_arguments_are_pruned(synth):
    ad = synth.api["api_pruned"]
    assert ad.sites[0].kernels == ("kernel_q8_r2", "kernel_q8_r34")  # q8 == 1: the f16 names are dead code
    assert ad.sites[1].kernels == ("kernel_big", "kernel_small")  # r unknown: both arms


def test_external_name_is_unresolved_never_dropped(synth):
    ad = synth.api["api_external"]
    assert ad.kernels == []
    [u] = ad.unresolved
    assert u.pattern == "name_from_elsewhere()" and "not defined in synthetic.m" in u.reason


def test_struct_field_from_designated_initialiser(synth):
    assert synth.api["api_struct"].kernels == ["kernel_from_struct"]


def test_bindings_and_grid_of_a_site(synth):
    s = synth.api["api_table"].sites[0]
    assert s.function == "encode" and s.path == ("api_table", "encode")
    assert [(b.kind, b.index, b.expr) for b in s.bindings] == [("bytes", 0, "&n"), ("buffer", 1, "g_buf")]
    assert s.bindings[1].offset == "(NSUInteger)16"
    assert s.grids == ("dispatchThreadgroups:(MTLSizeMake(n, 1, 1)) threadsPerThreadgroup:(MTLSizeMake(32, 1, 1))",)


def test_api_function_without_dispatch_or_definition(synth):
    assert synth.api["api_nothing"].sites == [] and synth.api["api_nothing"].line > 0
    assert synth.api["api_missing"].line == 0


# ---------------------------------------------------------------- minimoe (literal)

MINI_DISPATCH = {
    "mini_gpu_init": [], "mini_gpu_cleanup": [], "mini_gpu_tensor_alloc": [], "mini_gpu_tensor_view": [],
    "mini_gpu_tensor_free": [], "mini_gpu_tensor_bytes": [], "mini_gpu_tensor_write": [], "mini_gpu_tensor_read": [],
    "mini_gpu_tensor_copy": [], "mini_gpu_synchronize": [],
    "mini_gpu_embed_rows_tensor": ["kernel_get_rows_f16"],
    "mini_gpu_rms_norm_plain_rows_tensor": ["kernel_rms_norm_plain_f32"],
    "mini_gpu_rms_norm_weight_rows_tensor": ["kernel_rms_norm_weight_f32"],
    "mini_gpu_matmul_q8_0_tensor": ["kernel_mul_mv_q8_0_f32"],
    "mini_gpu_matmul_f16_tensor": ["kernel_mul_mv_f16_f32"],
    "mini_gpu_matmul_q4_k_tensor": ["kernel_mul_mv_q4_k_f32"],
    "mini_gpu_rope_tail_tensor": ["kernel_rope_tail_f32"],
    "mini_gpu_attention_window_tensor": ["kernel_attn_window_f32"],
    "mini_gpu_router_topk_tensor": ["kernel_router_topk_f32"],
    "mini_gpu_routed_gate_up_iq2_xxs_tensor": ["kernel_mul_mv_id_iq2_xxs_f32"],
    "mini_gpu_routed_down_q2_k_tensor": ["kernel_mul_mv_id_q2_k_f32", "kernel_moe_weighted_sum_f32"],
    "mini_gpu_swiglu_tensor": ["kernel_swiglu_f32"],
    "mini_gpu_add_tensor": ["kernel_add_f32"],
    "mini_gpu_debug_checksum_tensor": ["kernel_debug_checksum_f32"],
}


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    t = load_target(REPO, "minimoe")
    if not t.metal_host.is_file():
        pytest.skip("targets/minimoe/mini_metal.m not written yet")
    return t, scan(t, cache_dir=tmp_path_factory.mktemp("scan-cache"))


def test_minimoe_dispatch_map(mini):
    _, s = mini
    assert s.host.error_nodes == 0
    assert {u: ad.kernels for u, ad in s.host.api.items()} == MINI_DISPATCH
    assert s.unresolved() == []
    assert s.unknown_kernels == {}
    # dispatched by nothing: the debug dump kernel and the abandoned q4_k v0 kernel
    assert s.undispatched == ["kernel_debug_dump_f32", "kernel_mul_mv_q4_k_f32_v0"]


def test_minimoe_dispatch_details(mini):
    _, s = mini
    gu = s.host.api["mini_gpu_routed_gate_up_iq2_xxs_tensor"]
    assert [(x.function, x.path) for x in gu.sites] == [
        ("mini_metal_encode_mul_mv_id", ("mini_gpu_routed_gate_up_iq2_xxs_tensor", "mini_metal_encode_mul_mv_id"))] * 2
    q8 = s.host.api["mini_gpu_matmul_q8_0_tensor"]
    [site] = q8.sites
    assert site.function == "mini_metal_mul_mv" and q8.helpers == ["mini_metal_mul_mv"]
    assert [(b.kind, b.index) for b in site.bindings] == [
        ("bytes", 0), ("buffer", 1), ("buffer", 2), ("buffer", 3), ("threadgroup_memory", 0)]
    assert "threadsPerThreadgroup:(MTLSizeMake(MINI_MV_NSG * N_SIMDWIDTH, 1, 1))" in site.grids[0]


# ---------------------------------------------------------------- ds4


@pytest.fixture(scope="module")
def ds4(tmp_path_factory):
    if not (DS4 / "ds4_gpu.h").is_file():
        pytest.skip(NO_DS4)
    t = load_target(REPO, "ds4", DS4)
    return t, scan(t, cache_dir=tmp_path_factory.mktemp("scan-cache"))


@needs_ds4
def test_ds4_api_functions(ds4):
    t, s = ds4
    assert len(s.api) == 81
    assert s.api[:4] == ["ds4_gpu_init", "ds4_gpu_cleanup", "ds4_gpu_tensor_alloc", "ds4_gpu_tensor_alloc_managed"]
    assert s.api[-2:] == ["ds4_gpu_shared_down_hc_expand_q8_0_tensor", "ds4_gpu_matmul_q8_0_hc_expand_tensor"]
    not_defined = [u for u, ad in s.host.api.items() if ad.line == 0]
    # declared in ds4_gpu.h for the CUDA backend only: ds4_metal.m has no definition
    assert not_defined == ["ds4_gpu_cache_model_range", "ds4_gpu_cache_q8_f16_range"]
    assert s.host.error_nodes == 0


@needs_ds4
def test_ds4_unresolved_dispatches_are_listed(ds4):
    _, s = ds4
    unres = s.unresolved()
    print(f"ds4: {len(unres)} UNRESOLVED dispatch(es)")
    for unit, u in unres:
        print(f"  {unit}: {u.pattern} — {u.reason} [{u.where}] candidates={list(u.candidates)}")
        assert u.reason and u.where
    assert s.unknown_kernels == {}
    print("host names dispatched by no API function:", s.undispatched)
    assert s.undispatched == ["kernel_mul_mm_id_q8_0_f16"]


@needs_ds4
def test_ds4_dispatch_examples(ds4):
    _, s = ds4
    k = {u: ad.kernels for u, ad in s.host.api.items()}
    # Q8_0 matmul: only Q8_0 kernels (the F16 branch of ds4_gpu_mv_ext_name is pruned on q8 == 1)
    assert k["ds4_gpu_matmul_q8_0_tensor"] == [
        "kernel_mul_mv_q8_0_f32", "kernel_mul_mv_ext_q8_0_f32_r1_2", "kernel_mul_mv_ext_q8_0_f32_r1_3",
        "kernel_mul_mv_ext_q8_0_f32_r1_4", "kernel_mul_mv_ext_q8_0_f32_r1_5", "kernel_mul_mm_q8_0_f32"]
    assert k["ds4_gpu_indexer_topk_tensor"] == ["kernel_argsort_f32_i32_desc", "kernel_argsort_merge_f32_i32_desc"]
    moe = set(k["ds4_gpu_routed_moe_batch_tensor"])
    assert {"kernel_mul_mm_id_iq2_xxs_f32", "kernel_mul_mm_id_q2_K_f32", "kernel_mul_mm_id_iq2_xxs_f16",
            "kernel_mul_mm_id_q2_K_f16", "kernel_mul_mv_id_iq2_xxs_pair_f32", "kernel_mul_mv_id_q2_K_f32"} <= moe
    # pipelines cached in globals at init (g_dsv4_hc_expand4_pipeline = ds4_gpu_get_pipeline("..."))
    assert k["ds4_gpu_hc_expand_tensor"] == ["kernel_dsv4_hc_expand", "kernel_dsv4_hc_expand4"]
    assert set(k["ds4_gpu_attention_indexed_mixed_batch_heads_tensor"]) == {
        "kernel_dsv4_sort_i32_rows_asc", "kernel_dsv4_indexed_mixed_attention_heads8",
        "kernel_dsv4_indexed_mixed_attention_heads8_rb4"}
    ao = s.host.api["ds4_gpu_attention_output_q8_batch_tensor"]
    assert "ds4_gpu_matmul_q8_0_tensor" in ao.api_calls
