"""Mutation operators (porter/calibration/mutate/operators.py): each makes the edit it names inside function
bodies, and nothing outside them (macros, file-scope tables, headers) is ever touched."""

from __future__ import annotations

import pytest

from porter.calibration.mutate.generate import candidates
from porter.calibration.mutate.operators import BY_NAME, OPERATORS, perturbed

SNIPPET = r'''#include "conv.cuh"
#define TWICE(x) ((x) + (x))
static const int TABLE[2] = {3, 5};
__device__ float mul_add(float a, float b) { return a * b + 2.0f; }
__global__ void k(float *out, const float *x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __shared__ float tile[32];
    tile[threadIdx.x] = x[i];
    __syncthreads();
    float acc = 0.0f;
    for (unsigned j = 0; j < 32; j++) acc += tile[j] & 7;
    out[i] = mul_add(acc, x[i]) > 0.0f && n != 3 ? acc : (float)(n << 1);
}
extern "C" int api(float *out, const float *x, unsigned n) {
    if (!out || !x) return -1;
    k<<<(n + 31) / 32, 32>>>(out, x, n);
    return 0;
}
'''


def edits(op: str, src: str = SNIPPET) -> set[tuple[str, str, str]]:
    """(line:col, replaced text, replacement) of every mutation `op` makes of `src`."""
    return {(m.location, m.original, m.replacement) for m in candidates("u", src, (BY_NAME[op],))}


def line_of(mutation, n: int) -> str:
    return mutation.source.splitlines()[n - 1]


EXPECTED = {
    "arith": {("4:55", "*", "/"), ("4:59", "+", "-"), ("6:29", "*", "/"), ("6:42", "+", "-"), ("12:35", "++", "--"),
              ("12:43", "+=", "-="), ("17:12", "+", "-"), ("17:18", "/", "*")},
    "bitwise": {("12:54", "&", "|"), ("13:68", "<<", ">>")},
    "compare": {("7:11", ">=", ">"), ("12:28", "<", "<="), ("13:33", ">", ">="), ("13:45", "!=", "==")},
    "logic": {("13:40", "&&", "||"), ("16:14", "||", "&&")},
    "loop_bound": {("12:23", "0", "(0) + 1"), ("12:30", "32", "(32) + 1"), ("12:30", "32", "(32) - 1")},
    "drop_store": {("9:5", "tile[threadIdx.x] = x[i];", ";"),
                   ("13:5", "out[i] = mul_add(acc, x[i]) > 0.0f && n != 3 ? acc : (float)(n << 1);", ";")},
    "drop_sync": {("10:5", "__syncthreads();", ";")},
    "drop_guard": {("7:5", "if (i >= n) return;", ";"), ("16:5", "if (!out || !x) return -1;", ";")},
    "swap_args": {("13:22", "acc, x[i]", "x[i], acc"), ("17:9", "(n + 31) / 32, 32", "32, (n + 31) / 32"),
                  ("17:30", "out, x", "x, out"), ("17:35", "x, n", "n, x")},
    "narrow": {("12:46", "tile[j] & 7", "__half2float(__float2half(tile[j] & 7))"),
               ("13:65", "(n << 1)", "__half2float(__float2half((n << 1)))")},
}


@pytest.mark.parametrize("op", sorted(EXPECTED))
def test_each_operator_makes_exactly_its_edits(op):
    assert edits(op) == EXPECTED[op]


def test_index_is_one_off_both_ways_on_every_subscript_in_a_body():
    got = edits("index")
    assert ("9:27", "i", "(i) + 1") in got and ("9:27", "i", "(i) - 1") in got  # x[i]
    assert ("12:51", "j", "(j) + 1") in got  # tile[j]
    assert ("9:10", "threadIdx.x", "(threadIdx.x) - 1") in got  # a store's index too
    assert not any(loc.startswith("3:") for loc, _o, _r in got)  # TABLE[2] is a declaration, not a body


def test_constants_are_perturbed_with_their_suffix_and_only_in_bodies():
    got = edits("constant")
    assert ("4:61", "2.0f", "4.0f") in got and ("4:61", "2.0f", "1.0f") in got
    assert ("16:28", "-1", "0") in got and ("16:28", "-1", "-2") in got
    assert ("13:35", "0.0f", "1.0f") in got
    lines = {int(loc.split(":")[0]) for loc, _o, _r in got}
    assert not lines & {1, 2, 3}, "the include, the macro and the file-scope table are never mutated"


