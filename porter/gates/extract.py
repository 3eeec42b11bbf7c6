"""The extract gate: its candidate is the provider's answer (porter.extract finds the unit in it);
the unit it finds becomes `ctx.candidate`, what every gate after it judges."""

from __future__ import annotations

from porter.extract import ExtractionError, extract_unit_source
from porter.gates.driver import Candidate
from porter.gates.result import GateResult


def run(answer, ctx) -> GateResult:
    facts = {"response_sha256": answer.sha256, "toolchain": {"extractor": "porter.extract"}}
    try:
        source = extract_unit_source(answer.source, answer.unit, ctx.target)
    except ExtractionError as exc:
        return GateResult("extract", False, str(exc), diagnostics=str(exc), check="extract",
                          evidence={"candidate_sha256": None, **facts})
    ctx.candidate = Candidate.of(answer.unit, source)
    return GateResult("extract", True, f"one code block defines {answer.unit} ({len(source.splitlines())} lines)",
                      evidence={"candidate_sha256": ctx.candidate.sha256, **facts})
