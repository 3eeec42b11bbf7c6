"""minimoe's spec cases added for the mutation survivors of the norms, rope, router, swiglu and attention's
weights, each shown refusing the flaw class it exists for.

Host mode, as tests/test_minimoe_spec_edges_host.py: targets/minimoe/mini_cpu.c (a complete CPU backend of
mini_gpu.h) stands in for the known-good, and a one-line edit of it for the flaw.  The CUDA mutants these
cases answer need a GPU; the flaw classes do not:

- the norms: rows of one value (n = 1) refused, a call with no rows refused; the weighted norm also reading
  a weight at a byte offset that is not a multiple of 4 wrong (from the aligned-down address, or its
  bytes assembled wrong), and checking fewer than the weight's n * 4 bytes against the map;
- rope: n_rot odd or past head_dim accepted, n_rot 0 / no tokens / no heads refused, a launch that fails
  past 1024 x 256 pairs, the rotation rounded through half;
- the router: no tokens refused, the probabilities of the last 32 of 256 experts left unnormalised, only
  the first 256 experts ranked, top_k past 32 leaving slots unwritten; and the open cases ("either")
  accepting a backend that refuses them at the CUDA known-good's limits or at Metal's;
- swiglu: n = 0 refused;
- attention: each key's weight rounded through half, which the sink-dominated case shows by far (NMSE
  ~1e-3; the older case with sinks level with +200 scores sits near its max |err|/rms bound for it, and
  now and then refuses it first, so for that flaw the new case is required among the failures, not first).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import mini_cpu_flaws
from porter.spec import load_spec
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
CC = mini_cpu_flaws.CC
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to build mini_cpu.c")

PLAIN, WEIGHT = "mini_gpu_rms_norm_plain_rows_tensor", "mini_gpu_rms_norm_weight_rows_tensor"
ROPE, ROUTER = "mini_gpu_rope_tail_tensor", "mini_gpu_router_topk_tensor"
SWIGLU, ATTN = "mini_gpu_swiglu_tensor", "mini_gpu_attention_window_tensor"

NORM_PLAIN_GUARD = ("    if (n == 0 || !holds(out, count, 4) || !holds(x, count, 4)) return 1;\n"
                    "    rms_norm_rows(F32(out), CF32(x), NULL")
NORM_WEIGHT_GUARD = ("    if (n == 0 || !holds(out, count, 4) || !holds(x, count, 4)) return 1;\n"
                     "    if (!model_ok(model_map, model_size, weight_offset, (uint64_t)n * 4)) return 1;")
WEIGHT_COPY = "    memcpy(w, (const uint8_t *)model_map + weight_offset, (size_t)n * sizeof(float));"
ROPE_GUARD = "    if (n_rot % 2 != 0 || n_rot > head_dim) return 1;"
ROUTER_GUARD = "    if (top_k == 0 || top_k > n_expert) return 1;"
SELECT = "            for (uint32_t e = 0; e < n_expert; e++) {\n                if (taken[e]) continue;"
SWIGLU_BODY = "    const float *g = CF32(gate), *u = CF32(up);"
HALF = "(_Float16)"  # flaws that round through half need the compiler's _Float16 (gcc 12+, clang on x86-64)

# name: (unit, the edit of mini_cpu.c (None: the stand-in itself), the check that must refuse it (None: it
# passes), the case that refuses it first: one of the new ones)
FLAWS = {
    "known_good_plain": (PLAIN, None, None, None),
    "known_good_weight": (WEIGHT, None, None, None),
    "known_good_rope": (ROPE, None, None, None),
    "known_good_router": (ROUTER, None, None, None),
    "known_good_swiglu": (SWIGLU, None, None, None),
    "known_good_attention": (ATTN, None, None, None),
    # ---- the norms
    "plain_refuses_one_value_rows": (PLAIN, (NORM_PLAIN_GUARD, NORM_PLAIN_GUARD.replace("n == 0", "n <= 1")),
                                     "rc", "n=1 x 5 rows"),
    "plain_no_rows_is_a_failure": (PLAIN, (NORM_PLAIN_GUARD, "    if (n_rows == 0) return 1;\n" + NORM_PLAIN_GUARD),
                                   "rc", "no rows"),
    "weight_refuses_one_value_rows": (WEIGHT, (NORM_WEIGHT_GUARD, NORM_WEIGHT_GUARD.replace("n == 0", "n <= 1")),
                                      "rc", "n=1 x 5 rows"),
    "weight_no_rows_is_a_failure": (WEIGHT, (NORM_WEIGHT_GUARD, "    if (n_rows == 0) return 1;\n" + NORM_WEIGHT_GUARD),
                                    "rc", "no rows"),
    # the map checked for n bytes of the weight, not n * 4
    "weight_range_checked_short": (WEIGHT, (NORM_WEIGHT_GUARD, NORM_WEIGHT_GUARD.replace(
        "(uint64_t)n * 4)) return 1;", "(uint64_t)n)) return 1;")), "error-return", "past model_size"),
    # a weight at an offset that is not a multiple of 4 read as if it were (from the aligned-down address)
    "weight_read_aligned_down": (WEIGHT, (WEIGHT_COPY, WEIGHT_COPY.replace(
        "model_map + weight_offset", "model_map + (weight_offset & ~(uint64_t)3)")), "values", "offset 1 past"),
    # a byte loader for such a weight that loses each value's second byte (bits 8..15)
    "weight_loader_drops_byte_1": (WEIGHT, (WEIGHT_COPY, WEIGHT_COPY + "\n    if (weight_offset & 3) for (uint32_t "
                                            "i = 0; i < n; i++) ((uint8_t *)(w + i))[1] = 0;"),
                                   "values", "offset 1 past"),
    # ---- rope
    "rope_odd_n_rot_accepted": (ROPE, (ROPE_GUARD, "    if (n_rot > head_dim) return 1;"), "error-return",
                                "n_rot 5 is odd"),
    # (returns success without work: computing it would write before the head, outside x)
    "rope_n_rot_past_head_dim_accepted": (ROPE, (ROPE_GUARD, "    if (n_rot % 2 != 0) return 1;\n"
                                                             "    if (n_rot > head_dim) return 0;"),
                                          "error-return", "n_rot 12 > head_dim 10"),
    "rope_n_rot_zero_is_a_failure": (ROPE, (ROPE_GUARD, ROPE_GUARD + "\n    if (n_rot == 0) return 1;"), "rc",
                                     "n_rot 0"),
    "rope_no_tokens_is_a_failure": (ROPE, (ROPE_GUARD, ROPE_GUARD + "\n    if (n_tokens == 0) return 1;"), "rc",
                                    "no tokens"),
    "rope_no_heads_is_a_failure": (ROPE, (ROPE_GUARD, ROPE_GUARD + "\n    if (n_head == 0) return 1;"), "rc",
                                   "no heads"),
    # a launch shaped for small work (one block's 1024 threads x 256) that fails past it
    "rope_fails_past_1024x256_pairs": (ROPE, (ROPE_GUARD, ROPE_GUARD + "\n    if ((uint64_t)n_tokens * n_head * "
                                                                       "(n_rot / 2) > 1024 * 256) return 1;"),
                                       "rc", "1100 tokens x 32 heads"),
    "rope_rotation_through_half": (ROPE, ("                p[0] = (float)(x0 * c - x1 * s);",
                                          "                p[0] = (float)" + HALF + "(x0 * c - x1 * s);"),
                                   "values", "scales 1e-2 .. 1e6"),
    # ---- the router
    "router_no_tokens_is_a_failure": (ROUTER, (ROUTER_GUARD, ROUTER_GUARD + "\n    if (n_tokens == 0) return 1;"),
                                      "rc", "no tokens"),
    # the probabilities of the last 32 of 256 experts left unnormalised (a kernel's last per-lane slot)
    "router_last_32_of_256_unnormalised": (ROUTER, ("        for (uint32_t e = 0; e < n_expert; e++) p[e] /= sum;",
                                                    "        for (uint32_t e = 0; e < n_expert && e < 224; e++) "
                                                    "p[e] /= sum;"), "exact", "256 experts"),
    "router_ranks_first_256_only": (ROUTER, (SELECT, SELECT.replace("e < n_expert;", "e < n_expert && e < 256;")),
                                    "exact", "300 experts"),
    # top_k past 32 computed, but only 32 slots written (one lane a slot)
    "router_writes_32_slots_at_most": (ROUTER, ("        for (uint32_t k = 0; k < top_k; k++) {\n"
                                                "            const int32_t e = ids",
                                                "        for (uint32_t k = 0; k < top_k && k < 32; k++) {\n"
                                                "            const int32_t e = ids"), "sentinel", "top 36 of 40"),
    # the open cases refused at the CUDA known-good's limits, or at Metal's: both right
    "router_refuses_past_known_good_limits": (ROUTER, (ROUTER_GUARD, ROUTER_GUARD + "\n    if (n_expert > 256 || "
                                                                                    "top_k > 32) return 1;"),
                                              None, None),
    "router_refuses_past_metal_limits": (ROUTER, (ROUTER_GUARD, ROUTER_GUARD + "\n    if (n_expert > 128 || "
                                                                               "top_k > 8) return 1;"), None, None),
    # ---- swiglu
    "swiglu_n_zero_is_a_failure": (SWIGLU, (SWIGLU_BODY, "    if (n == 0) return 1;\n" + SWIGLU_BODY), "rc", "n=0"),
    # ---- attention: each key's weight exp(s_j - m) rounded through half
    "attention_weights_through_half": (ATTN, ("                const double e = exp(s[j - lo] - m);",
                                              "                const double e = (double)" + HALF +
                                              "exp(s[j - lo] - m);"), "values", "sinks 16 above the scores"),
}

# flaws an older case may also refuse, by a hair: the new case must be among the failures (by its check)
ALSO_OLD = {"attention_weights_through_half"}

# each open case of the router and the return codes the stand-in named takes there: rc 0 (computed) or 1
EITHER = {"256 experts": {"known_good_router": 0, "router_refuses_past_known_good_limits": 0,
                          "router_refuses_past_metal_limits": 1},
          "300 experts": {"known_good_router": 0, "router_refuses_past_known_good_limits": 1,
                          "router_refuses_past_metal_limits": 1},
          "top 36 of 40": {"known_good_router": 0, "router_refuses_past_known_good_limits": 1,
                           "router_refuses_past_metal_limits": 1}}


def _has_float16() -> bool:
    if CC is None:
        return False
    r = subprocess.run([CC, "-x", "c", "-fsyntax-only", "-"], input="_Float16 h; double f(double d) "
                       "{ return (double)(_Float16)d; }\n", text=True, capture_output=True)
    return r.returncode == 0


HAS_F16 = _has_float16()


@pytest.fixture(scope="module")
def target():
    return load_target(REPO, "minimoe")


@pytest.fixture(scope="module")
def libs(target, tmp_path_factory):
    return mini_cpu_flaws.build(target.checkout, tmp_path_factory.mktemp("mini_cpu_row_flaws"), FLAWS, cflags=(),
                                skip=lambda edit: HALF in edit[1] and not HAS_F16)


@pytest.mark.parametrize("name", sorted(FLAWS))
def test_each_new_case_refuses_its_flaw_and_the_stand_in_passes(target, libs, tmp_path, name):
    unit, _, check, case = FLAWS[name]
    if name not in libs:
        pytest.skip(f"{CC} has no _Float16 to round through half")
    r = mini_cpu_flaws.run_host(target, load_spec(target, unit), libs[name], tmp_path)
    if check is None:
        assert r.ok, r.summary + "\n" + r.diagnostics
        if unit == ROUTER:  # each open case took the path the stand-in takes: computed (rc 0) or refused
            for label, rcs in EITHER.items():
                line = next(x for x in r.diagnostics.splitlines() if label in x)
                assert f"rc=[{rcs[name]}, {rcs[name]}]" in line, line
    else:
        # the first failure named is one of the new cases: the spec before them let this flaw through
        assert not r.ok and r.check == check, r.summary
        if name in ALSO_OLD:
            assert any(x.strip().startswith(f"[{check}] ") and case in x for x in r.diagnostics.splitlines()), \
                r.diagnostics
        else:
            assert case in r.summary, r.summary