@pytest.mark.parametrize("literal, want", [
    ("32", ["33", "31"]), ("0", ["1", "-1"]), ("0u", ["1u"]), ("65535u", ["65536u", "65534u"]),
    ("0x1F", ["0x20", "0x1e"]), ("-1", ["0", "-2"]), ("1.5f", ["3.0f", "0.75f"]), ("0.0", ["1.0"]),
    ("1e-6f", ["2e-06f", "5e-07f"]), ("1.0e3", ["2000.0", "500.0"]), ("'a'", []),
])
def test_number_literals_are_perturbed_in_their_own_spelling(literal, want):
    assert perturbed(literal) == want


def test_early_return_is_void_in_kernels_and_valued_elsewhere():
    ms = candidates("u", SNIPPET, (BY_NAME["early_return"],))
    by_fn = {}
    for m in ms:
        by_fn.setdefault(m.function, set()).add(m.replacement)
    assert by_fn == {"mul_add": {"return {}; "}, "k": {"return; "}, "api": {"return {}; "}}
    first = next(m for m in ms if m.function == "k")
    assert first.location == "6:5" and line_of(first, 6).lstrip().startswith("return; unsigned i")
    # one insertion before each statement of each block of the kernel (8 statements, none in the for's
    # single-statement body, which is no block)
    assert sum(m.function == "k" for m in ms) == 8


def test_a_lambda_body_gets_no_early_return_of_its_function():
    src = ("__global__ void k(float *o) {\n    auto f = [](float v) { return v * 2.0f; };\n"
           "    o[0] = f(1.0f);\n}\n")
    ms = candidates("u", src, (BY_NAME["early_return"],))
    assert {m.location for m in ms} == {"2:5", "3:5"}  # the kernel's two statements, not inside the lambda


def test_narrow_reaches_float_accumulators_through_compound_assignment_not_int_ones():
    src = ("__global__ void k(float *o, const float *x, int n) {\n    float s = 0.0f;\n    int c = 0;\n"
           "    for (int i = 0; i < n; i++) { s += x[i]; c += 1; }\n    o[0] = s / c;\n}\n")
    got = edits("narrow", src)
    assert ("4:40", "x[i]", "__half2float(__float2half(x[i]))") in got  # s += x[i]
    assert not any(r.endswith("(1))") for _l, _o, r in got)  # c += 1 is an int


def test_narrow_leaves_literals_half_holds_exactly():
    # `float dot = 0.0f` rounded through half is the same program: it survived every case on a GPU
    src = ("__global__ void k(float *o, const float *x) {\n    float a = 0.0f, b = -1.0f, c = 0.1f, d = 1e6f;\n"
           "    float m = -INFINITY;\n    m = 0.5f;\n    m = x[0];\n    o[0] = (float)2 + a + b + c + d + m;\n}\n")
    narrowed = {orig for _l, orig, _r in edits("narrow", src)}
    assert narrowed == {"0.1f", "1e6f", "x[0]"}  # 0.1 and 1e6 change in half; 0, -1, 0.5, -inf, 2 do not


def test_a_guard_with_an_else_or_a_non_exit_is_no_bounds_check():
    src = ("__global__ void k(float *o, int n) {\n    if (n > 4) return; else o[0] = 1.0f;\n"
           "    if (n > 2) o[1] = 2.0f;\n    if (n > 1) { continue_or_not(); }\n    if (n > 0) { return; }\n}\n")
    assert edits("drop_guard", src) == {("5:5", "if (n > 0) { return; }", ";")}


def test_every_operator_is_tested_here():
    tested = set(EXPECTED) | {"index", "constant", "early_return"}
    assert tested == {o.name for o in OPERATORS}


def test_nothing_outside_a_function_body_is_ever_mutated():
    header_only = "#include \"conv.cuh\"\n#define N 4\nstatic const float T[N] = {1.0f, 2.0f, 3.0f, 4.0f};\n" \
                  "struct S { int a = 3; };\n__device__ float f(float);\n"
    assert candidates("u", header_only) == []
    ms = candidates("u", SNIPPET)
    assert ms and all(m.source.splitlines()[:3] == SNIPPET.splitlines()[:3] for m in ms)
