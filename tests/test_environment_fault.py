"""An environment fault is never a candidate's failure (issue: three paid answers asked to fix a missing
cublas_v2.h, and ds4_gpu_init marked exhausted).

A toolkit without a header the target's conventions include is simulated two ways: a target that
declares a toolkit header no toolkit has (caught by the preflight, porter/commands/doctor.py), and a conventions
header that includes one without declaring it (caught by compiling the glue and a placeholder before the
first answer, porter/gates/build.check_environment).  Either way: exit 2 with one line, no provider call,
no attempt recorded.
"""

from __future__ import annotations

import json

import pytest

from conftest import needs_nvcc
from porter import cli
from porter import run as run_mod
from porter.errors import EnvironmentFault
from porter.gates import build
from porter.gates.driver import Candidate, GateContext
from porter.providers.base import Completion, Provider
from porter.target import load_target

UNIT = "mini_gpu_tensor_bytes"
ANSWER = ('```cuda\n#include "mini_cuda.cuh"\n'
          'extern "C" uint64_t mini_gpu_tensor_bytes(const mini_gpu_tensor *t) { return t ? t->bytes : 0; }\n```\n')
MISSING = "porter_test_no_such_toolkit_header.h"


class Counting(Provider):
    name = "counting"

    def __init__(self):
        self.calls = 0

    def complete(self, req):
        self.calls += 1
        return Completion(text=ANSWER, provider=self.name, model="m", usage={"input_tokens": 1, "output_tokens": 1})

    def describe(self) -> str:
        return "counting"


@pytest.fixture
def counting(monkeypatch):
    p = Counting()
    monkeypatch.setattr(run_mod, "get_provider", lambda *a, **k: p)
    return p


def _ledger_kinds(ws) -> list[str]:
    path = ws / "ledger" / "ledger.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line).get("kind") for line in path.read_text().splitlines() if line.strip()]


def _run(ws, capsys) -> tuple[int, str]:
    rc = cli.main(["-C", str(ws), "run", "--unit", UNIT, "--max-attempts", "3", "--quiet"])
    return rc, capsys.readouterr().err


def _header_includes_missing(ws) -> None:
    """What a toolkit without cuBLAS looks like to the build: the conventions header's include fails."""
    conv = ws / "targets" / "minimoe" / "cuda" / "mini_cuda.cuh"
    conv.write_text(conv.read_text().replace("#include <stdint.h>", f"#include <stdint.h>\n#include <{MISSING}>", 1))


@needs_nvcc
def test_a_declared_header_the_toolkit_lacks_stops_the_run_before_any_answer(workspace, counting, capsys, build_cache):
    toml = workspace / "targets" / "minimoe" / "target.toml"
    toml.write_text(toml.read_text().replace('link_flags = ["-shared", "-lcudart"]',
                                             f'link_flags = ["-shared", "-lcudart"]\ntoolkit_headers = ["{MISSING}"]'))
    rc, err = _run(workspace, capsys)
    assert rc == 2 and counting.calls == 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and MISSING in lines[0] and lines[0].startswith("porter: error: headers:")
    assert "attempt" not in _ledger_kinds(workspace)


@needs_nvcc
def test_an_undeclared_missing_header_stops_the_run_before_any_answer(workspace, counting, capsys, build_cache):
    _header_includes_missing(workspace)
    rc, err = _run(workspace, capsys)
    assert rc == 2 and counting.calls == 0, err
    line = err.strip().splitlines()[-1]
    assert "build environment is broken, not the candidate" in line and MISSING in line
    assert not {"attempt", "failure", "exhausted"} & set(_ledger_kinds(workspace))


@needs_nvcc
def test_a_fault_met_during_an_attempt_stops_the_run_and_charges_nothing(workspace, counting, capsys, build_cache,
                                                                      monkeypatch):
    """The environment broke after the run's check (or the check missed it): the build finds the glue
    failing, the attempt it opened is given up, the unit is neither failing nor exhausted."""
    from porter.records.history import History

    monkeypatch.setattr(run_mod, "check_environment", lambda *a, **k: None)
    _header_includes_missing(workspace)
    rc, err = _run(workspace, capsys)
    assert rc == 2 and counting.calls == 1, err  # one answer, then the run stopped
    assert "build environment is broken" in err.strip().splitlines()[-1]
    kinds = _ledger_kinds(workspace)
    assert "failure" not in kinds and "exhausted" not in kinds and "reconcile" in kinds
    uh = History.read(workspace, "minimoe").unit(UNIT)
    assert not uh.failures_since_step and not uh.live_attempts  # the opened attempt counts for nothing


@needs_nvcc
def test_the_build_gate_raises_rather_than_refusing_the_candidate(workspace, build_cache):
    _header_includes_missing(workspace)
    target = load_target(workspace, "minimoe")
    src = ANSWER.split("\n", 1)[1].rsplit("```", 1)[0]
    with pytest.raises(EnvironmentFault, match=MISSING):
        build.run(Candidate.of(UNIT, src), GateContext(target, build_cache=build_cache))
    with pytest.raises(EnvironmentFault, match="mini_cuda_glue.cu does not compile"):
        build.check_environment(target, build_cache)


@needs_nvcc
def test_a_candidates_own_error_is_still_its_failure(workspace, build_cache):
    target = load_target(workspace, "minimoe")
    src = ANSWER.split("\n", 1)[1].rsplit("```", 1)[0].replace("t->bytes", "t->no_such_field")
    res = build.run(Candidate.of(UNIT, src), GateContext(target, build_cache=build_cache))
    assert not res.ok and res.check == "compile" and "no_such_field" in res.summary
