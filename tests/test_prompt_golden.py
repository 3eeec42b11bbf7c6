"""The prompt: golden renderings for two minimoe units, and the properties the
goldens cannot show on their own (block layouts decode like gguf-py, seeds never
reach the prompt, the cut order of the size budget, style examples are committed
non-placeholder units, `porter prompt` prints what would be sent).

Regenerate the goldens after an intended change:

    PORTER_UPDATE_GOLDEN=1 python -m pytest tests/test_prompt_golden.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from porter.cli import main as porter_main
from porter.prompt import build_prompt, render_prompt
from porter.diagnostics import trim_diagnostics
from porter.prompt.context import strip_seeds
from porter.prompt.quant_layouts import layout_text, quant_types_from_text
from porter.providers.base import PromptRequest
from porter.target import load_target
from porter.workspace import init_workspace

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("PORTER_UPDATE_GOLDEN") == "1"

# A committed, ported unit the style-example picker may show (a real port, not a placeholder).
EXAMPLE_ADD = """#include "mini_cuda.cuh"

static __global__ void add_kernel(float *out, const float *a, const float *b, uint64_t n) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

extern "C" int mini_gpu_add_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *a, const mini_gpu_tensor *b,
                                   uint64_t n) {
    if (!out || !a || !b) return -1;
    const uint64_t need = n * sizeof(float);
    if (out->bytes < need || a->bytes < need || b->bytes < need) return -1;
    if (n == 0) return 0;
    uint64_t blocks = (n + 255) / 256;
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;
    add_kernel<<<(unsigned)blocks, 256, 0, mini_cuda_stream()>>>((float *)out->data, (const float *)a->data,
                                                                (const float *)b->data, n);
    return MINI_CUDA_LAUNCH_OK("add_kernel") ? 0 : -1;
}
"""

EXAMPLE_BYTES = """#include "mini_cuda.cuh"

extern "C" uint64_t mini_gpu_tensor_bytes(const mini_gpu_tensor *tensor) {
    return tensor ? tensor->bytes : 0;
}
"""


def _git(ws: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=ws, check=True,
                   capture_output=True)


# The known-wrong answer a CPU-only run committed as 'built' (it normalises the first row only): it
# launches a kernel and shares words with the rms_norm units, so only its state keeps it out.
WRONG_BUILT = """#include "mini_cuda.cuh"

static __global__ void rms_rows_kernel(float *out, const float *x, uint32_t n, float eps) {
    float ss = 0.0f;
    for (uint32_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const float scale = rsqrtf(ss / n + eps);
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = x[i] * scale;  // KNOWN WRONG: first row only
}

extern "C" int mini_gpu_rms_norm_plain_rows_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *x, uint32_t n,
                                                   uint32_t rows, float eps) {
    if (!out || !x) return -1;
    (void)rows;
    rms_rows_kernel<<<1, 256, 0, mini_cuda_stream()>>>((float *)out->data, (const float *)x->data, n, eps);
    return MINI_CUDA_LAUNCH_OK("rms_rows") ? 0 : -1;
}
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """Two units verified with perf judged, one committed as 'built' that is wrong, one verified but
    with perf unmeasured, and one uncommitted edit: only the first two may be examples."""
    from ws_builder import make_workspace as built_workspace

    wb = built_workspace(tmp_path_factory.mktemp("prompt") / "ws")
    wb.port("mini_gpu_add_tensor", source=EXAMPLE_ADD)
    wb.port("mini_gpu_tensor_bytes", source=EXAMPLE_BYTES)
    wb.port("mini_gpu_rms_norm_plain_rows_tensor", state="built", source=WRONG_BUILT)
    wb.port("mini_gpu_swiglu_tensor", perf=False)  # verified, perf unmeasured: not an example either
    ws = wb.root
    (ws / "targets" / "minimoe" / "ported" / "mini_gpu_rope_tail_tensor.cu").write_text(
        "// not committed: never an example\nextern \"C\" int mini_gpu_rope_tail_tensor() { return 0; }\n")
    return ws


@pytest.fixture(scope="module")
def target(workspace):
    return load_target(workspace, "minimoe")


# -- goldens -----------------------------------------------------------------------

