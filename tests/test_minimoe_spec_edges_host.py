"""minimoe's spec cases added for mutation-testing survivors, each shown refusing the flaw it exists for.

Host mode: targets/minimoe/mini_cpu.c (a complete CPU backend of mini_gpu.h) stands in for the known-good,
and a one-line edit of it for the flaw.  The CUDA mutants these cases answer (targets/minimoe/mutation.json)
need a GPU; the flaw classes do not:

- attention_window's sink read one byte early (`p[0]` -> `p[-1]` in the byte loader): with sinks far below
  the scores the max washes a sink's low bits out; level with scores shifted to +200 they move the output
  past NMSE 1e-7 (simulated on 300 draws: 96% of single draws, and the spec draws two seeds);
- attention_window with no tokens: the Metal backend returns 0 once its arguments hold (n_q == 0);
- attention_window with a head_dim past both backends' limits, which the header leaves open: refused, or
  computed right, and a backend that computes it wrong is refused (expect="either");
- embed_rows: a bad id at the batch's first position (a check loop that starts one token late), and a row
  wider than one block's 256 threads (a stride loop that stops after one stride).
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
ATTN, EMBED = "mini_gpu_attention_window_tensor", "mini_gpu_embed_rows_tensor"

# name: (unit, the edit of mini_cpu.c, the check that must refuse it (None: the stand-in itself, which passes),
# the case that refuses it first: one of the new ones)
FLAWS = {
    "known_good_attention": (ATTN, None, None, None),
    "known_good_embed": (EMBED, None, None, None),
    "sink_low_byte_read_early": (ATTN, (
        "memcpy(&sink_f, (const uint8_t *)model_map + sinks_offset + 4 * (uint64_t)h, 4);",
        "memcpy(&sink_f, (const uint8_t *)model_map + sinks_offset + 4 * (uint64_t)h, 4);"
        " memcpy(&sink_f, (const uint8_t *)model_map + sinks_offset + 4 * (uint64_t)h - 1, 1);"), "values", "sinks at the scores' scale"),
    "no_tokens_is_a_failure": (ATTN, ("    if (head_dim == 0) return 0;",
                                      "    if (n_tokens == 0) return 1;\n    if (head_dim == 0) return 0;"), "rc", "no tokens at pos0 5"),
    # head_dim past every backend's limit, which mini_gpu.h leaves open (expect="either"): refusing it is
    # right, so is computing it (the stand-in itself); computing it on the first 256 dims only is not
    "refuses_head_dim_past_256": (ATTN, ("    if (head_dim == 0) return 0;",
                                         "    if (head_dim > 256) return 1;\n    if (head_dim == 0) return 0;"),
                                  None, None),
    "dot_over_256_dims_at_most": (ATTN, (
        "for (uint32_t i = 0; i < head_dim; i++) d += (MINI_CPU_DOT)((double)qh[i] * (double)kj[i]);",
        "for (uint32_t i = 0; i < (head_dim < 256 ? head_dim : 256); i++) d += (MINI_CPU_DOT)((double)qh[i] * "
        "(double)kj[i]);"), "values", "head_dim 288"),
    "first_token_unchecked": (EMBED, ("        if (tok[t] < 0 || (uint32_t)tok[t] >= n_vocab) return 1;",
                                      "        if (t > 0 && (tok[t] < 0 || (uint32_t)tok[t] >= n_vocab)) return 1;"),
                              "error-return", "at the first position"),
    "row_stops_after_256": (EMBED, ("        for (uint32_t i = 0; i < n_embd; i++) {\n            y[(uint64_t)t * n_embd",
                                    "        for (uint32_t i = 0; i < (n_embd < 256 ? n_embd : 256); i++) {\n"
                                    "            y[(uint64_t)t * n_embd"), "sentinel", "a row wider than one block"),
}


@pytest.fixture(scope="module")
def target():
    return load_target(REPO, "minimoe")


@pytest.fixture(scope="module")
def libs(target, tmp_path_factory):
    return mini_cpu_flaws.build(target.checkout, tmp_path_factory.mktemp("mini_cpu_flaws"), FLAWS)


@pytest.mark.parametrize("name", sorted(FLAWS))
def test_each_new_case_refuses_its_flaw_and_the_stand_in_passes(target, libs, tmp_path, name):
    unit, _, check, case = FLAWS[name]
    r = mini_cpu_flaws.run_host(target, load_spec(target, unit), libs[name], tmp_path)
    if check is None:
        assert r.ok, r.summary + "\n" + r.diagnostics
        if unit == ATTN:  # the open case took the path its variant takes: computed (rc 0) or refused
            line = next(x for x in r.diagnostics.splitlines() if "head_dim 288" in x)
            assert ("rc=[1, 1]" if name.startswith("refuses") else "rc=[0, 0]") in line, line
    else:
        # the first failure named is one of the new cases: the spec before them let this flaw through
        assert not r.ok and r.check == check and case in r.summary, r.summary
