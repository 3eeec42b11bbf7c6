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

import numpy as np
import pytest

from porter.gates.parity import gate as G
from porter.spec import (Call, In, InOut, Null, Out, Same, Shape, SpecError, UnitSpec, Tol, header_params,
                         load_spec, validate_call)

from tests.test_parity_compare import target  # noqa: F401  (fixtures)

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