PARITY_FAILURE = {
    "kind": "failure", "target": "minimoe", "attempt": 1, "gate": "parity",
    "summary": "out differs from the reference: max_abs 3.1e-01 (tol 1e-02) on shape n_tok=7 in_dim=256 out_dim=64",
    "diagnostics_text": "output out: max_abs 3.1e-01 max_rel 2.2e+00 nmse 4.0e-02 at [3][17]\n"
                        "shape: n_tok=7 in_dim=256 out_dim=64 (seed=424242)\n",
}
BUILD_FAILURE = {
    "kind": "failure", "target": "minimoe", "attempt": 2, "gate": "build",
    "summary": "nvcc failed (1 error)",
    "diagnostics_text": "/tmp/porter-build-x1y2/units/mini_gpu_attention_window_tensor.cu(41): error: identifier "
                        "\"sinks\" is undefined\n      float m = sinks[h];\n                ^\n\n"
                        "1 error detected in the compilation of "
                        "\"/tmp/porter-build-x1y2/units/mini_gpu_attention_window_tensor.cu\".\n",
}


def _golden(name: str, req: PromptRequest) -> None:
    text = f"=== system ===\n{req.system}\n=== prompt ===\n{req.prompt}"
    path = GOLDEN / f"{name}.txt"
    if UPDATE or not path.exists():
        if not UPDATE and os.environ.get("CI"):
            pytest.fail(f"missing golden {path}: run with PORTER_UPDATE_GOLDEN=1")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"prompt differs from {path}; if intended: PORTER_UPDATE_GOLDEN=1"


def test_golden_matmul_q8_0(target):
    unit = "mini_gpu_matmul_q8_0_tensor"
    req = build_prompt(target, unit, 2, [dict(PARITY_FAILURE, unit=unit)])
    _golden(unit, req)
    p = req.prompt
    # the signature exactly as the header has it, and the C linkage it needs
    assert "extern \"C\" int mini_gpu_matmul_q8_0_tensor(mini_gpu_tensor *out, const void *model_map" in p
    # the Q8_0 block layout, byte-exact
    assert "### Q8_0 (blocks of 32 values, 34 bytes)" in p and "value[e] = float(d) * qs[e]" in p
    assert "IQ2_XXS" not in p and "Q2_K" not in p  # only the types the unit reads
    # the Metal slice: the kernel itself and the host dispatch
    assert "kernel_mul_mv_q8_0_f32" in p
    assert "dispatchThreadgroups" in p
    # the earlier failure, without its seed
    assert "max_abs 3.1e-01" in p and "424242" not in p
    # a committed ported unit as style example (the one that launches a kernel)
    assert "add_kernel<<<" in p
    assert "#include \"mini_cuda.cuh\"" in req.system and "mini_cuda_stream()" in req.system


def test_golden_attention_window(target):
    unit = "mini_gpu_attention_window_tensor"
    req = build_prompt(target, unit, 3, [dict(PARITY_FAILURE, unit=unit), dict(BUILD_FAILURE, unit=unit)])
    _golden(unit, req)
    p = req.prompt
    assert "kernel_attn_window_f32" in p
    assert "The sink takes probability mass but contributes no value." in p  # the doc comment
    assert "error: identifier \"sinks\" is undefined" in p
    assert "/tmp/porter-build" not in p  # paths shortened to file names
    assert "424242" not in p
    assert "Block layouts" not in p  # reads no quantized weights


# -- block layouts -------------------------------------------------------------------

def _halves(u8: np.ndarray) -> np.ndarray:
    return u8.view("<f2").astype(np.float32)


def _decode_as_described(qtype: str, block: np.ndarray, tables=None) -> np.ndarray:
    """A literal transcription of the decode rules printed in the prompt."""
    b = block.astype(np.uint8)
    if qtype == "Q8_0":
        d = _halves(b[0:2])[0]
        return d * b[2:34].view(np.int8).astype(np.float32)
    if qtype == "Q4_K":
        d, dmin = _halves(b[0:4])
        scales, qs = b[4:16].astype(int), b[16:144].astype(int)
        sc, m = [0] * 8, [0] * 8
        for j in range(8):
            if j < 4:
                sc[j], m[j] = scales[j] & 63, scales[j + 4] & 63
            else:
                sc[j] = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4)
                m[j] = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4)
        out = np.zeros(256, np.float32)
        for e in range(256):
            c, r = e // 64, e % 64
            j, l = 2 * c + (r >= 32), r % 32
            q = (qs[32 * c + l] & 0x0F) if r < 32 else (qs[32 * c + l] >> 4)
            out[e] = d * sc[j] * q - dmin * m[j]
        return out
    if qtype == "Q2_K":
        scales, qs = b[0:16].astype(int), b[16:80].astype(int)
        d, dmin = _halves(b[80:84])
        out = np.zeros(256, np.float32)
        for e in range(256):
            h, r = e // 128, e % 128
            s, t = r // 32, r % 32
            g, l = t // 16, t % 16
            q = (qs[32 * h + 16 * g + l] >> (2 * s)) & 3
            k = 8 * h + 2 * s + g
            out[e] = d * (scales[k] & 0x0F) * q - dmin * (scales[k] >> 4)
        return out
    if qtype == "IQ2_XXS":
        grid, signs = tables
        d = _halves(b[0:2])[0]
        qs = b[2:66]
        out = np.zeros(256, np.float32)
        for ib in range(8):
            a0 = int.from_bytes(bytes(qs[8 * ib : 8 * ib + 4]), "little")
            a1 = int.from_bytes(bytes(qs[8 * ib + 4 : 8 * ib + 8]), "little")
            db = d * (0.5 + (a1 >> 28)) * 0.25
            for l in range(4):
                g = grid[(a0 >> (8 * l)) & 0xFF]
                sg = signs[(a1 >> (7 * l)) & 127]
                for j in range(8):
                    out[32 * ib + 8 * l + j] = db * ((g >> (8 * j)) & 0xFF) * (-1 if (sg >> j) & 1 else 1)
        return out
    raise AssertionError(qtype)


