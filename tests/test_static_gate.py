"""Static gate: every kind of non-port it exists to refuse FAILS it; real ports pass."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from porter.gates.driver import Candidate, GateContext, ParityOptions
from porter.gates.extract import extract_unit_source
from porter.gates import static
from porter.target.placeholder import placeholder_source
from porter.target import load_target

REPO = Path(__file__).resolve().parents[1]
UNIT = "mini_gpu_add_tensor"
HEAD = "extern \"C\" int mini_gpu_add_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *a,\n" \
       "                                   const mini_gpu_tensor *b, uint64_t n)"
KERNEL = '''#include "mini_cuda.cuh"

static __global__ void add_kernel(float *o, const float *a, const float *b, uint64_t n) {
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = a[i] + b[i];
}
'''
WORK = '''    add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, mini_cuda_stream()>>>(
        (float *)out->data, (const float *)a->data, (const float *)b->data, n);
    return MINI_CUDA_LAUNCH_OK("add") ? 0 : -1;
'''
GOOD = KERNEL + "\n" + HEAD + " {\n    if (!out || !a || !b) return -1;\n" + WORK + "}\n"


def unit_with_body(body: str, head: str = HEAD, prelude: str = KERNEL) -> str:
    return prelude + "\n" + head + " {\n" + body + "\n}\n"


@pytest.fixture(scope="module")
def target():
    return load_target(REPO, "minimoe")


def verdict(target, source: str, unit: str = UNIT):
    res = static.run(Candidate.of(unit, source), GateContext(target))
    assert res.gate == "static" and "\n" not in res.summary
    assert res.evidence["candidate_sha256"] and res.evidence["unit"] == unit
    return res


def refused(target, source: str, unit: str = UNIT) -> str:
    res = verdict(target, source, unit)
    assert not res.ok, f"static gate passed a candidate it must refuse: {source}"
    return res.summary


def test_a_real_port_passes(target):
    res = verdict(target, GOOD)
    assert res.ok, res.summary


def test_the_generated_placeholder_is_refused(target):
    src = placeholder_source(target.api_function(UNIT), "mini_cuda.cuh")
    assert "placeholder" in refused(target, src)


def test_marker_anywhere_is_refused(target):
    assert "placeholder" in refused(target, "// porter:placeholder\n" + GOOD)


def test_missing_definition_is_refused(target):
    assert "does not define mini_gpu_add_tensor" in refused(target, GOOD.replace("mini_gpu_add_tensor", "mini_gpu_add"))


def test_definition_only_inside_if0_is_refused(target):
    assert "does not define" in refused(target, "#if 0\n" + GOOD + "#endif\n")


def test_other_api_functions_in_the_file_are_refused(target):
    extra = '\nextern "C" int mini_gpu_synchronize(void) { return cudaStreamSynchronize(mini_cuda_stream()) == cudaSuccess ? 0 : -1; }\n'
    assert "also defines mini_gpu_synchronize" in refused(target, GOOD + extra)


def test_missing_c_linkage_is_refused(target):
    assert "without C linkage" in refused(target, GOOD.replace('extern "C" ', ""))


def test_c_linkage_block_is_accepted(target):
    src = KERNEL + '\nextern "C" {\n' + HEAD.replace('extern "C" ', "") + " {\n" + WORK + "}\n}\n"
    assert verdict(target, src).ok


def test_parameter_count_drift_is_refused_with_both_counts(target):
    head = 'extern "C" int mini_gpu_add_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *a, const mini_gpu_tensor *b)'
    msg = refused(target, unit_with_body("    uint64_t n = out->bytes / 4;\n" + WORK, head))
    assert "3 parameters, header has 4" in msg


def test_thirteen_versus_fourteen_style_drift_names_the_counts(target):
    fn = target.api_function("mini_gpu_attention_window_tensor")
    params = ", ".join(f"{p.type} {p.name}" for p in fn.params[:-1])  # drop `scale`
    src = KERNEL + f'\nextern "C" int mini_gpu_attention_window_tensor({params}) {{\n' \
                   '    add_kernel<<<1, 1, 0, mini_cuda_stream()>>>((float *)out->data, (const float *)q->data, (const float *)q->data, 1);\n' \
                   "    return 0;\n}\n"
    assert f"{len(fn.params) - 1} parameters, header has {len(fn.params)}" in refused(target, src, fn.name)


def test_parameter_type_drift_names_the_parameter(target):
    msg = refused(target, GOOD.replace("const mini_gpu_tensor *b, uint64_t n)", "const mini_gpu_tensor *b, uint32_t n)"))
    assert "parameter 4 (`n`)" in msg and "uint32_t" in msg and "uint64_t" in msg


def test_return_type_drift_is_refused(target):
    assert "returns `long`" in refused(target, GOOD.replace('extern "C" int mini_gpu_add', 'extern "C" long mini_gpu_add'))


def test_equivalent_spellings_of_the_signature_pass(target):
    src = GOOD.replace("const mini_gpu_tensor *a", "struct mini_gpu_tensor const* a")
    assert verdict(target, src).ok


STUBS = {
    "constant -1": "    return -1;",
    "casts then -1": "    (void)out; (void)a; (void)b; (void)n;\n    return -1;",
    "todo then 0": "    // TODO: port the Metal kernel\n    return 0;",
    "not implemented message": '    fprintf(stderr, "mini_gpu_add_tensor: not implemented\\n");\n    return -1;',
    "empty": "",
    "comment only": "    /* FIXME */",
    "NULL": "    return NULL;",
    "dead code after return": "    return -1;\n" + WORK,
    "if 1": "    if (1) return -1;\n" + WORK,
    "if true block": "    if (true) { return -1; }\n" + WORK,
    "unsigned >= 0": "    if (n >= 0) return -1;\n" + WORK,
    "constant or": "    if (!out || 1) return -1;\n" + WORK,
    "if 0 around the work": "#if 0\n" + WORK + "#endif\n    return -1;",
    "checks then success": "    if (!out || !a || !b) return -1;\n    if (n == 0) return 0;\n    return 0;",
}


@pytest.mark.parametrize("name", list(STUBS))
def test_stub_bodies_are_refused(target, name):
    msg = refused(target, unit_with_body(STUBS[name]))
    assert "stub body" in msg, msg


def test_stub_macro_is_expanded_and_refused(target):
    src = "#define STUB return -1\n" + unit_with_body("    STUB;")
    assert "stub body" in refused(target, src)
    src = "#define NOT_IMPLEMENTED(name) do { return -1; } while (0)\n" + unit_with_body('    NOT_IMPLEMENTED("add");')
    assert "stub body" in refused(target, src)


def test_host_side_shortcut_is_refused(target):
    body = """    float *o = (float *)out->data;
    const float *x = (const float *)a->data, *y = (const float *)b->data;
    for (uint64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
    return 0;"""
    assert "host-side shortcut" in refused(target, unit_with_body(body))


def test_kernel_in_an_uncalled_helper_is_still_a_shortcut(target):
    helper = KERNEL + "\nstatic int launch_add(float *o, const float *a, const float *b, uint64_t n) {\n" \
                      "    add_kernel<<<1, 256, 0, mini_cuda_stream()>>>(o, a, b, n);\n    return 0;\n}\n"
    body = "    cudaStreamSynchronize(mini_cuda_stream());\n    return out ? 0 : -1;"
    assert "host-side shortcut" in refused(target, unit_with_body(body, prelude=helper))


def test_launch_through_a_helper_passes(target):
    helper = KERNEL + "\ntemplate <int B>\nstatic int launch_add(float *o, const float *a, const float *b, uint64_t n) {\n" \
                      "    add_kernel<<<(unsigned)((n + B - 1) / B), B, 0, mini_cuda_stream()>>>(o, a, b, n);\n" \
                      '    return MINI_CUDA_LAUNCH_OK("add") ? 0 : -1;\n}\n'
    body = "    if (!out) return -1;\n    return launch_add<256>((float *)out->data, (const float *)a->data, (const float *)b->data, n);"
    res = verdict(target, unit_with_body(body, prelude=helper))
    assert res.ok, res.summary


def test_device_copy_counts_as_device_work(target):
    body = "    if (!out) return -1;\n    return cudaMemcpyAsync(out->data, a->data, n * 4, cudaMemcpyDeviceToDevice, mini_cuda_stream()) == cudaSuccess ? 0 : -1;"
    assert verdict(target, unit_with_body(body)).ok


def test_composing_other_op_units_counts_as_device_work(target):
    body = "    if (mini_gpu_swiglu_tensor(out, a, b, n) != 0) return -1;\n    return 0;"
    assert verdict(target, unit_with_body(body)).ok


def test_runtime_units_need_no_kernel(target):
    src = '#include "mini_cuda.cuh"\nextern "C" uint64_t mini_gpu_tensor_bytes(const mini_gpu_tensor *tensor) {\n' \
          "    return tensor ? tensor->bytes : 0;\n}\n"
    assert verdict(target, src, "mini_gpu_tensor_bytes").ok
    stub = '#include "mini_cuda.cuh"\nextern "C" uint64_t mini_gpu_tensor_bytes(const mini_gpu_tensor *tensor) {\n    return 0;\n}\n'
    assert "stub body" in refused(target, stub, "mini_gpu_tensor_bytes")


def test_void_runtime_unit_that_returns_early_is_refused(target):
    src = '#include "mini_cuda.cuh"\nextern "C" void mini_gpu_tensor_free(mini_gpu_tensor *tensor) {\n    (void)tensor;\n    return;\n}\n'
    assert "stub body" in refused(target, src, "mini_gpu_tensor_free")


# ---- the scripted answers (targets/minimoe/scripted) -----------------------


def scripted(target):
    return tomllib.loads((target.scripted_dir / "manifest.toml").read_text())["answer"]


def candidate(target, a) -> str:
    return extract_unit_source((target.scripted_dir / a["file"]).read_text(), a["unit"], target)


def test_scripted_answers_expected_to_fail_static_do(target):
    bad = [a for a in scripted(target) if a["expect"] == "static"]
    assert bad, "the scripted answers should exercise the static gate"
    for a in bad:
        res = static.run(Candidate.of(a["unit"], candidate(target, a)), GateContext(target))
        assert not res.ok, f"{a['file']} ({a['why']}) passed the static gate"


def test_every_good_scripted_answer_passes(target):
    good = [a for a in scripted(target) if a["expect"] == "pass"]
    assert {a["unit"] for a in good} == set(target.units)
    for a in good:
        res = static.run(Candidate.of(a["unit"], candidate(target, a)), GateContext(target))
        assert res.ok, f"{a['file']}: {res.summary}"


def test_answers_for_later_gates_pass_static(target):
    """Refusing them here would hide whether the build/parity gates catch them."""
    for a in scripted(target):
        if a["expect"] in ("build", "parity", "perf"):
            res = static.run(Candidate.of(a["unit"], candidate(target, a)), GateContext(target))
            assert res.ok, f"{a['file']}: {res.summary}"
