"""The dense projections' and routed experts' spec cases added for mutation-testing survivors, each shown
refusing the flaw it exists for (the pattern of tests/test_minimoe_spec_edges_host.py).

Host mode: targets/minimoe/mini_cpu.c (a complete CPU backend of mini_gpu.h) stands in for the known-good,
and a small edit of it for the flaw.  The CUDA survivors these cases answer need a GPU; the flaw classes do
not:

- an empty call (no tokens, no output rows) that fails instead of returning 0;
- in_dim 0 (left open: refusing and writing zeros both pass) met by a division by in_dim: a crash;
- byte counts multiplied without an overflow check on calls with nothing to compute (out_dim 0, no
  tokens): left open, as Metal's own checks wrap there: refusing and returning 0 both pass;
- an empty routed call that returns before checking the experts' weight range;
- F16 weights at an odd offset read from their low byte alone (left open: refusing passes too);
- a batch of 524280 tokens (65535 x 8) and an n_embd of 262140 (65535 x 4), the known-good's grid limits,
  refused one step early;
- products, partial sums, outputs, Q4_K mins and IQ2_XXS group scales held in half: finite halves in,
  values past 65504 in float32 intermediates, inf out.  Half activations (the matmul specs' documented
  contract) pass every case, these edges included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import mini_cpu_flaws
from porter.spec import load_spec
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
CC = mini_cpu_flaws.CC
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to build mini_cpu.c")
F16, Q8, Q4K = "mini_gpu_matmul_f16_tensor", "mini_gpu_matmul_q8_0_tensor", "mini_gpu_matmul_q4_k_tensor"
DOWN, GATE_UP = "mini_gpu_routed_down_q2_k_tensor", "mini_gpu_routed_gate_up_iq2_xxs_tensor"

# anchors in mini_cpu.c (each must be one place of the file)
DENSE_IN_DIM = "    if (in_dim == 0 || in_dim % block_vals != 0) return 1;"
DENSE_SIZES = ("    if (!mul_ok(n_tok, out_dim, &n_out) || !mul_ok(n_tok, in_dim, &n_in)) return 1;\n"
               "    if (!holds(out, n_out, 4) || !holds(x, n_in, 4)) return 1;")
DENSE_WEIGHTS = ("    if (!mul_ok(out_dim, row_bytes, &w_bytes)) return 1;\n"
                 "    if (!model_ok(model_map, model_size, weight_offset, w_bytes)) return 1;")
DENSE_DOT = "for (uint64_t i = 0; i < in_dim; i++) s += (MINI_CPU_DOT)(row[i] * (double)xt[i]);"
DENSE_STORE = "for (uint64_t t = 0; t < n_tok; t++) y[t * out_dim + o] = (float)acc[t];"
F16_LOAD = "static void dequant_f16_one(const uint8_t *b, double *y) { y[0] = f16_to_double(rd_u16(b)); }"
Q4K_VALUE = "y[c * 64 + s * 32 + l] = d * sc * q - dmin * mn;"
DOWN_RANGE = "    if (!model_ok(model_map, model_size, down_offset, all_bytes)) return 1;"
DOWN_DOT = "for (uint32_t i = 0; i < n_ff; i++) d += r[i] * (double)ms[i];"
DOWN_SUM = "at[o] += (double)ew[s] * d;"
GU_RANGE = "    if (!model_ok(model_map, model_size, gate_offset, all_bytes)) return 1;"
GU_DOT = "sg += rg[i] * (double)xt[i];\n                    su += ru[i] * (double)xt[i];"
GU_STORE = "u[s * n_ff + f] = (float)su;"
IQ2_DB = "const double db = d * (0.5 + (double)(aux1 >> 28)) * 0.25;"
HALF_X = {  # the documented contract: activations rounded to half, everything else float32 or wider
    F16: (DENSE_DOT, DENSE_DOT.replace("(double)xt[i]", "(double)(_Float16)xt[i]")),
    DOWN: (DOWN_DOT, DOWN_DOT.replace("(double)ms[i]", "(double)(_Float16)ms[i]")),
    GATE_UP: (GU_DOT, GU_DOT.replace("(double)xt[i]", "(double)(_Float16)xt[i]")),
}
HALF_X[Q8] = HALF_X[Q4K] = HALF_X[F16]

# name: (unit, the edit of mini_cpu.c, the check that must refuse it (None: it passes), the case that
# refuses it first: one of the new ones)
FLAWS = {
    **{f"known_good_{u}": (u, None, None, None) for u in (F16, Q8, Q4K, DOWN, GATE_UP)},
    **{f"half_activations_{u}": (u, HALF_X[u], None, None) for u in (F16, Q8, Q4K, DOWN, GATE_UP)},
    # an empty call is a success (the known-good's `n_tok == 0 || out_dim == 0` turned to `&&`)
    **{f"no_tokens_fails_{u}": (u, (DENSE_IN_DIM, "    if (n_tok == 0) return 1;\n" + DENSE_IN_DIM), "rc", "no tokens")
       for u in (F16, Q8)},
    "no_output_rows_fails": (F16, (DENSE_IN_DIM, "    if (out_dim == 0) return 1;\n" + DENSE_IN_DIM), "rc",
                             "no output rows"),
    # in_dim 0 is left open: refused (the stand-in) or computed as zeros; divided by, it is a crash
    "in_dim_0_computes_zeros": (F16, (DENSE_IN_DIM, "    if (in_dim % block_vals != 0) return 1;"), None, None),
    **{f"divides_by_in_dim_{u}": (u, (DENSE_IN_DIM, "    if (in_dim % block_vals != 0 || n_tok > UINT64_MAX / 4 / in_dim) "
                                                     "return 1;"), "crash", "in_dim 0") for u in (F16, Q8)},
    # byte counts multiplied unchecked on empty calls (Metal's checks): left open, so they pass
    **{f"x_bytes_wrap_{u}": (u, (DENSE_SIZES,
                                 "    n_out = n_tok * out_dim; n_in = n_tok * in_dim;\n"
                                 "    if (!out || !x || out->bytes < n_out * 4 || x->bytes < n_in * 4 || (n_out && !out->data)"
                                 " || (n_in && !x->data)) return 1;\n"
                                 "    if (n_tok == 0 || out_dim == 0) return 0;"),
                             None, None) for u in (F16, Q8, Q4K)},
    **{f"weight_bytes_wrap_{u}": (u, (DENSE_WEIGHTS,
                                      "    w_bytes = out_dim * row_bytes;\n"
                                      "    if (!model_ok(model_map, model_size, weight_offset, w_bytes)) return 1;\n"
                                      "    if (n_tok == 0) return 0;"),
                                  None, None) for u in (Q8, Q4K)},
    # an empty routed call returns before the experts' weight range is checked (its NULL guard dropped)
    "down_empty_skips_range": (DOWN, (DOWN_RANGE, "    if (n_tokens == 0) return 0;\n" + DOWN_RANGE), "error-return",
                               "down weights past the end of the map, no tokens"),
    "gate_up_empty_skips_range": (GATE_UP, (GU_RANGE, "    if (n_tokens == 0) return 0;\n" + GU_RANGE), "error-return",
                                  "up weights past the end of the map, no tokens"),
    # F16 weights at an odd offset: left open (refusing passes), read from the low byte alone is wrong
    "refuses_odd_offset": (F16, (DENSE_IN_DIM, "    if (weight_offset & 1) return 1;\n" + DENSE_IN_DIM), None, None),
    "odd_offset_low_byte_only": (F16, (F16_LOAD, F16_LOAD.replace("rd_u16(b)", "(((uintptr_t)b & 1) ? b[0] : rd_u16(b))")),
                                 "values", "odd byte offset"),
    # the known-good's grid limits refused one step early (`gy > 65535` -> `>=`, an idle extra block)
    **{f"grid_tokens_refused_{u}": (u, (DENSE_IN_DIM, "    if (n_tok >= 65535 * 8) return 1;\n" + DENSE_IN_DIM), "rc",
                                    "524280 tokens") for u in (F16, Q8)},
    "grid_rows_refused": (DOWN, (DOWN_RANGE, "    if (n_embd >= 65535 * 4) return 1;\n" + DOWN_RANGE), "rc",
                          "n_embd 262140"),
    # values held in half where the contract keeps float32: inf past 65504
    **{f"products_in_half_{u}": (u, (DENSE_DOT, DENSE_DOT.replace("(MINI_CPU_DOT)(row[i] * (double)xt[i])",
                                                                  "(MINI_CPU_DOT)(double)(_Float16)(row[i] * (double)xt[i])")),
                                 "values", "activations at +-8192") for u in (F16, Q8)},
    "outputs_in_half": (F16, (DENSE_STORE, DENSE_STORE.replace("(float)acc[t]", "(float)(_Float16)acc[t]")), "values",
                        "activations at +-8192"),
    "q4_k_mins_in_half": (Q4K, (Q4K_VALUE, Q4K_VALUE.replace("dmin * mn", "(double)(_Float16)(dmin * mn)")), "values",
                          "block scales near half's top"),
    "down_terms_in_half": (DOWN, (DOWN_SUM, "at[o] += (double)(_Float16)((double)ew[s] * d);"), "values",
                           "mid at +-8192"),
    "iq2_group_scales_in_half": (GATE_UP, (IQ2_DB, IQ2_DB.replace("d * (0.5 + (double)(aux1 >> 28)) * 0.25",
                                                                  "(double)(_Float16)(d * (0.5 + (double)(aux1 >> 28)) * 0.25)")),
                                 "values", "block scales near half's top"),
    "gate_up_outputs_in_half": (GATE_UP, (GU_STORE, "u[s * n_ff + f] = (float)(_Float16)su;"), "values", "x at +-8192"),
}


@pytest.fixture(scope="module")
def target():
    return load_target(REPO, "minimoe")


@pytest.fixture(scope="module")
def libs(target, tmp_path_factory):
    return mini_cpu_flaws.build(target.checkout, tmp_path_factory.mktemp("mini_cpu_matmul_flaws"), FLAWS)


@pytest.mark.parametrize("name", sorted(FLAWS))
def test_each_new_case_refuses_its_flaw_and_the_stand_in_passes(target, libs, tmp_path, name):
    unit, _, check, case = FLAWS[name]
    r = mini_cpu_flaws.run_host(target, load_spec(target, unit), libs[name], tmp_path)
    if check is None:
        assert r.ok, r.summary + "\n" + r.diagnostics
    else:
        # the first failure named is one of the new cases: the spec before them let this flaw through
        assert not r.ok and r.check == check and case in r.summary, r.summary


def test_the_open_cases_took_the_path_their_variant_takes(target, libs, tmp_path):
    """in_dim 0 and the odd offset are left open: the stand-in refuses in_dim 0 and computes the odd
    offset; its variants compute in_dim 0 (zeros) and refuse the odd offset, and all of them pass."""
    rcs = {}
    for name in ("known_good_" + F16, "in_dim_0_computes_zeros", "refuses_odd_offset"):
        r = mini_cpu_flaws.run_host(target, load_spec(target, F16), libs[name], tmp_path / name)
        assert r.ok, r.summary
        lines = r.diagnostics.splitlines()
        rcs[name] = [next(x for x in lines if key in x) for key in ("in_dim 0", "odd byte offset")]
    assert "rc=[1, 1]" in rcs["known_good_" + F16][0] and "rc=[0, 0]" in rcs["known_good_" + F16][1]
    assert "rc=[0, 0]" in rcs["in_dim_0_computes_zeros"][0]
    assert "rc=[1, 1]" in rcs["refuses_odd_offset"][1]