def _tables_from_text(text: str):
    grid_txt = text[text.index("iq2xxs_grid[256]"): text.index("iq2xxs_signs[128]")]
    signs_txt = text[text.index("iq2xxs_signs[128]"):]
    grid = [int(x, 16) for x in re.findall(r"0x([0-9a-f]{16})ULL", grid_txt)]
    signs = [int(x, 16) for x in re.findall(r"0x([0-9a-f]{2})\b", signs_txt.split("};")[0])]
    assert len(grid) == 256 and len(signs) == 128
    return grid, signs


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q2_K", "IQ2_XXS"])
def test_quant_layout_descriptions_decode_like_gguf(qtype):
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    qt = GGMLQuantizationType[qtype]
    qk, bb = GGML_QUANT_SIZES[qt]
    text = layout_text(qtype)
    assert f"{bb} bytes" in text and f"sizeof == {bb}" in text
    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, size=(4, bb), dtype=np.uint8)
    # keep the half-precision scales finite and modest
    half_at = {"Q8_0": [0], "Q4_K": [0, 2], "Q2_K": [80, 82], "IQ2_XXS": [0]}[qtype]
    for off in half_at:
        blocks[:, off : off + 2] = np.frombuffer(np.float16(rng.uniform(0.01, 2.0, 4)).tobytes(), np.uint8).reshape(4, 2)
    tables = _tables_from_text(text) if qtype == "IQ2_XXS" else None
    want = dequantize(blocks.reshape(-1), qt).reshape(4, qk)
    got = np.stack([_decode_as_described(qtype, blk, tables) for blk in blocks])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_quant_types_from_unit_names_and_docs():
    assert quant_types_from_text("mini_gpu_matmul_q8_0_tensor") == ["Q8_0"]
    assert quant_types_from_text("mini_gpu_routed_gate_up_iq2_xxs_tensor") == ["IQ2_XXS"]
    assert quant_types_from_text("mini_gpu_routed_down_q2_k_tensor") == ["Q2_K"]
    assert quant_types_from_text("ds4_gpu_matmul_q4_k") == ["Q4_K"]
    assert quant_types_from_text("the token-embedding table, F16 rows") == ["F16"]
    assert quant_types_from_text("mini_gpu_swiglu_tensor") == []


def test_each_unit_gets_the_layouts_it_reads(target):
    want = {"mini_gpu_matmul_q8_0_tensor": ["Q8_0"], "mini_gpu_matmul_f16_tensor": ["F16"],
            "mini_gpu_matmul_q4_k_tensor": ["Q4_K"], "mini_gpu_embed_rows_tensor": ["F16"],
            "mini_gpu_routed_gate_up_iq2_xxs_tensor": ["IQ2_XXS"], "mini_gpu_routed_down_q2_k_tensor": ["Q2_K"]}
    for unit, types in want.items():
        r = render_prompt(target, unit, 1, [])
        assert [q for q in r.quant_types if q != "F32"] == types, unit
    iq2 = render_prompt(target, "mini_gpu_routed_gate_up_iq2_xxs_tensor", 1, []).request.prompt
    assert "static __constant__ uint64_t iq2xxs_grid[256]" in iq2 and "0x0808080808080808ULL" in iq2


# -- seeds ------------------------------------------------------------------------------

SEED_FORMS = [
    "seed=918273",
    "seeds: [918273, 5550111]",
    '{"seed": 918273, "max_abs": 0.5}',
    "run with seed 918273",
    "rng_seed = 918273",
    "'seeds': (918273, 5550111)",
    "Seeds 918273 and 5550111 both failed",
    "seed 00c0ffee918273ab",
    '{"seeds": ["00c0ffee918273ab", "5550111f00d00000"]}',
]


