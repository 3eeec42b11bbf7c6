"""No unit runs host code when a library is loaded, and a unit's library holds only what it calls.

A committed unit's static constructor used to run in every later unit's parity runner (the build
linked every unit's current file), where it made a no-op swiglu pass and an honest one fail.  Here:
the object check (porter.gates.load_time) on what nvcc really made of each way to get code run at
load time, the static gate's early refusal of the text, the build gate refusing the candidate, and
a unit's library linking a unit it does not call as its placeholder.  CPU only: nvcc compiles, nothing
runs on a GPU (tests/test_unit_isolation_gpu.py shows the verdicts there).
"""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest

from porter.gates import build, load_time, static
from porter.gates.driver import Candidate, GateContext
from porter.target import load_target

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None,
                                reason="nvcc not on PATH: the object check reads what nvcc makes")

PLAIN = '__global__ void k(float *x) { x[0] = 1; }\nextern "C" int f(float *x) { k<<<1, 1>>>(x); return 0; }\n'
# each way to have code run at load time, written as an attacker who knows the text check would:
# the word is pasted from pieces so only the object shows it
PASTE = "#define GLUE(a, b) a##b\n"
# a side effect: the compiler drops a constructor that does nothing, and then there is nothing to find
HIT = "static volatile int hit;\n"
LOAD_TIME = {
    "constructor": PASTE + "__attribute__((GLUE(constr, uctor))) static void evil(void) { hit = 1; }\n",
    "destructor": PASTE + "__attribute__((GLUE(destr, uctor))) static void evil(void) { hit = 1; }\n",
    "dynamic_initialiser": "#include <cstdlib>\nstatic int v = std::atoi(std::getenv(\"X\") ? \"1\" : \"0\");\n"
                           "extern \"C\" int g(void) { return v; }\n",
    "init_array_pointer": "static void evil(void) { hit = 1; }\n"
                          "__attribute__((used, section(\".init\" \"_array\"))) static void (*p)(void) = evil;\n",
    "init_array_priority_section": "static void evil(void) { hit = 1; }\n"
                                   "__attribute__((used, section(\".init\" \"_array.00100\"))) static void (*p)(void) = evil;\n",
    "assembler_init_array": "extern \"C\" void evil_fn(void) { hit = 1; }\n"
                            "asm(\".pushsection .ini\" \"t_array,\\\"aw\\\"\\n.quad evil_fn\\n.popsection\");\n",
    "ifunc": PASTE + "static int impl(void) { return 1; }\n"
             "extern \"C\" { static void *resolve(void) { return (void *)impl; }\n"
             "int g(void) __attribute__((GLUE(if, unc)(\"resolve\"))); }\n",
    "registration_name": "extern \"C\" void **__cudaRegisterFatBinary(void *x) { return 0; }\n",
}


