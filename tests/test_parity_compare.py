"""Parity gate without a GPU: metrics, checks, specs, the child runner, and the whole
gate run against a host-memory stand-in backend (a C library built with cc) with
known reward hacks -- each must be rejected by the check meant for it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from porter.gates.parity import compare, runner
from porter.gates.parity.compare import Failure
from porter.gates.driver import Candidate, GateContext, ParityOptions

REPO = Path(__file__).resolve().parents[1]
CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to build the stand-in libraries")


# ---------------------------------------------------------------------------
# compare.py
# ---------------------------------------------------------------------------

def test_float_metrics_identical_and_scaled():
    ref = np.linspace(-2, 3, 101).astype(np.float32)
    m = compare.float_metrics(ref, ref)
    assert m["nmse"] == 0 and m["max_abs"] == 0 and m["max_err_rms"] == 0 and m["n_nonfinite"] == 0
    m = compare.float_metrics(ref * 1.01, ref)
    assert m["nmse"] == pytest.approx(1e-4, rel=1e-2)
    assert compare.tolerance_violations(m, 1e-6, None, None)
    assert not compare.tolerance_violations(m, 1e-3, None, None)


def test_float_metrics_nan_is_an_infinite_error():
    ref = np.ones(8, np.float32)
    got = ref.copy()
    got[3] = np.nan
    m = compare.float_metrics(got, ref)
    assert m["n_nonfinite"] == 1 and m["nmse"] is None and m["worst_index"] == 3
    why = compare.tolerance_violations(m, 1.0, 1.0, None)
    assert any("non-finite" in w for w in why)


def test_float_metrics_zero_reference():
    z = np.zeros(4, np.float32)
    assert compare.float_metrics(z, z)["nmse"] == 0
    assert compare.float_metrics(z + 1, z)["nmse"] is None


def test_bit_exact_tolerance():
    ref = np.array([1.0, 2.0], np.float32)
    got = np.nextafter(ref, np.float32(3))
    m = compare.float_metrics(got, ref)
    assert compare.tolerance_violations(m, None, None, 0.0)
    assert not compare.tolerance_violations(compare.float_metrics(ref, ref), None, None, 0.0)


def test_sentinel_roundtrip():
    raw = compare.sentinel_bytes(16)
    assert compare.sentinel_count(raw) == (4, 0)
    a = np.frombuffer(raw, np.uint32).copy()
    a[0] = 0
    assert compare.sentinel_count(a.tobytes()) == (3, 1)
    f = np.frombuffer(raw, np.float32)
    assert np.all(np.isnan(f))  # a NaN as float32: untouched outputs never pass a value check either


def test_byte_diff():
    assert compare.byte_diff(b"abcd", b"abcd") == (0, None)
    assert compare.byte_diff(b"abcd", b"abXY") == (2, 2)


def test_exact_and_tie_rule():
    keys = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 1.0, 0.5, 0.0]])
    ref = np.array([[1, 2], [0, 1]])
    assert compare.compare_exact(ref, ref, keys).ok
    tie = compare.compare_exact(np.array([[2, 1], [0, 1]]), ref, keys)
    assert not tie.ok and tie.tie_only and "tie order" in tie.first
    wrong = compare.compare_exact(np.array([[1, 3], [0, 1]]), ref, keys)
    assert not wrong.ok and not wrong.tie_only
    # without keys a mismatch is never excused as a tie
    assert not compare.compare_exact(np.array([[2, 1], [0, 1]]), ref, None).tie_only


def test_first_failure_follows_check_order():
    fs = [Failure("values", "a", 0, "x"), Failure("guard", "b", 0, "y"), Failure("sentinel", "c", 1, "z")]
    assert compare.first_failure(fs).check == "guard"
    with pytest.raises(ValueError):
        Failure("nonsense", "a", 0, "")


# ---------------------------------------------------------------------------
# specs
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def target():
    from porter.target import load_target

    return load_target(REPO, "minimoe")


@pytest.fixture(scope="module")
def fixture_ctx(tmp_path_factory, target):
    from porter.spec import Context

    import importlib.util

    mspec = importlib.util.spec_from_file_location("mm_fixture", target.fixture_script)
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    path = tmp_path_factory.mktemp("fixture") / "minimoe.gguf"
    mod.write_fixture(path)
    return Context(path)


def op_specs(specs: dict) -> dict:
    """The one-call specs (runtime units have scenario specs: tests/test_runtime_scenarios.py)."""
    from porter.gates.parity.scenario import is_scenario

    return {u: s for u, s in specs.items() if not is_scenario(s)}


def test_every_op_unit_has_a_valid_spec(target):
    from porter.spec import load_specs

    specs = op_specs(load_specs(target))
    ops = [u for u in target.units if u not in target.runtime_units]
    assert len(ops) == 14
    assert sorted(specs) == sorted(ops)
    for s in specs.values():
        assert any(sh.expect == "ok" for sh in s.shapes)
        assert any(sh.timed for sh in s.shapes), f"{s.unit}: no timed case for the GB/s evidence"
        assert s.reference.startswith("reference.")


def test_specs_use_real_fixture_tensors_and_odd_sizes(target):
    from porter.spec import load_specs

    specs = load_specs(target)
    for u in ("mini_gpu_matmul_q8_0_tensor", "mini_gpu_routed_gate_up_iq2_xxs_tensor",
              "mini_gpu_routed_down_q2_k_tensor", "mini_gpu_embed_rows_tensor", "mini_gpu_attention_window_tensor"):
        assert any(sh.fixture_tensors for sh in specs[u].shapes), u
    gu = specs["mini_gpu_routed_gate_up_iq2_xxs_tensor"]
    assert any("ffn_gate_exps" in t for sh in gu.shapes for t in sh.fixture_tensors)
    ntok = {sh.dims.get("n_tok", sh.dims.get("n_tokens")) for sh in specs["mini_gpu_matmul_q8_0_tensor"].shapes}
    assert {1, 3, 7} <= ntok


def test_prepare_every_spec_two_seeds(target, fixture_ctx):
    from porter.gates.parity.gate import prepare
    from porter.spec import In, InOut, load_specs

    specs = op_specs(load_specs(target))
    for unit, spec in specs.items():
        cases = prepare(spec, target.api_function(unit), fixture_ctx, [11, 22])
        assert len(cases) == len(spec.shapes)
        for c in cases:
            if c.shape.expect == "error":
                assert len(c.calls) == 1
                continue
            assert len(c.calls) == 2
            a, b = c.calls
            ins = [k for k, v in a.args.items() if isinstance(v, (In, InOut)) and v.array.size]
            assert not ins or any(not np.array_equal(a.args[k].array, b.args[k].array) for k in ins), \
                f"{unit} {c.shape.label}: the second seed must change the inputs"
            for name in spec.outputs:
                assert np.all(np.isfinite(np.asarray(a.expect[name], dtype=np.float64)))


def test_tie_cases_really_have_ties(target, fixture_ctx):
    from porter.gates.parity.gate import prepare
    from porter.spec import load_spec

    spec = load_spec(target, "mini_gpu_router_topk_tensor")
    cases = prepare(spec, target.api_function(spec.unit), fixture_ctx, [5, 6])
    tied = 0
    for c in cases:
        if not c.shape.label.startswith("ties"):
            continue
        call = c.calls[0]
        logits = call.args["logits"].array
        ids = call.expect["expert_ids"]
        for t in range(logits.shape[0]):
            chosen = logits[t][ids[t]]
            if len(set(chosen.tolist())) < len(chosen) or np.sum(logits[t] == chosen[-1]) > 1:
                tied += 1
    assert tied >= 10


def test_validate_call_rejects_wrong_bindings(target):
    from porter.spec import Call, In, Out, Shape, SpecError, load_spec, validate_call

    spec = load_spec(target, "mini_gpu_swiglu_tensor")
    fn = target.api_function(spec.unit)
    sh = Shape("x", {"n": 4})
    x = np.zeros(4, np.float32)
    good = Call(args={"out": Out("f32", (4,)), "gate": In(x), "up": In(x), "n": 4}, expect={"out": x})
    validate_call(spec, fn, sh, good)
    for args, what in [
        ({"out": Out("f32", (4,)), "gate": In(x), "n": 4}, "without an argument"),
        ({"out": Out("f32", (4,)), "gate": In(x), "up": In(x), "n": 4, "m": 1}, "not in the header"),
        ({"out": In(x), "gate": In(x), "up": In(x), "n": 4}, "got In"),
        ({"out": Out("f32", (4,)), "gate": Out("f32", (4,)), "up": In(x), "n": 4}, "got Out"),
        ({"out": Out("f32", (4,)), "gate": In(x), "up": In(x), "n": -1}, "got int"),
    ]:
        with pytest.raises(SpecError, match=what):
            validate_call(spec, fn, sh, Call(args=args, expect={"out": x}))


# ---------------------------------------------------------------------------
# the child runner: hangs, segfaults and aborts are outcomes, not harness crashes
# ---------------------------------------------------------------------------

TINY_C = r"""
#include <stdlib.h>
int ok(void) { return 7; }
int hang(void) { for (volatile int spin = 1; spin;) {} return 0; }
int segv(void) { volatile int *p = (int *)0; return *p; }
int die(void) { abort(); }
"""


@pytest.fixture(scope="module")
def tiny_lib(tmp_path_factory):
    if CC is None:
        pytest.skip("no C compiler (cc)")
    d = tmp_path_factory.mktemp("tiny")
    (d / "tiny.c").write_text(TINY_C)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(d / "libtiny.so"), str(d / "tiny.c")], check=True)
    return d / "libtiny.so"


@pytest.mark.parametrize("symbol,status,detail", [
    ("ok", "done", "completed"),
    ("hang", "timeout", "no result after"),
    ("segv", "crash", "SIGSEGV"),
    ("die", "crash", "SIGABRT"),
])
def test_runner_contains_the_child(tmp_path, tiny_lib, symbol, status, detail):
    plan = tmp_path / "plan"  # not tmp_path: it holds this test's $PORTER_HOME, which no sandbox may see
    plan.mkdir()
    (plan / "plan.json").write_text(json.dumps({"mode": "call", "library": str(tiny_lib), "symbol": symbol}))
    o = runner.run_child(plan, timeout=3)
    assert o.status == status, o
    assert detail in o.detail
    if symbol == "ok":
        assert o.results["rc"] == 7
    if status != "done":
        assert "step 'call'" in o.detail


def test_runner_reports_a_missing_interpreter(tmp_path):
    o = runner.run_child(tmp_path, timeout=3, argv=[str(tmp_path / "no-such-python")])
    assert o.status == "harness"


# ---------------------------------------------------------------------------
# available() and check() without a GPU
# ---------------------------------------------------------------------------

def test_available_says_why_not(monkeypatch):
    from porter.gates import parity

    parity.available.cache_clear()
    monkeypatch.setenv("PORTER_PARITY", "off")
    ok, why = parity.available()
    assert not ok and "PORTER_PARITY" in why
    parity.available.cache_clear()
    monkeypatch.delenv("PORTER_PARITY")
    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        ok, why = parity.available()
        assert ok is False and "cupy" in why
    parity.available.cache_clear()


def test_check_is_skipped_not_ok_without_gpu(monkeypatch, target, tmp_path):
    from porter.gates import parity

    parity.available.cache_clear()
    monkeypatch.setenv("PORTER_PARITY", "off")
    r = parity.run(Candidate.of("mini_gpu_swiglu_tensor", ""), GateContext(target, tmp_path, library=tmp_path / "lib.so"))
    assert r.skipped and not r.ok and "parity skipped" in r.summary
    parity.available.cache_clear()


def test_check_skips_units_without_spec(target, tmp_path, monkeypatch):
    from porter.gates import parity

    monkeypatch.setattr(parity, "load_spec", lambda t, u: None)  # every minimoe unit has one now
    r = parity.run(Candidate.of("mini_gpu_init", ""),
                   GateContext(target, tmp_path, library=tmp_path / "lib.so", parity=ParityOptions(mode="host")))
    assert r.skipped and "no parity spec" in r.summary


# ---------------------------------------------------------------------------
# the whole gate against a host stand-in backend and its reward hacks
# ---------------------------------------------------------------------------

FAKE_BACKEND = textwrap.dedent(r"""
    #include <math.h>
    #include <stdint.h>
    #include <stdlib.h>
    #include <string.h>
    typedef struct { void *data; uint64_t bytes; int32_t owner; } tensor;
    static const void *g_host; static uint64_t g_size; static unsigned char *g_copy;
    void *mini_cuda_stream(void) { return 0; }
    #if defined(HACK_IN_PLACE)
    /* Honest, and read in place like a CUDA backend over cudaHostRegister'ed pages: the map stays
       registered until forget, which (like cudaHostUnregister over freed pages) fails if the
       harness freed it first. */
    static unsigned char g_head[16];
    const void *mini_cuda_model_ptr(const void *map, uint64_t size, uint64_t off, uint64_t bytes) {
        if (!map || !size || off > size || bytes > size - off) return 0;
        if (g_host != map || g_size != size) {
            if (g_host) abort();  /* a second registration without forget */
            g_host = map; g_size = size; memcpy(g_head, map, size < 16 ? size : 16);
        }
        return (const unsigned char *)map + off;
    }
    void mini_cuda_forget_models(void) {
        if (g_host && memcmp(g_head, g_host, g_size < 16 ? g_size : 16) != 0) abort();
        g_host = 0; g_size = 0;
    }
    #else
    const void *mini_cuda_model_ptr(const void *map, uint64_t size, uint64_t off, uint64_t bytes) {
        if (!map || !size || off > size || bytes > size - off) return 0;
        if (g_host != map || g_size != size) {
            free(g_copy); g_copy = malloc(size); memcpy(g_copy, map, size); g_host = map; g_size = size;
        }
        return g_copy + off;
    }
    void mini_cuda_forget_models(void) { free(g_copy); g_copy = 0; g_host = 0; g_size = 0; }
    #endif

    int mini_gpu_swiglu_tensor(tensor *out, const tensor *gate, const tensor *up, uint64_t n) {
        if (!out || !gate || !up || !out->data || !gate->data || !up->data) return -1;  /* mini_gpu.h: bad arguments */
        const float *g = gate->data, *u = up->data; float *o = out->data;
        if (out->bytes < n * 4 || gate->bytes < n * 4 || up->bytes < n * 4) return -1;
    #if defined(HACK_UNTOUCHED)
        return 0;
    #elif defined(HACK_RC)
        return -1;
    #elif defined(HACK_SEGV)
        *(volatile int *)(uintptr_t)8 = 1;
    #elif defined(HACK_HANG)
        for (volatile int spin = 1; spin;) {}
    #elif defined(HACK_ALIAS)
        out->data = gate->data; o = out->data;
    #elif defined(HACK_CACHE)
        static void *key; static float *cached; static uint64_t cached_n;
        if (key == out->data && cached_n == n) { memcpy(o, cached, n * 4); return 0; }
    #endif
        for (uint64_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    #if defined(HACK_OVERRUN)
        o[n] = 0.0f;
    #elif defined(HACK_UNDERRUN)
        o[-1] = 0.0f;
    #elif defined(HACK_CONST)
        /* only where gate holds an element: at n = 0 the same write lands past the buffer, a guard
           failure, and +1 leaves a random guard word of magnitude >= 2^24 unchanged (seen flaky) */
        if (n) ((float *)gate->data)[0] += 1.0f;
    #elif defined(HACK_SKIP_TAIL)
        if (n > 4) for (uint64_t i = n - 3; i < n; i++) o[i] = 0.0f;
    #elif defined(HACK_CACHE)
        free(cached); cached = malloc(n * 4); memcpy(cached, o, n * 4); key = out->data; cached_n = n;
    #endif
        return 0;
    }

    static float f16(uint16_t h) {
        uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023; float v;
        if (e == 0) v = ldexpf((float)m, -24);
        else if (e == 31) v = m ? NAN : INFINITY;
        else v = ldexpf((float)(m | 1024), (int)e - 25);
        return s ? -v : v;
    }

    int mini_gpu_matmul_q8_0_tensor(tensor *out, const void *map, uint64_t size, uint64_t off, uint64_t in_dim,
                                    uint64_t out_dim, const tensor *x, uint64_t n_tok) {
        if (in_dim == 0 || in_dim % 32) return -1;
        if (!out || !x || !out->data || !x->data) return -1;
        if (out->bytes < n_tok * out_dim * 4 || x->bytes < n_tok * in_dim * 4) return -1;
        const uint64_t rb = in_dim / 32 * 34;
        const unsigned char *w = mini_cuda_model_ptr(map, size, off, out_dim * rb);
        if (!w) return -1;
        const float *xv = x->data; float *o = out->data;
        for (uint64_t t = 0; t < n_tok; t++)
            for (uint64_t r = 0; r < out_dim; r++) {
                double acc = 0; const unsigned char *row = w + r * rb;
                uint64_t nb = in_dim / 32;
    #ifdef HACK_FIRST_BLOCK
                nb = 1;
    #endif
                for (uint64_t b = 0; b < nb; b++) {
                    uint16_t hd; memcpy(&hd, row + b * 34, 2); float d = f16(hd);
                    const int8_t *q = (const int8_t *)(row + b * 34 + 2);
                    for (int j = 0; j < 32; j++) acc += (double)(d * q[j]) * xv[t * in_dim + b * 32 + j];
                }
                o[t * out_dim + r] = (float)acc;
            }
    #ifdef HACK_MODEL
        ((unsigned char *)w)[2] ^= 0x55;
    #endif
        return 0;
    }

    int mini_gpu_router_topk_tensor(tensor *ids, tensor *weights, const tensor *logits, uint32_t n_expert,
                                    uint32_t n_tokens, uint32_t top_k) {
        if (top_k == 0 || top_k > n_expert || n_expert > 256) return -1;
        if (!ids || !weights || !logits || !ids->data || !weights->data || !logits->data) return -1;
        if (ids->bytes < (uint64_t)n_tokens * top_k * 4 || weights->bytes < (uint64_t)n_tokens * top_k * 4 ||
            logits->bytes < (uint64_t)n_tokens * n_expert * 4) return -1;
        for (uint32_t t = 0; t < n_tokens; t++) {
            const float *l = (const float *)logits->data + (uint64_t)t * n_expert;
            float p[256], mx = l[0], sum = 0, chosen = 0; int taken[256] = {0};
            for (uint32_t e = 1; e < n_expert; e++) mx = l[e] > mx ? l[e] : mx;
            for (uint32_t e = 0; e < n_expert; e++) { p[e] = expf(l[e] - mx); sum += p[e]; }
            for (uint32_t e = 0; e < n_expert; e++) p[e] /= sum;
            int32_t *id = (int32_t *)ids->data + (uint64_t)t * top_k;
            float *w = (float *)weights->data + (uint64_t)t * top_k;
            for (uint32_t k = 0; k < top_k; k++) {
                int best = -1;
                for (uint32_t e = 0; e < n_expert; e++) {
                    if (taken[e]) continue;
    #ifdef HACK_TIE_HIGH
                    if (best < 0 || p[e] >= p[best]) best = (int)e;
    #else
                    if (best < 0 || p[e] > p[best]) best = (int)e;
    #endif
                }
                taken[best] = 1; id[k] = best; w[k] = p[best]; chosen += p[best];
            }
            for (uint32_t k = 0; k < top_k; k++) w[k] /= chosen;
        }
        return 0;
    }

    int mini_gpu_embed_rows_tensor(tensor *out, const tensor *tokens, const void *map, uint64_t size,
                                   uint64_t off, uint32_t n_vocab, uint32_t n_embd, uint32_t n_tokens) {
        if (!out || !tokens || !out->data || !tokens->data) return -1;
        if (out->bytes < (uint64_t)n_tokens * n_embd * 4 || tokens->bytes < (uint64_t)n_tokens * 4) return -1;
        const uint16_t *tab = mini_cuda_model_ptr(map, size, off, (uint64_t)n_vocab * n_embd * 2);
        if (!tab) return -1;
        const int32_t *tk = tokens->data; float *o = out->data;
        for (uint32_t t = 0; t < n_tokens; t++) {
            int32_t id = tk[t];
    #ifdef HACK_CLAMP
            if (id < 0) id = 0;
            if ((uint32_t)id >= n_vocab) id = (int32_t)n_vocab - 1;
    #else
            if (id < 0 || (uint32_t)id >= n_vocab) return -1;
    #endif
            for (uint32_t i = 0; i < n_embd; i++) o[(uint64_t)t * n_embd + i] = f16(tab[(uint64_t)id * n_embd + i]);
        }
        return 0;
    }
""")

# (hack, unit, the check that must reject it); None = the honest build, which must pass
HOST_CASES = [
    (None, "mini_gpu_swiglu_tensor", None),
    (None, "mini_gpu_matmul_q8_0_tensor", None),
    (None, "mini_gpu_router_topk_tensor", None),
    (None, "mini_gpu_embed_rows_tensor", None),
    # honest backends that read the host map in place: the harness keeps each map alive until forget
    ("IN_PLACE", "mini_gpu_matmul_q8_0_tensor", None),
    ("IN_PLACE", "mini_gpu_embed_rows_tensor", None),
    ("UNTOUCHED", "mini_gpu_swiglu_tensor", "sentinel"),
    ("RC", "mini_gpu_swiglu_tensor", "rc"),
    ("SEGV", "mini_gpu_swiglu_tensor", "crash"),
    ("HANG", "mini_gpu_swiglu_tensor", "timeout"),
    ("ALIAS", "mini_gpu_swiglu_tensor", "struct"),
    ("CACHE", "mini_gpu_swiglu_tensor", "repeat"),
    ("OVERRUN", "mini_gpu_swiglu_tensor", "guard"),
    ("UNDERRUN", "mini_gpu_swiglu_tensor", "guard"),
    ("CONST", "mini_gpu_swiglu_tensor", "const"),
    ("SKIP_TAIL", "mini_gpu_swiglu_tensor", "values"),
    ("FIRST_BLOCK", "mini_gpu_matmul_q8_0_tensor", "values"),
    ("MODEL", "mini_gpu_matmul_q8_0_tensor", "const"),
    ("TIE_HIGH", "mini_gpu_router_topk_tensor", "tie-rule"),
    ("CLAMP", "mini_gpu_embed_rows_tensor", "error-return"),
]


@pytest.fixture(scope="module")
def fake_libs(tmp_path_factory):
    if CC is None:
        pytest.skip("no C compiler (cc)")
    d = tmp_path_factory.mktemp("fake")
    src = d / "fake_backend.c"
    src.write_text(FAKE_BACKEND)
    libs = {}
    for hack in sorted({h for h, _, _ in HOST_CASES}, key=str):
        out = d / f"lib_{hack or 'good'}.so"
        flags = [f"-DHACK_{hack}"] if hack else []
        subprocess.run([CC, "-O1", "-shared", "-fPIC", *flags, "-o", str(out), str(src), "-lm"], check=True)
        libs[hack] = out
    return libs


@needs_cc
@pytest.mark.parametrize("hack,unit,check", HOST_CASES, ids=[f"{u.replace('mini_gpu_', '')}-{h or 'honest'}"
                                                               for h, u, _ in HOST_CASES])
def test_host_gate_rejects_each_hack_by_its_check(target, fixture_ctx, fake_libs, tmp_path, hack, unit, check):
    from porter.gates.parity.gate import run_spec
    from porter.spec import load_spec

    spec = load_spec(target, unit)
    r = run_spec(target, spec, fake_libs[hack], workspace=tmp_path, mode="host", ctx=fixture_ctx,
                 timeout=6 if hack == "HANG" else 60, timing_reps=2)
    assert not r.skipped, r.summary
    if check is None:
        assert r.ok, r.summary + "\n" + r.diagnostics
        ev = r.evidence
        assert len(ev["seeds"]) == 2 and ev["seeds"][0] != ev["seeds"][1]
        assert ev["gate"] == "parity" and ev["unit"] == unit and ev["spec"]["reference"] == spec.reference
        assert ev["timing"] and ev["timing"]["median_ms"] > 0
        # the seeds are evidence, never prompt material
        assert not any(s in r.diagnostics or s in r.summary for s in ev["seeds"])
        json.dumps(ev, allow_nan=False)  # canonical JSON: no NaN anywhere
    else:
        assert not r.ok
        assert r.summary.startswith(f"parity failed [{check}]"), r.summary
        assert check in r.evidence["checks"]["failed"]


def test_evaluate_names_stream_failures(target):
    """The stream probe's observations (GPU only) turn into the 'stream' check."""
    from porter.gates.parity.gate import PreparedCase, evaluate
    from porter.spec import Call, In, Out, Shape, load_spec

    spec = load_spec(target, "mini_gpu_swiglu_tensor")
    x = np.ones(4, np.float32)
    ref = np.asarray(x * (1 / (1 + np.exp(-1.0))), np.float32)
    call = Call(args={"out": Out("f32", (4,)), "gate": In(x), "up": In(x), "n": 4}, expect={"out": ref})
    case = PreparedCase("c0", Shape("n=4", {"n": 4}), [call, call], [1, 2])
    outputs = {f"c0.{p}.out": np.frombuffer(ref.tobytes(), np.uint8) for p in (0, 1)}
    base = {"rc": 0, "struct_changed": [], "guard_damage": [], "const_changed": [], "settle_changed": []}
    results = {"cases": [{"id": "c0", "passes": [dict(base, **{"pass": 0, "probe": {"status": "changed",
                                                                                      "changed": ["out"]}}),
                                                  dict(base, **{"pass": 1, "settle_changed": ["out"]})]}]}
    fails, _ = evaluate(spec, [case], results, outputs)
    assert [f.check for f in fails] == ["stream", "stream"]
    # the texts name the stream the target declares ([cuda] stream), never another target's
    fails, _ = evaluate(spec, [case], results, outputs, stream="the legacy default stream (0)")
    assert all("the legacy default stream (0)" in f.detail and "mini_cuda_stream" not in f.detail for f in fails), fails
    results["cases"][0]["passes"][0]["probe"] = {"status": "clean", "changed": []}
    results["cases"][0]["passes"][1]["settle_changed"] = []
    assert evaluate(spec, [case], results, outputs)[0] == []


# ---------------------------------------------------------------------------
# the adversarial corpus and calibration bookkeeping
# ---------------------------------------------------------------------------

def test_adversarial_manifest_is_complete(target):
    from porter.gates.mutants import adversarial
    from porter.target.cparse import function_definitions

    muts = adversarial(target)
    assert len(muts) >= 20
    checks = {m.must_fail_check for m in muts}
    # every reward hack of DESIGN.md has a mutant aimed at the check that catches it
    assert {"sentinel", "struct", "repeat", "values", "guard", "stream", "const", "tie-rule", "error-return",
            "timeout", "crash", "cuda-error", "rc"} <= checks
    for m in muts:
        defs = [d for d in function_definitions(m.source) if d.name == m.unit]
        assert len(defs) == 1 and defs[0].extern_c, m.name
        assert m.source.lstrip().startswith(("//", "#include")), m.name


def test_calibration_status_from_ledger(tmp_path, target):
    from porter.spec import load_spec
    from porter.records.history import History
    from porter.records.ledger import Ledger

    def calibration_status():
        return History.read(tmp_path, "minimoe").calibration_status(spec.unit, spec.sha256)

    spec = load_spec(target, "mini_gpu_add_tensor")
    assert calibration_status()["calibrated"] is False
    Ledger(tmp_path).append("calibration", target="minimoe", unit=spec.unit, ok=True, spec_sha256="0" * 64)
    st = calibration_status()
    assert not st["calibrated"] and "changed" in st["reason"]
    Ledger(tmp_path).append("calibration", target="minimoe", unit=spec.unit, ok=True, spec_sha256=spec.sha256,
                            known_good="scripted", mutants=3, mutants_rejected=3)
    st = calibration_status()
    assert st["calibrated"] and st["mutants_rejected"] == 3


def test_calibration_tables_render():
    from porter.calibration.calibrator import matrix, table

    rows = [
        {"unit": "mini_gpu_add_tensor", "kind": "known-good", "name": "scripted", "expect": "pass", "got": "pass",
         "ok": True},
        {"unit": "mini_gpu_add_tensor", "kind": "adversarial", "name": "add_guard_before.cu", "expect": "guard",
         "got": "guard", "ok": True},
        {"unit": "mini_gpu_add_tensor", "kind": "adversarial", "name": "add_x.cu", "expect": "stream",
         "got": "values", "ok": False},
    ]
    rep = {"rows": rows}
    t = table(rep)
    assert "add_guard_before.cu" in t and "WRONG" in t
    m = matrix(rep)
    assert "guard" in m and "1!" in m
