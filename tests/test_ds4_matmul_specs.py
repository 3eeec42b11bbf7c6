"""The ds4 matmul/MoE parity specs without a GPU: load, validate, build, cover.

* every spec loads, validates against ds4_gpu.h and builds its inputs and
  references for two seeds (host only; the ds4 checkout is needed for the
  header, so these skip without it);
* every DISPATCH entry names a shape that exists (or a knob of
  KNOWN_GOOD_ENV), and every spec has a timed case at ds4's real sizes;
* the matmul/MoE mutants (porter.gates.mutants) each apply exactly once,
  two or more per unit, and all together (their search texts do not overlap);
* weights by GGUF tensor name: a tiny GGUF with ds4's real tensor names and
  types (written here with gguf-py) feeds a routed-MoE case its real bytes;
  without it the same case gets synthetic tensors of the census type.
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import NO_DS4

from porter.errors import PorterError

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "targets" / "ds4" / "parity"
UNITS = ["ds4_gpu_matmul_f16_tensor", "ds4_gpu_matmul_f16_pair_tensor", "ds4_gpu_matmul_f32_tensor",
         "ds4_gpu_matmul_q8_0_hc_expand_tensor", "ds4_gpu_shared_gate_up_swiglu_q8_0_tensor",
         "ds4_gpu_shared_down_hc_expand_q8_0_tensor", "ds4_gpu_attention_output_q8_batch_tensor",
         "ds4_gpu_attention_output_low_q8_tensor", "ds4_gpu_routed_moe_batch_tensor",
         "ds4_gpu_matmul_q8_0_tensor", "ds4_gpu_routed_moe_one_tensor"]
FAMILY_HEADER = "# --- matmul/moe family ---"


def _checkout():
    env = os.environ.get("PORTER_DS4_SOURCE")
    for p in ([Path(env)] if env else []) + [REPO / "external" / "ds4"]:
        if (p / "ds4_gpu.h").is_file() and (p / "ds4_cuda.cu").is_file():
            return p.resolve()
    return None


CHECKOUT = _checkout()
needs_checkout = pytest.mark.skipif(CHECKOUT is None, reason=NO_DS4)


@pytest.fixture(scope="module")
def target():
    from porter.target import load_target

    return load_target(REPO, "ds4", CHECKOUT)


def module(unit):
    s = importlib.util.spec_from_file_location(f"spec_mod_{unit}", SPECS / f"{unit}.py")
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------
# specs: validate and build (no GPU)
# ---------------------------------------------------------------------------

# the real-size expert and vocab maps take minutes to build per seed here: in the slow set (-m slow)
HEAVY = {"ds4_gpu_routed_moe_batch_tensor", "ds4_gpu_routed_moe_one_tensor", "ds4_gpu_matmul_q8_0_tensor"}


@needs_checkout
@pytest.mark.parametrize("unit", [pytest.param(u, marks=pytest.mark.slow) if u in HEAVY else u for u in UNITS])
def test_spec_validates_and_builds_two_seeds(target, unit):
    from porter.gates.parity.gate import prepare
    from porter.spec import Context, load_spec

    spec = load_spec(target, unit)
    assert spec is not None and spec.unit == unit
    cases = prepare(spec, target.api_function(unit), Context(None), [12345, 67890])
    ok = [c for c in cases if c.shape.expect == "ok"]
    assert ok and all(len(c.calls) == 2 for c in ok)
    for c in ok:  # the second seed's call must not be answerable from the first
        a, b = (c.calls[p].expect for p in (0, 1))
        assert any(not np.array_equal(a[k], b[k]) for k in a), c.shape.label
        for k, v in a.items():
            assert np.all(np.isfinite(v)), (c.shape.label, k)
            assert np.abs(v).max() > 0, (c.shape.label, k)  # a reference of zeros checks nothing
    timed = [c.shape for c in cases if c.shape.timed]
    assert timed and spec.bytes_moved is not None
    from porter.gates.parity.gate import zero_answer_passes

    assert zero_answer_passes(spec, cases) == [], "an all-zero answer passes these cases: calibration refuses the spec"
    for s in timed:
        assert spec.bytes_moved(s) > 0
    # ds4's real sizes are present: 4096 embedding somewhere in the timed or real-tensor cases
    assert any(s.shape.model_tensors for s in cases), unit
    assert any(4096 in s.shape.dims.values() or 8192 in s.shape.dims.values() for s in cases), unit


def test_dispatch_maps_name_shapes_that_exist_and_knobs_that_are_listed():
    labels = {u: {s.label for s in module(u).SPEC.shapes} for u in UNITS}
    for unit in UNITS:
        mod = module(unit)
        dispatch, env = mod.DISPATCH, mod.KNOWN_GOOD_ENV
        assert isinstance(dispatch, dict) and dispatch, unit
        assert all(isinstance(e, dict) and e and all(isinstance(v, str) for v in e.values()) for e in env), unit
        knobs = {k for e in env for k in e}
        for path, how in dispatch.items():
            assert "->" in how, (unit, path)
            m = re.search(r"reached by (\w+)'s shape '([^']+)'", how) or re.search(r"reached by shape '([^']+)'", how)
            if m and m.lastindex == 2:
                assert m.group(2) in labels[m.group(1)], (unit, path, how)
            elif m:
                assert m.group(1) in labels[unit], (unit, path, how)
            elif how.rstrip().endswith("-> knob"):
                named = set(re.findall(r"DS4_CUDA_[A-Z0-9_]+", how))
                assert named and named & knobs, (unit, path, how)
            else:
                assert "no case" in how, (unit, path, how)


def test_a_dispatch_map_naming_a_missing_shape_is_caught():
    """The check above must be able to fail: a label that no shape has."""
    labels = {s.label for s in module("ds4_gpu_matmul_f16_tensor").SPEC.shapes}
    assert "router 4096->256, decode" in labels and "router 4096->256, 3 tokens" not in labels


# ---------------------------------------------------------------------------
# mutants of the family
# ---------------------------------------------------------------------------

def _family_names():
    text = (REPO / "targets" / "ds4" / "mutants.toml").read_text()
    assert FAMILY_HEADER in text
    section = text.split(FAMILY_HEADER, 1)[1].split("\n# --- ", 1)[0]  # up to the next family's header
    return re.findall(r'^name = "([^"]+)"', section, flags=re.M)


@needs_checkout
def test_family_mutants_apply_once_each_and_together(target):
    from porter.gates.mutants import rule_mutants

    names = set(_family_names())
    muts = [m for m in rule_mutants(target) if m.name in names]
    assert {m.name for m in muts} == names
    src = (target.checkout / "ds4_cuda.cu").read_text()
    combined = src
    for m in muts:
        assert m.file == "ds4_cuda.cu"
        for rule in m.rules:
            assert src.count(rule.search) == 1, (m.name, rule.search[:60])
        out = m.apply(src)
        assert out != src and "porter mutant" in out
        combined = m.apply(combined)  # no two mutants touch the same text
    per_unit = {}
    for m in muts:
        per_unit.setdefault(m.unit, []).append(m.name)
        assert m.unit in UNITS, m.name
    assert all(len(v) >= 2 for v in per_unit.values()), per_unit
    assert set(per_unit) == set(UNITS)
    # the gap the issue names: the non-LUT IQ2_XXS dot has its own mutant
    assert "iq2_xxs-nonlut-as-q8_0" in names


@needs_checkout
def test_a_search_text_that_occurs_twice_is_refused(target):
    from porter.gates.mutants import Mutant, Rule

    src = (target.checkout / "ds4_cuda.cu").read_text()
    dup = "uint64_t bn = in_dim - i0 < 32 ? in_dim - i0 : 32;"
    assert src.count(dup) > 1
    with pytest.raises(PorterError, match="must occur exactly once"):
        Mutant("u", "m", "values", "why", "rules", file="ds4_cuda.cu", rules=(Rule(dup, "x"),)).apply(src)


# ---------------------------------------------------------------------------
# weights by GGUF tensor name
# ---------------------------------------------------------------------------

L3 = ["blk.3.ffn_gate_exps.weight", "blk.3.ffn_up_exps.weight", "blk.3.ffn_down_exps.weight"]
IN, MID, OUT = 512, 256, 512  # tiny widths; ds4's names and types, 256 experts


def _tiny_ds4_gguf(path: Path, gate_type: str = "IQ2_XXS", down_type: str = "Q2_K") -> dict:
    import gguf

    from reference import quant

    r = np.random.default_rng(7)
    tensors = {
        L3[0]: (gate_type, (256, MID, IN)), L3[1]: (gate_type, (256, MID, IN)), L3[2]: (down_type, (256, OUT, MID)),
        "blk.3.ffn_gate_inp.weight": ("F16", (256, IN)),
        "blk.3.attn_output_b.weight": ("Q8_0", (OUT, 2 * IN)),
    }
    w = gguf.GGUFWriter(str(path), "deepseek4")
    raw = {}
    for name, (qt, shape) in tensors.items():
        data = quant.random_blocks(qt, int(np.prod(shape[:-1])), shape[-1], r)
        if qt == "F16":
            arr = data.view("<f2").reshape(shape)
            w.add_tensor(name, arr)
        else:
            arr = data.reshape(*shape[:-1], -1)
            w.add_tensor(name, arr, raw_dtype=quant.qtype_of(qt))
        raw[name] = data.reshape(-1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return raw


def test_model_source_reads_the_named_tensors_bytes(tmp_path):
    from porter.spec import Context, Shape
    from porter.spec.weights import Want

    gguf_path = tmp_path / "tiny-ds4.gguf"
    raw = _tiny_ds4_gguf(gguf_path)
    shape = Shape("by name", {}, source="model:" + ",".join(L3))
    assert shape.model_tensors == L3
    experts = (0, 17, 255)
    wants = [Want("IQ2_XXS", (256, MID, IN), experts, types=("IQ2_XXS", "Q4_K")),
             Want("IQ2_XXS", (256, MID, IN), experts, types=("IQ2_XXS", "Q4_K")),
             Want("Q2_K", (256, OUT, MID), experts, types=("Q2_K", "Q4_K"))]
    m, placed = Context(None, model_path=gguf_path).weights(shape, wants, np.random.default_rng(1))
    for p, name in zip(placed, L3):
        assert p.real and p.name == name
        for e in experts:
            got = np.asarray(m.array[p.offset + e * p.expert_bytes: p.offset + (e + 1) * p.expert_bytes])
            np.testing.assert_array_equal(got, raw[name][e * p.expert_bytes:(e + 1) * p.expert_bytes])
    # without a model: synthetic blocks of the census type, same layout
    m2, placed2 = Context(None).weights(shape, wants, np.random.default_rng(1))
    assert [(p.offset, p.qtype, p.row_bytes, p.expert_bytes) for p in placed2] == \
           [(p.offset, p.qtype, p.row_bytes, p.expert_bytes) for p in placed]
    assert not any(p.real for p in placed2) and m2.size == m.size
    e = experts[1]
    p = placed2[0]
    assert not np.array_equal(np.asarray(m2.array[p.offset + e * p.expert_bytes: p.offset + (e + 1) * p.expert_bytes]),
                              raw[L3[0]][e * p.expert_bytes:(e + 1) * p.expert_bytes])


def test_model_source_refuses_a_wrong_shape_or_a_missing_tensor(tmp_path):
    from porter.spec import Context, Shape, SpecError
    from porter.spec.weights import Want

    gguf_path = tmp_path / "tiny-ds4.gguf"
    _tiny_ds4_gguf(gguf_path)
    ctx = Context(None, model_path=gguf_path)
    with pytest.raises(SpecError, match="the case needs"):
        ctx.weights(Shape("w", {}, source=f"model:{L3[0]}"), [Want("IQ2_XXS", (256, MID, 2 * IN), (0,))],
                    np.random.default_rng(0))
    with pytest.raises(SpecError, match="has no tensor"):
        ctx.weights(Shape("w", {}, source="model:blk.99.ffn_gate_exps.weight"),
                    [Want("IQ2_XXS", (256, MID, IN), (0,))], np.random.default_rng(0))
    with pytest.raises(SpecError, match="needs a source"):
        ctx.weights(Shape("w", {}), [Want("F16", (256, IN))], np.random.default_rng(0))
    # a tensor of a type the unit does not read keeps a synthetic stand-in (F16 router for an F32 matmul)
    m, (p,) = ctx.weights(Shape("w", {}, source="model:blk.3.ffn_gate_inp.weight"), [Want("F32", (256, IN))],
                          np.random.default_rng(0))
    assert not p.real and p.qtype == "F32"


@pytest.mark.parametrize("gate_type,down_type", [("IQ2_XXS", "Q2_K"), ("Q4_K", "Q4_K")])
def test_routed_moe_spec_builds_from_a_users_model(tmp_path, gate_type, down_type):
    """The spec's own builder on a model: the call's types and strides are the model's, and its
    reference equals one computed straight from the GGUF's bytes."""
    import gguf

    from porter.spec import Context, Shape
    from reference import ds4_matmul_ops as mo
    from reference import ds4_ops as ops

    gguf_path = tmp_path / "tiny-ds4.gguf"
    _tiny_ds4_gguf(gguf_path, gate_type, down_type)
    spec = module("ds4_gpu_routed_moe_batch_tensor").SPEC
    dims = {"n_tokens": 3, "n_expert": 6, "in_dim": IN, "mid_dim": MID, "out_dim": OUT, "clamp": 10.0}
    if gate_type == "Q4_K":
        dims["gate"] = "Q4_K"
    shape = Shape("tiny by name", dims, source="model:" + ",".join(L3))
    call = spec.build(shape, Context(None, model_path=gguf_path), np.random.default_rng(3))
    a = call.args
    assert (a["gate_type"], a["down_type"]) == (ops.GGML_TYPE[gate_type], ops.GGML_TYPE[down_type])

    rd = gguf.GGUFReader(str(gguf_path))
    t = {x.name: x for x in rd.tensors}
    mm = np.memmap(gguf_path, dtype=np.uint8, mode="r")
    sel, wts, x = a["selected"].array, a["weights"].array, a["x"].array
    want, _ = mo.routed_moe(mm, t[L3[0]].data_offset, t[L3[1]].data_offset, t[L3[2]].data_offset,
                            a["gate_type"], a["down_type"], a["gate_expert_bytes"], a["gate_row_bytes"],
                            a["down_expert_bytes"], a["down_row_bytes"], IN, MID, OUT, sel, wts, 6, 10.0, x, 3)
    np.testing.assert_array_equal(call.expect["out"], want)
    # and the synthetic build (no model) of the same shape is a different tensor of the same type
    call2 = spec.build(shape, Context(None), np.random.default_rng(3))
    assert call2.args["gate_type"] == a["gate_type"] and not np.array_equal(call2.expect["out"], want)