@pytest.mark.parametrize("form", SEED_FORMS)
def test_strip_seeds(form):
    out = strip_seeds(form)
    assert "918273" not in out and "5550111" not in out
    assert "withheld" in out or "seed" not in out.lower()


def test_verify_seeds_never_reach_the_prompt(target):
    diag = {"outputs": {"out": {"max_abs": 0.75, "shape": [7, 64]}}, "seeds": [918273, 5550111],
            "inputs": {"x": {"seed": 918273}}}
    failures = [
        {"attempt": 1, "gate": "parity", "summary": "mismatch at seed 918273", "diagnostics_text": json.dumps(diag)},
        {"attempt": 2, "gate": "parity", "summary": "mismatch", "diagnostics_text": "\n".join(SEED_FORMS)},
        {"attempt": 3, "gate": "parity", "summary": "mismatch (seed=5550111)", "diagnostics": {"seed": 918273,
                                                                                              "max_abs": 1.5}},
    ]
    r = render_prompt(target, "mini_gpu_swiglu_tensor", 4, failures)
    text = r.request.system + r.request.prompt + json.dumps(r.request.meta)
    assert "918273" not in text and "5550111" not in text
    assert "max_abs" in text and "0.75" in text  # the rest of the diagnostics is kept


def test_diagnostics_by_sha_are_read_from_runs(target, workspace):
    d = workspace / "runs" / "diagnostics"
    d.mkdir(parents=True, exist_ok=True)
    sha = "ab" * 32
    (d / f"{sha}.txt").write_text("output out: max_abs 9.5 (seed=777888999)\n")
    r = render_prompt(target, "mini_gpu_swiglu_tensor", 2, [{"attempt": 1, "gate": "parity", "summary": "x",
                                                             "diagnostics": sha}])
    assert "max_abs 9.5" in r.request.prompt and "777888999" not in r.request.prompt


def test_build_diagnostics_keep_the_errors():
    text = "\n".join([f"/abs/build/dir/u.cu({i}): warning #177-D: variable declared but never referenced"
                      for i in range(3)] + ["noise line"] * 50 + ["/abs/build/dir/u.cu(90): error: expected a \";\""])
    out = trim_diagnostics(text, 4000, compiler=True)
    assert out.startswith('u.cu(90): error: expected a ";"')
    assert "/abs/build" not in out and "noise line" not in out and "warning #177-D" in out


# -- size budget -----------------------------------------------------------------------

def _many_failures(n: int, unit: str = "mini_gpu_swiglu_tensor") -> list[dict]:
    return [{"attempt": i + 1, "gate": "build", "summary": f"nvcc failed on attempt {i + 1}",
             "diagnostics_text": "\n".join(f"{unit}.cu({k}): error: problem {k} of attempt {i + 1}"
                                                   for k in range(60))}
            for i in range(n)]


def test_cut_order_examples_then_older_failures(target):
    unit = "mini_gpu_swiglu_tensor"
    full = render_prompt(target, unit, 7, _many_failures(6), max_chars=10**6)
    assert full.cut == [] and "add_kernel<<<" in full.request.prompt
    # a budget just under the full size: the example goes first, nothing else
    r = render_prompt(target, unit, 7, _many_failures(6), max_chars=len(full.request.prompt) - 100)
    assert r.cut and r.cut[0].startswith("style example")
    assert all(c.startswith("style example") for c in r.cut)
    assert "add_kernel<<<" not in r.request.prompt
    assert "## Cut to fit the prompt size budget" in r.request.prompt
    # tighter: older failures go next; the latest failure's diagnostics survive longest
    r = render_prompt(target, unit, 7, _many_failures(6), max_chars=9000)
    kinds = [c.split(" ")[0] for c in r.cut]
    assert kinds.index("diagnostics") > kinds.index("style")
    assert "problem 0 of attempt 6" in r.request.prompt
    assert "problem 0 of attempt 4" not in r.request.prompt
    # never cut: the rules, the signature, the conventions
    for req in (r.request, full.request):
        assert "extern \"C\" int mini_gpu_swiglu_tensor(mini_gpu_tensor *out" in req.prompt
        assert "struct mini_gpu_tensor {" in req.prompt
        assert "No caching between calls" in req.system
    assert len(r.request.prompt) <= 9000


