"""`porter status --reverify`: run the gates again, now, on the unit files as they are.

Status normally derives each state from recorded evidence; --reverify measures
instead.  It writes nothing to the ledger (status stays a read command): what
it prints is a fresh verdict per unit beside the recorded state, and a unit
whose recorded state is contradicted by a fresh refusal makes the command exit 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from porter.errors import PorterError
from porter.gates import registry
from porter.gates.driver import Candidate, GateContext, refusal, run_gates, verdict_word
from porter.target.placeholder import is_placeholder


@dataclass
class Reverdict:
    unit: str
    verdicts: list[str]  # "static ok", "build ok", "parity skipped", ...
    ok: bool | None  # None: nothing to check (placeholder)
    summary: str

    def to_json(self) -> dict:
        return asdict(self)


def reverify(target, build_dir=None, progress=None) -> list[Reverdict]:
    """`progress`: (what, total) -> porter.term.Steps, for the units and a first build's objects."""
    from porter.term import Steps

    out: list[Reverdict] = []
    with (progress or Steps)(f"re-verifying {len(target.units)} units", len(target.units)) as steps:
        for unit in target.units:
            steps.working_on(unit)
            out.append(_reverify_unit(target, unit, build_dir, progress))
            steps.advance()
    return out


def _reverify_unit(target, unit: str, build_dir, progress) -> Reverdict:
    path = target.unit_path(unit)
    if not path.is_file():
        return Reverdict(unit, [], None, "no unit file")
    source = path.read_text(errors="replace")
    if is_placeholder(source):
        return Reverdict(unit, [], None, "placeholder: nothing to check")
    results = run_gates(Candidate.of(unit, source), GateContext(target, build_cache=build_dir, progress=progress),
                        gates=registry.names(registry.UNIT, rechecked=True))
    refused = refusal(results)
    last = refused or results[-1]
    return Reverdict(unit, [verdict_word(r) for r in results], refused is None, last.summary)


def contradicted(recorded: dict[str, str], fresh: list[Reverdict]) -> list[str]:
    """Units recorded as built/verified that a gate refuses now."""
    return [r.unit for r in fresh if r.ok is False and recorded.get(r.unit, "").startswith(("built", "verified"))]


def reverify_table(fresh: list[Reverdict]):
    """Each unit's fresh gate verdicts, the last gate's summary as the tail (term.Table: fits the width)."""
    from porter.term import Column, Table

    if not fresh:
        raise PorterError("no units to re-verify")
    table = Table([Column("unit", key=True), Column("now")], tail="summary",
                  title="re-verified now (nothing recorded):", tail_style=None)
    for r in fresh:
        table.add_row(r.unit, " · ".join(r.verdicts) or "-", tail=r.summary)
    return table