def test_large_weight_maps_are_sparse_files(tmp_path):
    """ds4's real experts (1.8 GB per layer) become a sparse file holding only the selected experts."""
    from porter.spec import weights as W

    wants = [W.Want("IQ2_XXS", (256, 2048, 4096), (0, 255)), W.Want("IQ2_XXS", (256, 2048, 4096), (0, 255)),
             W.Want("Q2_K", (256, 4096, 2048), (0, 255))]
    data, file, placed = W.place(wants, ["g", "u", "d"], np.random.default_rng(0), scratch=tmp_path)
    assert file and data.size > 1_800_000_000
    assert os.stat(file).st_blocks * 512 < 64 << 20  # only the two experts' pages are on disk
    p = placed[0]
    assert np.asarray(data[p.offset + 5 * p.expert_bytes: p.offset + 5 * p.expert_bytes + 4096]).max() == 0
    assert np.asarray(data[p.offset + 255 * p.expert_bytes: p.offset + 255 * p.expert_bytes + 4096]).max() > 0


# ---------------------------------------------------------------------------
# the `bool *` out-flag and a sparse-file map through the parity child (host mode)
# ---------------------------------------------------------------------------

FLAG_STAND_IN_C = r"""
#include <stdint.h>
#include <stdbool.h>
typedef struct { void *ptr; uint64_t bytes; int owner; } T;
int ds4_gpu_init(void) { return 1; }
/* out[t][o] = the map's byte at gate_offset + o (so the map must arrive whole), and the
   out-flag must be a writable bool (ds4_gpu.h: *mid_is_f16 says how mid is stored) */
int ds4_gpu_routed_moe_batch_tensor(T *out, T *gate, T *up, T *mid, T *experts, const void *map, uint64_t size,
    uint64_t gate_offset, uint64_t up_offset, uint64_t down_offset, uint32_t gate_type, uint32_t down_type,
    uint64_t geb, uint64_t grb, uint64_t deb, uint64_t drb, uint32_t in_dim, uint32_t mid_dim, uint32_t out_dim,
    const T *selected, const T *weights, uint32_t n_expert, float clamp, const T *x, uint32_t n_tokens,
    bool *mid_is_f16) {
  if (!mid_is_f16 || *mid_is_f16) return 0;
  *mid_is_f16 = true;
  const unsigned char *m = map;
  float *o = out->ptr;
  for (uint32_t t = 0; t < n_tokens; t++)
    for (uint32_t i = 0; i < out_dim; i++)
#ifdef FAULT_OFF_BY_ONE
      o[(uint64_t)t * out_dim + i] = (float)m[gate_offset + i + 1];
#else
      o[(uint64_t)t * out_dim + i] = (float)m[gate_offset + i];
#endif
  return 1;
}
"""


