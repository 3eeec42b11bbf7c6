"""Bad tensor arguments in error cases: a NULL tensor, a descriptor whose data is NULL, a descriptor
claiming fewer bytes than its buffer (porter.spec: Null(), data_null=, claim_bytes=).

A spec refuses them outside expect="error" shapes; the plan carries them; the parity child hands the
unit exactly that (a NULL pointer, a descriptor with NULL data or the claimed bytes, the real buffer
full size); the verdict stays the parent's and the checker's: an error case passes on a failure
return, and the checker refuses a write past a claim whatever the unit returns.  Host mode: a C
library stands in for the backend (tests/test_parity_compare.py's FAKE_BACKEND), no GPU needed.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from porter.gates.parity import gate as G
from porter.spec import (Call, In, InOut, Null, Out, Same, Shape, SpecError, UnitSpec, Tol, header_params,
                         load_spec, validate_call)

from tests.test_parity_compare import FAKE_BACKEND, fixture_ctx, target  # noqa: F401  (fixtures)

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to build the stand-in libraries")
UNIT = "mini_gpu_swiglu_tensor"
OK, ERR = Shape("ok", {"n": 4}), Shape("err", {"n": 4}, expect="error", why="a bad argument")


def _x():
    return np.arange(4, dtype=np.float32)


def _call(**over):
    args = {"out": Out("f32", (4,)), "gate": In(_x()), "up": In(_x()), "n": 4}
    args.update(over)
    return Call(args=args, expect={"out": _x()})


# ---------------------------------------------------------------------------
# the spec: where bad arguments may appear
# ---------------------------------------------------------------------------

BAD_ARGS = {
    "null out": {"out": Null()},
    "null gate": {"gate": Null()},
    "out data NULL": {"out": Out("f32", (4,), data_null=True)},
    "gate data NULL": {"gate": In(_x(), data_null=True)},
    "out claims 12 of 16 bytes": {"out": Out("f32", (4,), claim_bytes=12)},
    "up claims 0 bytes": {"up": In(_x(), claim_bytes=0)},
}


@pytest.mark.parametrize("what", sorted(BAD_ARGS))
def test_bad_tensor_arguments_are_refused_in_an_ok_shape_and_allowed_in_an_error_shape(target, what):
    spec = load_spec(target, UNIT)
    fn = target.api_function(UNIT)
    call = _call(**BAD_ARGS[what])
    with pytest.raises(SpecError) as exc:
        validate_call(spec, fn, OK, call)
    msg = str(exc.value)
    assert "\n" not in msg and "expect='error'" in msg and f"parameter {next(iter(BAD_ARGS[what]))} gets" in msg
    validate_call(spec, fn, ERR, call)  # the same call is an error case's to make


def test_a_case_the_api_leaves_open_has_valid_arguments_a_reference_and_a_reason(target):
    """expect="either" (a size past a limit the header does not set): refused, or judged on its values.  Its
    call is a valid one (bad arguments are an error case's), with a reference for a backend that computes
    it, a reason the API leaves it open, and no timing (a refusal has no time to judge)."""
    spec = load_spec(target, UNIT)
    fn = target.api_function(UNIT)
    either = Shape("open", {"n": 4}, expect="either", why="the header sets no limit")
    assert either.judges_values and OK.judges_values and not ERR.judges_values
    validate_call(spec, fn, either, _call())
    with pytest.raises(SpecError, match="expect='error'"):
        validate_call(spec, fn, either, _call(out=Null()))
    with pytest.raises(SpecError, match="no reference"):
        validate_call(spec, fn, either, Call(args=_call().args))
    for bad in ({"why": ""}, {"why": "open", "timed": True}):
        with pytest.raises(SpecError, match="either"):
            Shape("open", {"n": 4}, expect="either", **bad)
    with pytest.raises(SpecError, match="'ok', 'error' or 'either'"):
        Shape("typo", {"n": 4}, expect="maybe")


def test_a_true_descriptor_is_no_bad_argument(target):
    spec = load_spec(target, UNIT)
    validate_call(spec, target.api_function(UNIT), OK, _call(out=Out("f32", (4,), data_null=False, claim_bytes=None)))


def test_a_claim_is_fewer_bytes_than_the_buffer():
    for bad in (16, 17, -1, True, 2.5):
        with pytest.raises(SpecError, match="claim"):
            In(_x(), claim_bytes=bad)
    with pytest.raises(SpecError, match="claim"):
        Out("f32", (4,), claim_bytes=16)
    assert InOut(_x(), claim_bytes=12).claim_bytes == 12
    assert In(_x(), claim_bytes=np.int64(8)).claim_bytes == 8


def test_null_is_for_tensor_parameters_and_no_alias_points_at_it(target):
    spec = load_spec(target, "mini_gpu_add_tensor")
    fn = target.api_function(spec.unit)
    x = _x()
    with pytest.raises(SpecError, match="parameter n .* got Null"):
        validate_call(spec, fn, ERR, Call(args={"out": Out("f32", (4,)), "a": In(x), "b": In(x), "n": Null()}))
    with pytest.raises(SpecError, match="parameter out .* got Same"):
        validate_call(spec, fn, ERR, Call(args={"out": Same("a"), "a": Null(), "b": In(x), "n": 4}))
    # an alias shares its target's descriptor, lie included: allowed in an error case
    validate_call(spec, fn, ERR, Call(args={"out": Same("a"), "a": InOut(x, claim_bytes=12), "b": In(x), "n": 4}))


# ---------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------

def test_the_layout_and_the_plan_carry_the_lies(target, tmp_path):
    spec = load_spec(target, UNIT)
    fn = target.api_function(UNIT)
    params = header_params(fn)
    null = G._layout(spec, params, _call(out=Null(), gate=In(_x(), data_null=True), up=In(_x(), claim_bytes=8)))
    assert null["bind"]["out"] is None and "out" not in null["buffers"] and null["outputs"] == {}
    assert null["buffers"]["gate"]["data_null"] is True and "claim_bytes" not in null["buffers"]["gate"]
    assert null["buffers"]["up"]["claim_bytes"] == 8 and "data_null" not in null["buffers"]["up"]
    honest = G._layout(spec, params, _call())
    assert set(honest["buffers"]["out"]) == {"role", "nbytes", "dtype"}  # no lie, no key: plans as before
    # a claim is part of the layout: two calls of one case claiming different bytes are two layouts
    assert not G._same_layout(G._layout(spec, params, _call(up=In(_x(), claim_bytes=8))),
                              G._layout(spec, params, _call(up=In(_x(), claim_bytes=4))))
    assert G._same_layout(G._layout(spec, params, _call(up=In(_x(), claim_bytes=8))),
                          G._layout(spec, params, _call(up=In(_x() + 1, claim_bytes=8))))

    shapes = [Shape("ok", {"n": 4}), Shape("null out", {"n": 4, "k": "null"}, expect="error"),
              Shape("short up", {"n": 4, "k": "short"}, expect="error")]

    def build(shape, ctx, rng):
        k = shape.dims.get("k")
        return _call(**({"out": Null()} if k == "null" else {"up": In(_x(), claim_bytes=12)} if k == "short" else {}))

    s = UnitSpec(UNIT, spec.reference, {"out": Tol()}, shapes, build)
    cases = G.prepare(s, fn, None, [1, 2])
    G.write_plan(tmp_path, s, fn, cases, tmp_path / "lib.so", mode="host", harness={}, probe=None, timing_reps=0)
    plan = {c["label"]: c for c in json.loads((tmp_path / "plan.json").read_text())["cases"]}
    assert plan["null out"]["bind"]["out"] is None and "out" not in plan["null out"]["buffers"]
    assert plan["null out"]["outputs"] == {}
    assert plan["short up"]["buffers"]["up"] == {"role": "in", "nbytes": 16, "claim_bytes": 12}
    assert plan["ok"]["buffers"]["up"] == {"role": "in", "nbytes": 16}


def test_an_ok_shape_with_a_bad_argument_never_becomes_a_plan(target):
    spec = load_spec(target, UNIT)
    s = UnitSpec(UNIT, spec.reference, {"out": Tol()}, [Shape("ok", {"n": 4})],
                 lambda shape, ctx, rng: _call(gate=In(_x(), data_null=True)))
    with pytest.raises(SpecError, match="gate gets a descriptor where its data pointer is NULL"):
        G.prepare(s, target.api_function(UNIT), None, [1, 2])


# ---------------------------------------------------------------------------
# the checker: writes past a claim are its own finding
# ---------------------------------------------------------------------------

def test_the_checker_sees_writes_past_a_claim_and_into_a_buffer_given_as_null():
    from porter.gates.parity import checker as C

    def run(buffers, write):
        plan = {"cases": [{"id": "c0", "buffers": buffers, "outputs": {}, "passes": [{"data": {"x": "x"}}],
                           "expect": "error"}], "guard_bytes": 64}
        chk = C.Checker(plan, {"x": np.arange(8, dtype=np.float32)}, C.devmod.make_device("host"), "host")
        chk.handle({"op": "case", "case": "c0"})
        chk.handle({"op": "prepare", "case": "c0", "pass": 0})
        for name, (at, data) in write.items():
            chk.arena.write(chk.offsets[name] + at, data)
        chk.handle({"op": "called", "case": "c0", "pass": 0})
        chk.handle({"op": "settled", "case": "c0", "pass": 0})
        return chk.records["c0"]["passes"][0]["guard_damage"]

    out = {"role": "out", "nbytes": 32, "claim_bytes": 28}
    x = {"role": "in", "nbytes": 32}
    assert run({"out": out, "x": x}, {"out": (0, b"\0" * 28)}) == []  # inside the claim: the unit's to write
    [d] = run({"out": out, "x": x}, {"out": (0, b"\0" * 32)})
    assert d["side"] == "past-claim" and d["tensor"] == "out" and d["n_bytes"] == 4 and d["claim"] == 28
    [d] = run({"out": {"role": "out", "nbytes": 32, "data_null": True}, "x": x}, {"out": (8, b"\1")})
    assert d["data_null"] and d["claim"] == 0 and d["first"] == 8
    inout = {"role": "inout", "nbytes": 32, "claim_bytes": 4}
    assert run({"x": inout}, {"x": (0, b"\7" * 4)}) == []
    assert run({"x": inout}, {"x": (31, b"\7")})[0]["first"] == 27


# ---------------------------------------------------------------------------
# the whole gate, host mode: what the child hands the unit, and guards missing
# ---------------------------------------------------------------------------

SWIGLU_GUARDS = ("    if (!out || !gate || !up || !out->data || !gate->data || !up->data) return -1;"
                 "  /* mini_gpu.h: bad arguments */\n")
SWIGLU_BYTES = "    if (out->bytes < n * 4 || gate->bytes < n * 4 || up->bytes < n * 4) return -1;\n"
HONEST_LOOP = "    for (uint64_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];\n"

# what the unit saw, as its return code: the child must hand it the plan's NULLs and claims exactly
PROBE = """    if (!out) return 11; if (!gate) return 12; if (!up) return 13;
    if (!out->data) return 21; if (!gate->data) return 22; if (!up->data) return 23;
    if (out->bytes != n * 4) return 1000 + (int)(n * 4 - out->bytes);
    if (gate->bytes != n * 4) return 2000 + (int)(n * 4 - gate->bytes);
    if (up->bytes != n * 4) return 3000 + (int)(n * 4 - up->bytes);
"""

# name: (source edits, the check that must refuse it; None: it passes)
VARIANTS = {
    "honest": ([], None),
    "probe": ([(SWIGLU_GUARDS, PROBE), (SWIGLU_BYTES, "")], None),
    # the mutants that survived on the GPU before the spec had these cases
    "no_null_guard": ([(SWIGLU_GUARDS, "    if (!out->data || !gate->data || !up->data) return -1;\n")], "crash"),
    "null_guard_and": ([(SWIGLU_GUARDS, "    if (!out && !gate && !up) return -1;\n"
                                        "    if (!out->data || !gate->data || !up->data) return -1;\n")], "crash"),
    "no_data_guard": ([(SWIGLU_GUARDS, "    if (!out || !gate || !up) return -1;\n")], "crash"),
    "no_bytes_guard": ([(SWIGLU_BYTES, "")], "guard"),
    "bytes_guard_divides": ([(SWIGLU_BYTES, SWIGLU_BYTES.replace("n * 4", "n / 4"))], "guard"),
    "bytes_guard_returns_0": ([(SWIGLU_BYTES, SWIGLU_BYTES.replace("return -1", "return 0"))], "error-return"),
    # says no, but only after writing the whole buffer: the checker's record refuses it, not its return code
    "writes_then_refuses": ([(SWIGLU_BYTES, ""), (HONEST_LOOP, HONEST_LOOP + SWIGLU_BYTES)], "guard"),
}


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if CC is None:
        pytest.skip("no C compiler (cc)")
    d = tmp_path_factory.mktemp("bad_tensors")
    out = {}
    for name, (edits, _) in VARIANTS.items():
        src = FAKE_BACKEND
        for old, new in edits:
            assert src.count(old) == 1, (name, old)
            src = src.replace(old, new)
        (d / f"{name}.c").write_text(src)
        subprocess.run([CC, "-O1", "-shared", "-fPIC", "-o", str(d / f"lib{name}.so"), str(d / f"{name}.c"), "-lm"],
                       check=True)
        out[name] = d / f"lib{name}.so"
    return out


def _run(target, ctx, lib, tmp_path):
    return G.run_spec(target, load_spec(target, UNIT), lib, workspace=tmp_path, mode="host", ctx=ctx, timing_reps=0)


@needs_cc
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_missing_guard_is_refused_and_the_guarded_unit_passes(target, fixture_ctx, libs, tmp_path, name):
    check = VARIANTS[name][1]
    r = _run(target, fixture_ctx, libs[name], tmp_path)
    assert not r.skipped, r.summary
    if check is None:
        assert r.ok, r.summary + "\n" + r.diagnostics
    else:
        assert not r.ok and r.check == check, (check, r.summary)
        assert "error: " in r.summary  # refused on a bad-argument case, not on the op's values
    if name == "writes_then_refuses":
        assert "past what the unit was given were written (its descriptor claimed 24 bytes" in r.diagnostics


@needs_cc
def test_the_child_hands_the_unit_exactly_the_plans_nulls_and_claims(target, fixture_ctx, libs, tmp_path):
    r = _run(target, fixture_ctx, libs["probe"], tmp_path)
    assert r.ok, r.summary
    rc = {c["label"]: c["passes"][0]["rc"] for c in r.evidence["cases"] if c["expect"] == "error"}
    # the base case n = 7: 28 bytes, a claim one float short is 24
    assert rc == {"error: out is NULL": 11, "error: gate is NULL": 12, "error: up is NULL": 13,
                  "error: out->data is NULL": 21, "error: gate->data is NULL": 22, "error: up->data is NULL": 23,
                  "error: out->bytes one element short": 1004, "error: gate->bytes one element short": 2004,
                  "error: up->bytes one element short": 3004}
    assert all(p["rc"] == 0 for c in r.evidence["cases"] if c["expect"] == "ok" for p in c["passes"])


# ---------------------------------------------------------------------------
# minimoe's op specs: every tensor parameter, by construction
# ---------------------------------------------------------------------------

def _minimoe_op_specs(target):
    from porter.gates.parity.scenario import is_scenario
    from porter.spec import load_specs

    return {u: s for u, s in load_specs(target).items() if not is_scenario(s)}


def test_every_minimoe_op_spec_has_the_three_bad_cases_for_every_tensor_parameter(target):
    specs = _minimoe_op_specs(target)
    assert len(specs) == 14
    for unit, spec in specs.items():
        tensors = {p["name"] for p in header_params(target.api_function(unit)) if p["kind"] == "tensor"}
        made = {(s.dims["bad_tensor"], s.dims["bad"]) for s in spec.shapes if "bad_tensor" in s.dims}
        assert made == {(p, k) for p in tensors for k in ("null", "data_null", "short")}, unit
        for s in spec.shapes:
            if "bad_tensor" in s.dims:
                assert s.expect == "error" and "mini_gpu.h" in s.why and "bad argument" in s.why, (unit, s.label)


def test_the_bad_cases_are_made_from_one_nonempty_ok_case_and_pass_the_plan(target, fixture_ctx):
    """Each bad case is its base case's call with one tensor replaced (sizes exact: the claim is one
    element short of what the call reads or writes); the rest of the call is the base case's."""
    for unit, spec in _minimoe_op_specs(target).items():
        cases = G.prepare(spec, target.api_function(unit), fixture_ctx, [5, 6])
        for c in cases:
            if "bad_tensor" not in c.shape.dims:
                continue
            p, kind = c.shape.dims["bad_tensor"], c.shape.dims["bad"]
            base = next(b for b in cases if b.shape.expect == "ok" and "bad_tensor" not in b.shape.dims and dict(
                b.shape.dims) == {k: v for k, v in c.shape.dims.items() if k not in ("bad_tensor", "bad")})
            a, b = c.calls[0].args, base.calls[0].args
            assert set(a) == set(b) and all(type(a[k]) is type(b[k]) for k in a if k != p), (unit, c.shape.label)
            assert all(x.nbytes > 0 for x in b.values() if isinstance(x, (In, InOut, Out))), (unit, "empty base")
            if kind == "null":
                assert isinstance(a[p], Null) and c.layout["bind"][p] is None
            elif kind == "data_null":
                assert c.layout["buffers"][p]["data_null"] is True and "claim_bytes" not in c.layout["buffers"][p]
            else:
                assert c.layout["buffers"][p]["claim_bytes"] == b[p].nbytes - 4


