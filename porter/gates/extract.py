"""The extract gate: the provider's answer holds exactly one unit that defines the symbol (porter.extract).

Its candidate is the answer itself; the unit it finds becomes `ctx.candidate`, the
candidate every gate after it judges.
"""

from __future__ import annotations

from porter.extract import ExtractionError, extract_unit_source
from porter.gates.driver import Candidate
from porter.gates.result import GateResult

GATE = "extract"


def run(answer, ctx) -> GateResult:
    facts = {"response_sha256": answer.sha256, "toolchain": {"extractor": "porter.extract"}}
    try:
        source = extract_unit_source(answer.source, answer.unit, ctx.target)
    except ExtractionError as exc:
        return GateResult(GATE, False, str(exc), diagnostics=str(exc), check=GATE,
                          evidence={"candidate_sha256": None, **facts})
    ctx.candidate = Candidate.of(answer.unit, source)
    return GateResult(GATE, True, f"one code block defines {answer.unit} ({len(source.splitlines())} lines)",
                      evidence={"candidate_sha256": ctx.candidate.sha256, **facts})
