"""Extraction: exactly one fenced block defining the unit, or a one-line refusal."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from porter.errors import PorterError
from porter.gates.extract import MAX_RESPONSE_BYTES, ExtractionError, extract_unit_source
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
UNIT = "mini_gpu_add_tensor"
GOOD = '''#include "mini_cuda.cuh"

static __global__ void add_kernel(float *o, const float *a, const float *b, uint64_t n) {
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = a[i] + b[i];
}

extern "C" int mini_gpu_add_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *a,
                                   const mini_gpu_tensor *b, uint64_t n) {
    if (!out || !a || !b) return -1;
    add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, mini_cuda_stream()>>>(
        (float *)out->data, (const float *)a->data, (const float *)b->data, n);
    return MINI_CUDA_LAUNCH_OK("add") ? 0 : -1;
}
'''


@pytest.fixture(scope="module")
def target():
    return load_target(REPO, "minimoe")


def answer(*blocks: tuple[str, str], prose: str = "Here is the port.") -> str:
    parts = [prose]
    for lang, code in blocks:
        parts.append(f"```{lang}\n{code}```")
        parts.append("Some notes.")
    return "\n\n".join(parts)


def refused(text: str, target, unit: str = UNIT) -> str:
    with pytest.raises(ExtractionError) as exc:
        extract_unit_source(text, unit, target)
    msg = str(exc.value)
    assert "\n" not in msg and msg
    assert isinstance(exc.value, PorterError)
    return msg


@pytest.mark.parametrize("lang", ["cuda", "cu", "cpp", "c++", "c", ""])
def test_one_block_defining_the_unit_is_taken_as_is(target, lang):
    assert extract_unit_source(answer((lang, GOOD)), UNIT, target) == GOOD


def test_blocks_in_other_languages_and_usage_sketches_are_ignored(target):
    text = answer(("bash", "nvcc -c x.cu\n"), ("cuda", GOOD), ("cpp", "mini_gpu_add_tensor(out, a, b, n);\n"))
    assert extract_unit_source(text, UNIT, target) == GOOD


def test_tilde_fences_work(target):
    assert extract_unit_source(f"prose\n~~~cuda\n{GOOD}~~~\n", UNIT, target) == GOOD


def test_prose_only_is_refused(target):
    msg = refused("I would launch one thread per element and add them. Done!", target)
    assert "no fenced code block" in msg and "prose only" in msg


def test_no_block_defining_the_symbol_is_refused(target):
    msg = refused(answer(("cuda", GOOD.replace("mini_gpu_add_tensor", "mini_gpu_add2"))), target)
    assert msg.startswith(f"no code block defines {UNIT}")


def test_only_non_code_blocks_is_refused(target):
    msg = refused(answer(("python", "print('hi')\n")), target)
    assert "no CUDA/C++ code block" in msg


def test_two_blocks_defining_the_symbol_are_conflicting(target):
    msg = refused(answer(("cuda", GOOD), ("cuda", GOOD.replace("256", "128"))), target)
    assert "2 code blocks define" in msg and "conflicting" in msg


def test_two_definitions_in_one_block_are_conflicting(target):
    twice = GOOD + "\n" + GOOD.split("extern", 1)[0] + "extern" + GOOD.split("extern", 1)[1].replace("add_kernel", "add_kernel2")
    msg = refused(answer(("cuda", twice)), target)
    assert "defines mini_gpu_add_tensor 2 times" in msg


def test_an_answer_over_the_size_limit_is_refused(target):
    big = answer(("cuda", GOOD + "// " + "x" * MAX_RESPONSE_BYTES + "\n"))
    msg = refused(big, target)
    assert "over the 200 KB limit" in msg


def test_unterminated_block_is_refused(target):
    msg = refused("text\n```cuda\n" + GOOD, target)
    assert "never closed" in msg


@pytest.mark.parametrize("include", ['"helpers.cuh"', '"../mini_cpu.c"', "<boost/format.hpp>", '"/etc/passwd"'])
def test_includes_outside_the_unit_are_refused(target, include):
    msg = refused(answer(("cuda", f"#include {include}\n" + GOOD)), target)
    assert "includes outside the unit" in msg and include.strip('"<>') in msg


@pytest.mark.parametrize("include", ['"mini_cuda.cuh"', '"mini_gpu.h"', "<cuda_fp16.h>", "<cub/cub.cuh>", "<stdint.h>",
                                     "<cmath>", "<cooperative_groups.h>"])
def test_conventions_cuda_and_standard_headers_are_allowed(target, include):
    src = f"#include {include}\n" + GOOD
    assert extract_unit_source(answer(("cuda", src)), UNIT, target) == src


def manifest(target):
    return tomllib.loads((target.scripted_dir / "manifest.toml").read_text())["answer"]


def test_scripted_answers_expected_to_fail_extraction_do(target):
    bad = [a for a in manifest(target) if a["expect"] == "extract"]
    assert bad, "the scripted answers should exercise the extract gate"
    for a in bad:
        refused((target.scripted_dir / a["file"]).read_text(), target, a["unit"])


def test_every_other_scripted_answer_extracts(target):
    for a in manifest(target):
        if a["expect"] != "extract":
            src = extract_unit_source((target.scripted_dir / a["file"]).read_text(), a["unit"], target)
            assert a["unit"] in src