def test_impossible_budget_keeps_the_essentials(target):
    r = render_prompt(target, "mini_gpu_routed_gate_up_iq2_xxs_tensor", 1, _many_failures(2, "mini_gpu_routed_gate_up_iq2_xxs_tensor"),
                      max_chars=2000)
    p = r.request.prompt
    assert "still" in r.cut[-1] and "over" in r.cut[-1]
    assert "extern \"C\" int mini_gpu_routed_gate_up_iq2_xxs_tensor(" in p
    assert "iq2xxs_grid[256]" in p  # block layouts are never cut


# -- style examples -------------------------------------------------------------------------

def test_style_examples_are_verified_units_and_say_so(target):
    p = render_prompt(target, "mini_gpu_rms_norm_weight_rows_tensor", 1, []).request.prompt
    assert "### mini_gpu_add_tensor (verified: parity and perf passed)" in p
    assert "KNOWN WRONG" not in p and "mini_gpu_rms_norm_plain_rows_tensor (" not in p  # built: never shown
    assert "mini_gpu_swiglu_tensor (" not in p  # verified without perf: not shown either
    assert "not committed: never an example" not in p
    assert "porter:placeholder" not in p
    assert "(committed)" not in p  # every example says its state
    # a unit is never its own example
    p = render_prompt(target, "mini_gpu_add_tensor", 1, []).request.prompt
    assert "### mini_gpu_add_tensor (" not in p


def test_a_verified_unit_edited_since_is_no_example(target, workspace):
    """Stale (the file changed after its evidence): what the prompt would show is not what was judged."""
    from porter.prompt.context import style_examples

    path = workspace / "targets" / "minimoe" / "ported" / "mini_gpu_add_tensor.cu"
    path.write_text(EXAMPLE_ADD.replace("a[i] + b[i]", "a[i] - b[i]"))
    _git(workspace, "commit", "-q", "-am", "hand edit")
    try:
        shown, _ = style_examples(target, "mini_gpu_rms_norm_weight_rows_tensor")
        assert not any(s.title.startswith("mini_gpu_add_tensor") for s in shown)
    finally:
        path.write_text(EXAMPLE_ADD)
        _git(workspace, "commit", "-q", "-am", "hand edit undone")


def test_missing_context_is_said(target, monkeypatch):
    import porter.prompt.context as ctx_mod

    monkeypatch.setattr(ctx_mod, "metal_context",
                        lambda t, u, ctx: ctx.missing.append("the Metal kernel source slice is not available"))
    p = render_prompt(target, "mini_gpu_swiglu_tensor", 1, []).request.prompt
    assert "## Context porter could not provide" in p and "slice is not available" in p


# -- porter prompt ------------------------------------------------------------------------------

def test_porter_prompt_cli(workspace, capsys):
    rc = porter_main(["-C", str(workspace), "prompt", "mini_gpu_matmul_q8_0_tensor", "--target", "minimoe", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["unit"] == "mini_gpu_matmul_q8_0_tensor" and out["attempt"] == 1
    assert "Q8_0" in out["meta"]["quant_types"]
    assert "### Q8_0" in out["prompt"] and "Rules" in out["system"]
    rc = porter_main(["-C", str(workspace), "prompt", "mini_gpu_swiglu_tensor", "--target", "minimoe"])
    text = capsys.readouterr().out
    assert rc == 0 and text.startswith("=== system ===") and "=== prompt ===" in text
    rc = porter_main(["-C", str(workspace), "prompt", "mini_gpu_nope", "--target", "minimoe"])
    assert rc == 2 and "unknown unit" in capsys.readouterr().err


def test_porter_prompt_takes_failures_from_the_ledger(tmp_path, capsys):
    from porter.records.ledger import Ledger

    ws = init_workspace(tmp_path / "ws", ["minimoe"])
    led = Ledger(ws)
    unit = "mini_gpu_swiglu_tensor"
    led.append("attempt", target="minimoe", unit=unit, attempt=1, run="r1", provider="scripted", model="m",
               prompt_sha256="0" * 64, response_sha256="0" * 64, candidate_sha256=None, usage={})
    (ws / "runs" / "diagnostics").mkdir(parents=True, exist_ok=True)
    (ws / "runs" / "diagnostics" / ("cd" * 32 + ".txt")).write_text("error: swiglu_kernel undefined (seed=31337)\n")
    led.append("failure", target="minimoe", unit=unit, attempt=1, gate="build", summary="nvcc failed",
               diagnostics="cd" * 32)
    rc = porter_main(["-C", str(ws), "prompt", unit, "--target", "minimoe", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["attempt"] == 2
    assert "swiglu_kernel undefined" in out["prompt"] and "31337" not in out["prompt"]