def _object(tmp_path, src: str):
    cu = tmp_path / f"u{uuid.uuid4().hex[:8]}.cu"
    cu.write_text(src)
    obj = cu.with_suffix(".o")
    r = subprocess.run(["nvcc", "-c", "-arch=sm_90", "-o", str(obj), str(cu)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return obj


def test_what_nvcc_makes_of_a_plain_unit_has_no_load_time_code(tmp_path):
    assert load_time.problems(_object(tmp_path, PLAIN)) == []
    # nvcc appends the registration constructor even to a file with no kernel: that one is allowed
    assert load_time.problems(_object(tmp_path, 'extern "C" int f(void) { return 0; }\n')) == []


@pytest.mark.parametrize("technique", sorted(LOAD_TIME))
def test_every_way_to_run_code_at_load_time_is_found_in_the_object(tmp_path, technique):
    found = load_time.problems(_object(tmp_path, PLAIN + HIT + LOAD_TIME[technique]))
    assert found, f"{technique}: nothing found"


def test_an_unreadable_object_is_a_problem_not_a_pass(tmp_path):
    junk = tmp_path / "junk.o"
    junk.write_bytes(b"\x7fELF" + b"\0" * 12)
    assert load_time.problems(junk) and "cannot read" in load_time.problems(junk)[0]


@pytest.mark.parametrize("text", [
    "__attribute__((constructor)) static void f(void) {}",
    "[[gnu::destructor]] static void f(void) {}",
    "#define __cudaRegisterBinary(x) evil()",
    "#  undef __CUDACC__",
    "%:define _Evil 1",
])
def test_the_static_gate_names_it_early(text):
    assert static.load_time_text(text + "\n")


@pytest.mark.parametrize("text", [
    "#define _GNU_SOURCE\n#define _POSIX_C_SOURCE 200809L",
    "// a constructor in a comment\nint x;",
    'const char *s = "init_array";',
    "#define MY_BLOCK 256",
])
def test_and_leaves_honest_text_alone(text):
    assert static.load_time_text(text + "\n") is None


@pytest.fixture(scope="module")
def target(tmp_path_factory, build_cache):
    from porter.workspace import init_workspace

    ws = init_workspace(tmp_path_factory.mktemp("load-time") / "ws", ["minimoe"])
    return load_target(ws, "minimoe")


def _swiglu(extra: str = "", call_add: bool = False) -> str:
    from tests.ws_builder import SOURCES

    src = SOURCES["mini_gpu_swiglu_tensor"]
    if call_add:  # a unit that calls another API function: that unit's file is linked with it
        src = src.replace("    if (n == 0) return 0;\n", "    if (n == 0) return mini_gpu_add_tensor(out, gate, up, 0);\n")
    return src + HIT + extra + f"// {uuid.uuid4().hex}\n"


def test_the_build_gate_refuses_a_candidate_with_load_time_code(target, build_cache):
    res = build.run(Candidate.of("mini_gpu_swiglu_tensor", _swiglu(LOAD_TIME["constructor"])),
                    GateContext(target, build_cache=build_cache))
    assert not res.ok and res.check == "load-time", res.summary
    assert "_ZL4evilv" in res.summary and "init_array" in res.summary
    good = build.run(Candidate.of("mini_gpu_swiglu_tensor", _swiglu()), GateContext(target, build_cache=build_cache))
    assert good.ok, good.summary + good.diagnostics


def _defined(library) -> set[str]:
    out = subprocess.run(["nm", "--defined-only", str(library)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_a_unit_it_does_not_call_is_not_in_its_library(target, build_cache):
    """A committed add whose file has a constructor (written before the object check existed): swiglu's
    library, which does not call add, links add's placeholder, so the constructor is not there to run."""
    from tests.ws_builder import SOURCES

    add = SOURCES["mini_gpu_add_tensor"] + "static volatile int hit;\n__attribute__((constructor)) static void add_was_here(void) { hit = 1; }\n"
    target.unit_path("mini_gpu_add_tensor").write_text(add)
    try:
        ctx = GateContext(target, build_cache=build_cache)
        res = build.run(Candidate.of("mini_gpu_swiglu_tensor", _swiglu()), ctx)
        assert res.ok, res.summary + res.diagnostics
        linked = res.evidence["linked"]
        assert linked["mini_gpu_swiglu_tensor"]["role"] == "candidate"
        assert linked["mini_gpu_add_tensor"]["role"] == "placeholder"
        assert not any("add_was_here" in s for s in _defined(ctx.library))
        # the whole backend (what the engine loads) refuses it outright
        with pytest.raises(Exception, match="load-time code in mini_gpu_add_tensor"):
            ctx.whole_backend()
    finally:
        target.unit_path("mini_gpu_add_tensor").write_text(SOURCES["mini_gpu_add_tensor"])


def test_a_unit_it_calls_is_linked_and_one_with_load_time_code_is_not(target, build_cache):
    from tests.ws_builder import SOURCES

    ctx = GateContext(target, build_cache=build_cache)
    target.unit_path("mini_gpu_add_tensor").write_text(SOURCES["mini_gpu_add_tensor"])
    res = build.run(Candidate.of("mini_gpu_swiglu_tensor", _swiglu(call_add=True)), ctx)
    assert res.ok and res.evidence["linked"]["mini_gpu_add_tensor"]["role"] == "called", res.summary
    assert any("add_kernel" in s for s in _defined(ctx.library))
    target.unit_path("mini_gpu_add_tensor").write_text(
        SOURCES["mini_gpu_add_tensor"] + "static volatile int hit;\n__attribute__((constructor)) static void add_was_here(void) { hit = 1; }\n")
    try:
        res = build.run(Candidate.of("mini_gpu_swiglu_tensor", _swiglu(call_add=True)), ctx)
        assert res.ok, res.summary
        assert res.evidence["linked"]["mini_gpu_add_tensor"]["role"] == "placeholder"
        assert "add_was_here" in res.evidence["refused_load_time"]["mini_gpu_add_tensor"][0]
        assert not any("add_was_here" in s for s in _defined(ctx.library))
    finally:
        target.unit_path("mini_gpu_add_tensor").write_text(SOURCES["mini_gpu_add_tensor"])


def test_every_load_time_payload_of_the_hostile_corpus_is_refused_by_the_build_gate(target, build_cache):
    """The sandbox corpus (tests/hostile) runs its payloads from constructors and static initialisers:
    through the build gate none of them gets as far as a library."""
    from tests.test_hostile import HOSTILE

    payloads = [p for p in sorted(HOSTILE.glob("*.cu")) if "constructor" in p.read_text() or "thief" in p.read_text()]
    assert len(payloads) >= 8
    for p in payloads:
        text = '#define HOSTILE_OUT "/nonexistent/out"\n#define HOSTILE_SECRET "/nonexistent/key"\n' + p.read_text()
        res = build.run(Candidate.of("mini_gpu_swiglu_tensor", _swiglu(text)), GateContext(target, build_cache=build_cache))
        assert not res.ok and res.check == "load-time", (p.name, res.summary)