def test_the_helper_refuses_a_base_it_cannot_make_bad_cases_from(target):
    from porter.spec import sibling

    sh = sibling(str(target.dir / "parity" / "mini_gpu_add_tensor.py"), "_shared")
    with pytest.raises(SpecError, match="from an ok case"):
        sh.with_bad_tensors(lambda *a: None, Shape("e", {"n": 1}, expect="error"), ("out",))
    x = _x()

    def aliased(shape, ctx, rng):
        return Call(args={"out": Same("a"), "a": InOut(x), "b": In(x), "n": 4}, expect={"out": x})

    shapes, build = sh.with_bad_tensors(aliased, Shape("alias", {"n": 4}), ("out", "a"))
    by = {s.label: s for s in shapes}
    with pytest.raises(SpecError, match="out of the base case 'alias' is Same"):
        build(by["error: out->data is NULL"], None, np.random.default_rng(0))
    with pytest.raises(SpecError, match="another parameter aliases a"):
        build(by["error: a->bytes one element short"], None, np.random.default_rng(0))
    # the ok shapes still go to the spec's own build
    assert build(Shape("alias", {"n": 4}), None, np.random.default_rng(0)).args["out"] == Same("a")


# an in-place op whose only tensor is the bad one: the NULL case has no buffer at all, the short case
# claims less of an InOut (what past the claim must keep is its input, not a sentinel)
ROPE = r"""
#include <math.h>
#include <stdint.h>
typedef struct { void *data; uint64_t bytes; int32_t owner; } tensor;
void *mini_cuda_stream(void) { return 0; }
int mini_gpu_rope_tail_tensor(tensor *x, uint32_t n_tokens, uint32_t n_head, uint32_t head_dim, uint32_t n_rot,
                              uint32_t pos0, float freq_base) {
    if (!x) return -1;
    if ((n_rot & 1) || n_rot > head_dim) return -1;
    if (n_tokens == 0 || n_head == 0 || n_rot == 0) return 0;
    if (!x->data) return -1;
    if (x->bytes < (uint64_t)n_tokens * n_head * head_dim * 4) return -1;
    float *a = x->data;
    for (uint32_t t = 0; t < n_tokens; t++)
        for (uint32_t h = 0; h < n_head; h++)
            for (uint32_t j = 0; j < n_rot / 2; j++) {
                double th = (double)(pos0 + t) * pow((double)freq_base, -2.0 * j / n_rot);
                float *p = a + ((uint64_t)t * n_head + h) * head_dim + (head_dim - n_rot) + 2 * j;
                double x0 = p[0], x1 = p[1];
                p[0] = (float)(x0 * cos(th) - x1 * sin(th));
                p[1] = (float)(x0 * sin(th) + x1 * cos(th));
            }
    return 0;
}
"""
ROPE_VARIANTS = {
    "honest": ("", "", None),
    "no_null_guard": ("    if (!x) return -1;\n", "", "crash"),
    "no_bytes_guard": ("    if (x->bytes < (uint64_t)n_tokens * n_head * head_dim * 4) return -1;\n", "", "guard"),
}


@needs_cc
@pytest.mark.parametrize("name", sorted(ROPE_VARIANTS))
def test_an_in_place_op_with_one_tensor(target, tmp_path, name):
    from porter.spec import Context

    old, new, check = ROPE_VARIANTS[name]
    assert not old or ROPE.count(old) == 1
    (tmp_path / "rope.c").write_text(ROPE.replace(old, new) if old else ROPE)
    subprocess.run([CC, "-O1", "-shared", "-fPIC", "-o", str(tmp_path / "librope.so"), str(tmp_path / "rope.c"), "-lm"],
                   check=True)
    r = G.run_spec(target, load_spec(target, "mini_gpu_rope_tail_tensor"), tmp_path / "librope.so",
                   workspace=tmp_path, mode="host", ctx=Context(None), timing_reps=0)
    assert not r.skipped, r.summary
    if check is None:
        assert r.ok, r.summary + "\n" + r.diagnostics
    else:
        assert not r.ok and r.check == check and "error: x" in r.summary, r.summary