@needs_checkout
@pytest.mark.parametrize("fault,check", [(None, "pass"), ("FAULT_OFF_BY_ONE", "values")])
def test_flag_and_sparse_map_reach_the_library_in_host_mode(target, tmp_path, monkeypatch, fault, check):
    import shutil
    import subprocess

    from porter.spec import weights as W
    from porter.gates.parity.gate import run_spec
    from porter.spec import Call, Shape, Tol, UnitSpec

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the host stand-in")
    src = tmp_path / "flag.c"
    src.write_text(FLAG_STAND_IN_C)
    lib = tmp_path / "libflag.so"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", *([f"-D{fault}"] if fault else []), "-o", str(lib), str(src)],
                   check=True, capture_output=True)
    monkeypatch.setattr(W, "SPARSE_MIN", 1 << 20)  # this case's 2.6 MB map becomes a sparse file
    real = module("ds4_gpu_routed_moe_batch_tensor")
    dims = {"n_tokens": 2, "n_expert": 2, "in_dim": 256, "mid_dim": 256, "out_dim": 64, "clamp": 10.0}
    seen_files = []

    def build(shape, ctx, rng):
        call = real.SPEC.build(Shape(shape.label, dims, source="model:" + ",".join(L3)), ctx, rng)
        m, a = call.args["model_map"], call.args
        seen_files.append(m.file)
        want = np.asarray(m.array[a["gate_offset"]:a["gate_offset"] + 64], dtype=np.float32)
        return Call(args=a, expect={"out": np.tile(want, (2, 1))})

    spec = UnitSpec(unit="ds4_gpu_routed_moe_batch_tensor", reference="test", outputs={"out": Tol(nmse=0, max_abs=0)},
                    shapes=[Shape("flag", dims)], build=build)
    res = run_spec(target, spec, lib, workspace=tmp_path, mode="host", timing_reps=0)
    assert all(seen_files), "the map did not go through a sparse file"
    assert res.word == check, res.summary


