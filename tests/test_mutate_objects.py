"""Mutants sorted by the machine code they compile to (porter/calibration/mutate/objects.py, fingerprint.py):
equivalent to the known-good when nvcc made the same code (dead code, `x * 1`), one mutant when two made the
same code, did-not-build with nvcc's first error.  The compiles are the build gate's (nvcc needed)."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import pytest

from porter.calibration.mutate import fingerprint
from porter.calibration.mutate.generate import Mutation, candidates, operators_named
from porter.calibration.mutate.objects import DID_NOT_BUILD, DISTINCT, DUPLICATE, EQUIVALENT, build_all, classify
from porter.gates import build as build_gate
from porter.target import load_target

from conftest import needs_nvcc

REPO = Path(__file__).resolve().parents[1]
UNIT = "mini_gpu_swiglu_tensor"

# minimoe's good swiglu with one line of dead code: a mutant there changes no machine code
KNOWN_GOOD = r'''#include "mini_cuda.cuh"

static __global__ void swiglu_kernel(float *out, const float *gate, const float *up, uint64_t n) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        if (0) out[i] = 3.0f * g;
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

extern "C" int mini_gpu_swiglu_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *gate,
                                      const mini_gpu_tensor *up, uint64_t n) {
    if (out == nullptr || gate == nullptr || up == nullptr) return -1;
    if (n == 0) return 0;
    const unsigned threads = 256;
    uint64_t blocks = (n + threads - 1) / threads;
    swiglu_kernel<<<(unsigned)blocks, threads, 0, mini_cuda_stream()>>>(
        (float *)out->data, (const float *)gate->data, (const float *)up->data, n);
    return MINI_CUDA_LAUNCH_OK("swiglu_kernel") ? 0 : -1;
}
'''


def crafted(source: str, tag: str) -> Mutation:
    """A hand-made mutation of KNOWN_GOOD (the object tests need exact code, not a sample)."""
    return Mutation(UNIT, "arith", 1, 1, "swiglu_kernel", "kernel", "", "", tag, tag.ljust(12, "0")[:12], source)


# -- fingerprint, no compiler ------------------------------------------------------------------------------

def test_the_module_id_is_masked_keeping_every_offset():
    a = b"head _1a2b3c4d_25_mini_gpu_swiglu_tensor_cu_9f8e7d6c tail"
    b = b"head _00ff00ff_25_mini_gpu_swiglu_tensor_cu_12345678 tail"
    assert a != b and fingerprint.mask(a, UNIT) == fingerprint.mask(b, UNIT)
    assert len(fingerprint.mask(a, UNIT)) == len(a)
    # a mangled name follows the id directly: its length digits are code (nvcc without the split compile)
    k13 = b"_1a2b3c4d_25_mini_gpu_swiglu_tensor_cu_9f8e7d6c13swiglu_kernel"
    assert fingerprint.mask(k13, UNIT) != fingerprint.mask(k13.replace(b"c13s", b"c14s"), UNIT)
    other = b"head _1a2b3c4d_25_mini_gpu_add_tensor_cu_9f8e7d6c tail"
    assert fingerprint.mask(other, UNIT) == other  # another unit's id is code, not noise
    assert fingerprint.digest_bytes(a, UNIT) == fingerprint.digest_bytes(b, UNIT)
    assert fingerprint.digest_bytes(a, UNIT) != fingerprint.digest_bytes(a.replace(b"tail", b"tall"), UNIT)


def _fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    body = b""
    for kind, arch, payload in entries:
        head = struct.pack("<HHIQ", kind, 0x0101, 64, len(payload)) + bytes(12) + struct.pack("<I", arch) + bytes(32)
        body += head + payload
    return struct.pack("<IHHQ", fingerprint.FATBIN_MAGIC, 1, 16, len(body)) + body


def test_fatbinary_entries_are_read_by_kind_and_architecture():
    blob = _fatbin([(2, 90, b"\x7fELF-cubin-90"), (1, 90, b"ptx for 90"), (1, 100, b"ptx for 100")])
    assert fingerprint.fatbin_entries(blob) == [(2, 90, b"\x7fELF-cubin-90"), (1, 90, b"ptx for 90"),
                                                (1, 100, b"ptx for 100")]
    assert fingerprint.fatbin_entries(b"not a fatbinary") == []


# -- compiled: the build gate's objects ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def target():
    return load_target(REPO, "minimoe")


@needs_nvcc
def test_dead_code_and_times_one_are_equivalent_a_real_change_is_not_and_same_code_is_one_mutant(target, build_cache):
    constants = candidates(UNIT, KNOWN_GOOD, operators_named(["constant"]))
    dead = next(m for m in constants if m.original == "3.0f")  # `if (0) out[i] = 3.0f * g;`
    real = next(m for m in constants if m.original == "1.0f" and m.replacement == "2.0f")
    times_one = crafted(KNOWN_GOOD.replace("* up[i];", "* up[i] * 1.0f;"), "times-one")
    same_as_real = crafted(real.source.replace("2.0f + expf", "2.00f + expf"), "spelled-again")
    broken = crafted(KNOWN_GOOD.replace("* up[i];", "* up[i] * nothing;"), "undeclared")
    built = build_all(target, {UNIT: KNOWN_GOOD}, [dead, real, times_one, same_as_real, broken], build_cache, jobs=2)
    status = {b.mutation.id: b.status for b in built}
    assert status == {dead.id: EQUIVALENT, real.id: DISTINCT, times_one.id: EQUIVALENT,
                      same_as_real.id: DUPLICATE, broken.id: DID_NOT_BUILD}
    assert built[3].same_as == real.id
    assert "nothing" in built[4].error and "error" in built[4].error


@needs_nvcc
def test_the_module_id_of_an_anonymous_namespace_does_not_hide_equal_code(target, build_cache):
    """Names in an anonymous namespace carry the module id on the host and in the cubin: without the mask,
    `x * 1` would read as a change there."""
    anon = KNOWN_GOOD.replace("static __global__ void swiglu_kernel", "namespace {\n__global__ void swiglu_kernel") \
        .replace('\nextern "C"', '\n}  // namespace\nextern "C"', 1)
    times_one = crafted(anon.replace("* up[i];", "* up[i] * 1.0f;"), "anon-times-one")
    good_obj = build_gate.compile_object(target, UNIT, anon.encode(), build_cache)[0]
    mut_obj = build_gate.compile_object(target, UNIT, times_one.source.encode(), build_cache)[0]
    assert good_obj.read_bytes() != mut_obj.read_bytes(), "the raw objects differ (module ids)"
    assert fingerprint.digest(good_obj, UNIT) == fingerprint.digest(mut_obj, UNIT)
    assert [b.status for b in build_all(target, {UNIT: anon}, [times_one], build_cache, jobs=1)] == [EQUIVALENT]


@needs_nvcc
def test_a_section_named_after_an_anonymous_namespace_symbol_does_not_hide_equal_code(target, build_cache):
    """libcu++'s `cuda::std::ignore` sits in an anonymous namespace, in a section named after it
    (`.rodata._ZN4cuda3std3__4<module id>ignoreE`): every ds4 slice includes it, and with the id unmasked in
    section names none of 1071 built ds4 mutants was ever equivalent or a duplicate."""
    src = "#include <cuda/std/tuple>\n" + KNOWN_GOOD
    times_one = crafted(src.replace("* up[i];", "* up[i] * 1.0f;"), "libcu-times-one")
    good_obj = build_gate.compile_object(target, UNIT, src.encode(), build_cache)[0]
    names = [name for name, *_ in fingerprint._sections(good_obj.read_bytes())]
    assert any(fingerprint.module_id_pattern(UNIT).search(n) for n in names), names  # the case this is about
    assert [b.status for b in build_all(target, {UNIT: src}, [times_one], build_cache, jobs=1)] == [EQUIVALENT]


def test_classification_follows_the_order_the_mutants_came_in():
    ms = [crafted("a", "first"), crafted("b", "second"), crafted("c", "third"), crafted("d", "fourth")]
    got = classify(ms, ["X", "Y", "X", build_gate.CompileFailure(UNIT, "u.cu(3): error: bad")], known_good="Y")
    assert [(b.status, b.same_as) for b in got] == [(DISTINCT, None), (EQUIVALENT, None), (DUPLICATE, ms[0].id),
                                                     (DID_NOT_BUILD, None)]
    assert got[3].error == "u.cu(3): error: bad"
    swapped = classify([ms[2], ms[0]], ["X", "X"], known_good="Y")
    assert [(b.status, b.same_as) for b in swapped] == [(DISTINCT, None), (DUPLICATE, ms[2].id)]


def test_a_known_good_that_does_not_compile_is_one_line(target, tmp_path, monkeypatch):
    from porter.calibration.mutate import objects
    from porter.errors import PorterError

    def refuse(*a, **k):
        raise build_gate.CompileFailure(UNIT, "mini_gpu_swiglu_tensor.cu(4): error: expected a ;\nmore")

    monkeypatch.setattr(objects.build_gate, "compile_object", refuse)
    with pytest.raises(PorterError, match=r"^the known-good mini_gpu_swiglu_tensor does not compile: .*expected a ;$"):
        build_all(target, {UNIT: KNOWN_GOOD}, [replace(crafted("x", "m"))], tmp_path)
