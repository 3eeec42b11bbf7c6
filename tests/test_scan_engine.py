"""Engine call graph: what prefill and decode reach, and by which path.

minimoe's reachability is literal; ds4's prefill set must hold the units that
gate prefill (the failed port never attempted them).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import NO_DS4

from porter.target.scan import scan
from porter.target.scan.engine import scan_engine, split_entries
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
DS4 = Path(os.environ.get("PORTER_DS4_SOURCE") or REPO / "external" / "ds4")
needs_ds4 = pytest.mark.skipif(not (DS4 / "ds4_gpu.h").is_file(),
                               reason=NO_DS4)

ENGINE = b"""
#define SYNC() api_sync()
typedef int (*op_fn)(int);
static int helper(int x) { return api_b(x); }
static int callback(int x) { return api_cb(x); }
static int run_op(op_fn f) { return f(1); }
/* api_in_comment(1) is not a call */
static const char *s = "api_in_string(2)";
int prefill(int n) {
    api_a(n);
    helper(n);
    run_op(callback);
    SYNC();
    return 0;
}
int decode(int n) { return helper(n) + api_d(n); }
int unused(void) { return api_e(0); }
"""
API = ["api_a", "api_b", "api_cb", "api_d", "api_e", "api_sync", "api_in_comment", "api_in_string", "api_never"]


def test_synthetic_reachability_and_paths():
    g = scan_engine([("engine.c", ENGINE)], API, {"prefill": "prefill", "decode": "decode"},
                    host_api_calls={"api_d": ["api_never"]})
    reach = {ph: sorted(u for u in API if u in g.reach[ph]) for ph in ("prefill", "decode")}
    assert reach == {"prefill": ["api_a", "api_b", "api_cb", "api_sync"], "decode": ["api_b", "api_d", "api_never"]}
    assert [fn for fn, _ in g.path("prefill", "api_cb")] == ["prefill", "callback", "api_cb"]  # a callback reference
    assert [fn for fn, _ in g.path("prefill", "api_sync")] == ["prefill", "macro:SYNC", "api_sync"]
    assert [fn for fn, _ in g.path("decode", "api_never")] == ["decode", "api_d", "api_never"]  # host API->API edge
    assert g.path("prefill", "api_e") == [] and g.api_callers["api_e"] == [("unused", 17)]
    assert g.depth("prefill", "api_b") == 2
    assert g.error_nodes == {"engine.c": 0}


def test_entry_points_may_name_several_functions():
    assert split_entries("a, b  c") == ["a", "b", "c"]
    g = scan_engine([("engine.c", ENGINE)], API, {"prefill": "prefill, unused", "decode": "nope"})
    assert "api_e" in g.reach["prefill"] and g.missing_entries == ["nope"]


# ---------------------------------------------------------------- minimoe (literal)

MINI_PREFILL = ["mini_gpu_tensor_view", "mini_gpu_tensor_free", "mini_gpu_tensor_write", "mini_gpu_tensor_read",
                "mini_gpu_tensor_copy", "mini_gpu_synchronize", "mini_gpu_embed_rows_tensor",
                "mini_gpu_rms_norm_plain_rows_tensor", "mini_gpu_rms_norm_weight_rows_tensor",
                "mini_gpu_matmul_q8_0_tensor", "mini_gpu_matmul_f16_tensor", "mini_gpu_rope_tail_tensor",
                "mini_gpu_attention_window_tensor", "mini_gpu_router_topk_tensor",
                "mini_gpu_routed_gate_up_iq2_xxs_tensor", "mini_gpu_routed_down_q2_k_tensor", "mini_gpu_swiglu_tensor",
                "mini_gpu_add_tensor"]
MINI_DECODE = [u for u in MINI_PREFILL if u not in ("mini_gpu_tensor_view", "mini_gpu_tensor_free")]


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    t = load_target(REPO, "minimoe")
    return t, scan(t, cache_dir=tmp_path_factory.mktemp("scan-cache"))


def test_minimoe_reachability_per_phase(mini):
    _, s = mini
    e = s.engine
    assert e.entries == {"prefill": ["mini_engine_prefill"], "decode": ["mini_engine_decode_step"]}
    assert e.missing_entries == [] and e.error_nodes == {"engine.c": 0}
    assert [u for u in s.api if u in e.reach["prefill"]] == MINI_PREFILL
    assert [u for u in s.api if u in e.reach["decode"]] == MINI_DECODE
    for decoy in ("mini_gpu_matmul_q4_k_tensor", "mini_gpu_debug_checksum_tensor"):
        assert decoy not in e.reach["prefill"] and decoy not in e.reach["decode"]
        assert decoy not in e.api_callers
    assert e.depth("prefill", "mini_gpu_matmul_q8_0_tensor") == 1  # the output head, in mini_engine_prefill itself
    assert e.depth("prefill", "mini_gpu_routed_down_q2_k_tensor") == 2
    assert [fn for fn, _ in e.path("prefill", "mini_gpu_routed_down_q2_k_tensor")] == [
        "mini_engine_prefill", "mini_engine_layer", "mini_gpu_routed_down_q2_k_tensor"]


# ---------------------------------------------------------------- ds4

GATE_PREFILL = ["ds4_gpu_compressor_prefill_tensor", "ds4_gpu_attention_prefill_static_mixed_heads_tensor",
                "ds4_gpu_attention_indexed_mixed_batch_heads_tensor", "ds4_gpu_indexer_scores_prefill_tensor",
                "ds4_gpu_indexer_topk_tensor", "ds4_gpu_router_select_batch_tensor", "ds4_gpu_routed_moe_batch_tensor",
                "ds4_gpu_attention_output_q8_batch_tensor", "ds4_gpu_output_hc_weights_tensor",
                "ds4_gpu_hc_expand_tensor"]


@needs_ds4
def test_ds4_prefill_reaches_the_units_that_gate_it(tmp_path):
    t = load_target(REPO, "ds4", DS4)
    s = scan(t, cache_dir=tmp_path)
    e = s.engine
    assert e.missing_entries == []
    print("ds4.c ERROR nodes:", e.error_nodes)
    for u in GATE_PREFILL:
        chain = [fn for fn, _ in e.path("prefill", u)]
        print(f"{u}: {' -> '.join(chain)}")
        assert chain and chain[0] == "ds4_session_sync" and chain[-1] == u
    # the batched layer-major path, not only the one-token graph
    assert "metal_graph_encode_layer_batch" in [fn for fn, _ in e.path("prefill", "ds4_gpu_routed_moe_batch_tensor")]
    assert "ds4_gpu_attention_prefill_masked_mixed_heads_tensor" not in e.reach["prefill"]
    assert "ds4_gpu_attention_prefill_masked_mixed_heads_tensor" not in e.reach["decode"]