@needs_checkout
def test_the_moe_batch_spec_routes_a_whole_prefill_chunk_onto_few_experts(target):
    """The real-width timed MoE batch case stays at 129 tokens (its construction: 83 s a call at 2048), so
    one case carries a prefill chunk's routing at small widths, timed as well: 2048 tokens, one expert
    serving most of them -- a per-expert count or scratch sized for a small batch overflows there, and
    nowhere else, and a per-token loop costs a chunk's worth of time."""
    from porter.gates.parity.gate import prepare
    from porter.spec import Context, load_spec

    spec = load_spec(target, "ds4_gpu_routed_moe_batch_tensor")
    chunk = [s for s in spec.shapes if s.dims.get("n_tokens") == 2048]
    assert len(chunk) == 1 and not chunk[0].model_tensors
    import dataclasses

    # timed: perf judges a whole chunk's routing against upstream's (the 129-token case hides a per-token
    # loop's cost); its roofline counts the pool's experts, not the 256 a chunk could reach
    assert chunk[0].timed and {s.label for s in spec.shapes if s.timed} == {"prefill 129 tokens, 6 of 256",
                                                                             chunk[0].label}
    one = spec.bytes_moved(dataclasses.replace(chunk[0], dims={**chunk[0].dims, "n_tokens": 1, "n_expert": 1}))
    acts = 4 * 2048 * (256 + 256)
    assert spec.bytes_moved(chunk[0]) - acts == 12 * (one - 4 * (256 + 256))
    cases = prepare(dataclasses.replace(spec, shapes=chunk), target.api_function(spec.unit), Context(None), [12345, 67890])
    assert len(cases[0].timing_calls) >= 1  # the timed calls rotate over a third input set
    for call in cases[0].calls + cases[0].timing_calls:
        sel = np.asarray(call.args["selected"].array).reshape(2048, -1)
        counts = np.bincount(sel.reshape(-1), minlength=256)
        assert counts.max() > 1024 and (counts > 0).sum() <= 12
        assert np.abs(call.expect["out"]).max() > 0
