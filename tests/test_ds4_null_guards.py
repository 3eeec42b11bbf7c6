"""ds4's NULL-tensor error cases (targets/ds4/parity/_null_guards.py) held to upstream's code, both ways.

Each case is made from a static fact about the known-good: the op's first statement is one
`if (...) return 0;` with `!p` among its top-level `||` terms, so upstream returns 0 for a NULL p having
touched nothing.  A table that named a tensor upstream does not refuse would make the spec refuse correct
code; one that missed a guarded tensor would leave a port that drops the check unseen.  The checkout is
read here (skipped without it); the cases' construction needs only the specs.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import NO_DS4, REPO, ds4_checkout

CHECKOUT = ds4_checkout()
needs_checkout = pytest.mark.skipif(CHECKOUT is None, reason=NO_DS4)


def _table():
    from porter.spec import sibling

    return sibling(str(REPO / "targets" / "ds4" / "parity" / "x.py"), "_null_guards")


def _top_level(text: str, sep: str) -> list[str]:
    """`text` split at each `sep` outside parentheses."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        depth += (c == "(") - (c == ")")
        if depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i = i + len(sep)
            continue
        i += 1
    return parts + [text[start:]]


def _refused(body: str, names: list[str]) -> set[str]:
    """The names of `names` a body's first statement (after `(void)x;` casts) refuses as NULL: one
    `if (...) return 0;` (or `{ return 0; }`) whose top-level `||` terms include `!name`."""
    body = re.sub(r"^(\s*\(void\)\s*\w+\s*;)+", "", body)
    m = re.match(r"\s*if\s*\(", body)
    if not m:
        return set()
    depth, i = 1, m.end()
    while depth and i < len(body):
        depth += (body[i] == "(") - (body[i] == ")")
        i += 1
    if not re.match(r"\s*(\{\s*return 0;\s*\}|return 0;)", body[i:]):
        return set()
    terms = {re.sub(r"\s+", "", t) for t in _top_level(body[m.end():i - 1], "||")}
    return {n for n in names if f"!{n}" in terms}


# an argument with no pointer arithmetic and no call: a parameter passed through, or a constant
LITERAL = re.compile(r'\d+[uUlL]*|0x[0-9a-fA-F]+[uUlL]*|"[^"\\]*"|true|false|NULL|nullptr')


def _first_guards(src: str) -> dict[str, tuple[list[str], set[str]]]:
    """op -> (its parameter names in order, the names the first statement it runs refuses as NULL).  An op
    whose whole body is `return launcher(p, q, ...);` over its own parameters runs the launcher's first
    statement first: each argument a launcher parameter it refuses is refused.  Definitions and their
    parameters come from the CUDA grammar (porter.target.cparse), the guards from each body's text."""
    from porter.target.cparse import function_definitions

    defs = {f.name: f for f in function_definitions(src)}
    out = {}
    for f in defs.values():
        if not (f.extern_c and re.fullmatch(r"ds4_gpu_\w+_tensor", f.name)):
            continue
        names, body = [p.name for p in f.params], f.body[1:]  # past the opening brace
        refused = _refused(body, names)
        call = re.match(r"\s*return\s+(\w+)\(([^;]*)\);\s*\}", body, re.S)
        if not refused and call and call.group(1) in defs:
            args = [a.strip() for a in call.group(2).split(",")]
            launcher = defs[call.group(1)]
            lparams = [p.name for p in launcher.params]
            if len(args) == len(lparams) and all(a in names or LITERAL.fullmatch(a) for a in args):
                by_launcher = _refused(launcher.body[1:], lparams)
                refused = {a for a, lp in zip(args, lparams) if lp in by_launcher}
        out[f.name] = (names, refused)
    return out


@pytest.fixture(scope="module")
def target():
    from porter.target import load_target

    return load_target(REPO, "ds4", CHECKOUT)


