"""The system prompt states the target's own rules (porter/prompt/rules.py): every unit's prompt of every
bundled target is rendered and checked against the target's declarations ([cuda.rules]), and the
declarations against the conventions header, the parity harness and [cuda] stream.

tests/data/system_rules_before_issue30.j2 is the system prompt as it was, written once for every target:
the check fails on it for ds4 ("never the default stream" while ds4 launches on the legacy default
stream; "return non-zero for invalid" while ds4's failure value is 0) and for tinytarget (it claimed
cuda_fp16.h, which tiny_cuda.cuh does not include).
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from conftest import NO_DS4, REPO, ds4_checkout
from porter.prompt import render_prompt
from porter.prompt.rules import contradictions, conventions_text
from porter.target import load_target
from porter.workspace import init_workspace

BEFORE = Path(__file__).parent / "data" / "system_rules_before_issue30.j2"
TINY = REPO / "tests" / "data" / "tinytarget"


def _workspace(tmp_path: Path, name: str):
    if name == "ds4":
        src = ds4_checkout()
        if src is None:
            pytest.skip(NO_DS4)
        ws = init_workspace(tmp_path / "ws", [name], source=src)
        return load_target(ws, name, src)
    spec = str(TINY) if name == "tinytarget" else name
    ws = init_workspace(tmp_path / "ws", [spec])
    return load_target(ws, name)


@pytest.mark.parametrize("name", ["minimoe", "tinytarget", "ds4"])
def test_every_units_prompt_agrees_with_the_targets_declarations(tmp_path, name):
    target = _workspace(tmp_path, name)
    conventions = conventions_text(target)
    seen_systems = set()
    for unit in target.units:
        req = render_prompt(target, unit, 1, []).request
        problems = contradictions(target, req.system, conventions)
        assert not problems, f"{unit}: {problems}"
        assert conventions.strip()[:200] in req.prompt  # the header the rules are checked against is the one shown
        seen_systems.add(req.system)
    assert len(seen_systems) == 1  # the rules are the target's, not the unit's


def _before(target) -> str:
    fn = next((ln.split("(")[0].split()[-1] for ln in conventions_text(target).splitlines()
               if "cudaStream_t" in ln and "(" in ln), None)
    return jinja2.Template(BEFORE.read_text(), undefined=jinja2.StrictUndefined, trim_blocks=True,
                           lstrip_blocks=True).render(
        target=target.name, conventions_name=target.conventions_header.name, api_header=target.api_header.name,
        stream_fn=fn)


def test_the_rules_written_once_for_every_target_contradict_ds4(tmp_path):
    target = _workspace(tmp_path, "ds4")
    problems = contradictions(target, _before(target), conventions_text(target))
    assert any("never the default stream" in p and "legacy default stream" in p for p in problems), problems
    assert any("'return non-zero (or the API's failure value) for invalid'" in p and "failure value is 0" in p
               for p in problems), problems


def test_the_rules_written_once_for_every_target_contradict_tinytarget(tmp_path):
    target = _workspace(tmp_path, "tinytarget")
    problems = contradictions(target, _before(target), conventions_text(target))
    assert any("brings in cuda_fp16.h; it does not" in p for p in problems), problems


def test_a_declaration_the_conventions_header_contradicts_is_caught(tmp_path):
    target = _workspace(tmp_path, "minimoe")
    toml = target.dir / "target.toml"
    toml.write_text(toml.read_text().replace('stream = "accessor"\nstream_accessor = "mini_cuda_stream"',
                                             'stream = "legacy"')
                    .replace('launch_check = \'MINI_CUDA_LAUNCH_OK("what")\'', "launch_check = 'mini_no_such(x)'")
                    .replace('success_return = "0"\nfailure_return = "-1"', 'success_return = "1"\nfailure_return = "0"'))
    legacy = load_target(target.workspace, "minimoe")
    req = render_prompt(legacy, "mini_gpu_add_tensor", 1, []).request
    problems = contradictions(legacy, req.system, conventions_text(legacy))
    assert any("declares a stream accessor mini_cuda_stream()" in p for p in problems), problems
    assert any("parity/harness.toml probes stream 'mini_cuda_stream'" in p for p in problems), problems
    assert any("[cuda] stream says 'mini_cuda_stream()'" in p for p in problems), problems
    assert any("launch_check 'mini_no_such(x)' is not offered" in p for p in problems), problems
    assert any("judges success as 'zero', but [cuda.rules] success_return is 1" in p for p in problems), problems


def test_placeholders_fail_with_the_targets_failure_value(tmp_path):
    """A placeholder answers every call with the API's failure value: ds4's is 0, and the -1 written for
    every target read as success to ds4's engine and to a runtime scenario calling a unit not ported yet."""
    from porter.target.placeholder import placeholder_source

    target = _workspace(tmp_path, "minimoe")
    add = target.api_function("mini_gpu_add_tensor")
    assert "return -1;" in target.unit_path("mini_gpu_add_tensor").read_text()
    toml = target.dir / "target.toml"
    toml.write_text(toml.read_text().replace('success_return = "0"\nfailure_return = "-1"',
                                             'success_return = "1"\nfailure_return = "0"'))
    ones = load_target(target.workspace, "minimoe")
    text = placeholder_source(add, "mini_cuda.cuh", ones.spec.cuda.rules.failure_return)
    assert "return 0;" in text and "return -1;" not in text
    alloc = placeholder_source(ones.api_function("mini_gpu_tensor_alloc"), "mini_cuda.cuh", "0")
    assert "return NULL;" in alloc
    from porter.gates import build

    ones.unit_path("mini_gpu_add_tensor").unlink()  # a deleted unit file: the build links its placeholder
    linked = build.unit_sources(ones, "mini_gpu_swiglu_tensor", "")["mini_gpu_add_tensor"].decode()
    assert "return 0;" in linked and "return -1;" not in linked