@needs_checkout
def test_every_listed_tensor_is_refused_by_upstreams_first_check_and_none_is_missed(target):
    from porter.spec import header_params

    src = (CHECKOUT / "ds4_cuda.cu").read_text(errors="replace")
    guards = _first_guards(src)
    table = _table().NULL_GUARDED
    specs = {p.stem for p in (REPO / "targets" / "ds4" / "parity").glob("ds4_gpu_*_tensor.py")}
    seen = {}
    for unit in sorted(specs & set(guards)):
        names, refused = guards[unit]
        if not refused:
            continue
        header = [p["name"] for p in header_params(target.api_function(unit))]
        tensors = {p["name"] for p in header_params(target.api_function(unit)) if p["kind"] == "tensor"}
        if len(names) != len(header):  # the definition and the header disagree (routed MoE): no mapping, no case
            assert unit not in table, unit
            continue
        # the header's name for each refused parameter (the definition may name it otherwise)
        seen[unit] = tuple(h for n, h in zip(names, header) if n in refused and h in tensors)
    want = {u: t for u, t in seen.items() if t}
    assert {u: set(t) for u, t in table.items()} == {u: set(t) for u, t in want.items()}


@needs_checkout
def test_a_guard_that_is_not_the_first_statement_makes_no_case():
    guards = _first_guards("""
extern "C" int ds4_gpu_a_tensor(ds4_gpu_tensor *out, const ds4_gpu_tensor *x, uint32_t n) {
    (void)n;
    if (!out || !x || n == 0) return 0;
}
extern "C" int ds4_gpu_b_tensor(ds4_gpu_tensor *out, const ds4_gpu_tensor *x, uint32_t n) {
    launch(out, x);
    if (!out) return 0;
}
extern "C" int ds4_gpu_c_tensor(ds4_gpu_tensor *out, const ds4_gpu_tensor *mask, uint32_t n) {
    if (!out || (!mask && n > 4) || (n && out->bytes < (uint64_t)n * sizeof(float))) {
        return 0;
    }
}
extern "C" int ds4_gpu_g_tensor(ds4_gpu_tensor *out, const ds4_gpu_tensor *x, uint32_t n) {
    if (!out || !x) { fprintf(stderr, "bad"); return 0; }
}
""")
    assert guards["ds4_gpu_a_tensor"][1] == {"out", "x"}
    assert guards["ds4_gpu_b_tensor"][1] == set()  # something ran before the check
    assert guards["ds4_gpu_c_tensor"][1] == {"out"}  # a NULL mask alone is no refusal
    assert guards["ds4_gpu_g_tensor"][1] == set()  # the refusal does something first
    through = _first_guards("""
static int launch(ds4_gpu_tensor *dst, const ds4_gpu_tensor *src, uint32_t n) {
    if (!dst || !src || n == 0) return 0;
}
extern "C" int ds4_gpu_d_tensor(ds4_gpu_tensor *out, const ds4_gpu_tensor *x, uint32_t n) {
    return launch(out, x, n);
}
extern "C" int ds4_gpu_e_tensor(ds4_gpu_tensor *out, const ds4_gpu_tensor *x, uint32_t n) {
    return launch(out, x + 1, n);
}
extern "C" int ds4_gpu_f_tensor(ds4_gpu_tensor *out, const ds4_gpu_tensor *x) {
    return launch(out, x, 64u);
}
""")
    assert through["ds4_gpu_d_tensor"][1] == {"out", "x"}  # the launcher's first statement runs first
    assert through["ds4_gpu_e_tensor"][1] == set()  # an argument that is not a plain parameter: no reading
    assert through["ds4_gpu_f_tensor"][1] == {"out", "x"}  # a constant beside them changes nothing


@needs_checkout
def test_each_null_case_is_the_base_case_with_that_one_tensor_null(target):
    from porter.spec import Context, In, InOut, Null, Out, load_specs, validate_call

    specs = load_specs(target)
    ctx = Context.for_target(target)
    table = _table()
    for unit, tensors in table.NULL_GUARDED.items():
        spec = specs[unit]
        nulls = [s for s in spec.shapes if table.KEY in s.dims]
        assert [s.dims[table.KEY] for s in nulls] == list(tensors), unit
        base = table.base_shape(spec)
        assert base.expect == "ok" and not base.timed
        for s in nulls:
            assert s.expect == "error" and s.label.startswith(f"error: {s.dims[table.KEY]} is NULL")
            call = spec.build(s, ctx, np.random.default_rng(1))
            validate_call(spec, target.api_function(unit), s, call)
            assert isinstance(call.args[s.dims[table.KEY]], Null) and not call.expect
            others = [a for k, a in call.args.items() if k != s.dims[table.KEY]]
            assert not any(isinstance(a, Null) for a in others)
            assert any(isinstance(a, (In, InOut, Out)) for a in others) or len(tensors) == 1
