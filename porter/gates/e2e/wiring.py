"""The two calls the lead wires in: status's prefill line, and porter run's e2e step.

    state, commit, reason = prefill_status(workspace, target, ledger_records)
    res = run_e2e_if_due(target, workspace, unit_states, prefill_units, ledger_records, run=<build + e2e gate>,
                         record=lambda res: <append a "gate" record with gate "e2e", storing res.evidence>)

`ledger_records` are porter.history's typed records (oldest first); an e2e record counts
through its evidence only (porter.gates.e2e.state.e2e_records_from_ledger).
`unit_states` maps unit -> status word ("verified", "stale", ...), and
`prefill_units` are the units ranked on the prefill tier (porter.plan).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from porter.gates.e2e import tree
from porter.gates.e2e.state import e2e_due, e2e_records_from_ledger, prefill_state
from porter.gates.result import GateResult


def head_backend_tree(workspace: Path, target) -> str | None:
    return tree.tree_hash_at(Path(workspace), tree.backend_dirs(target))


def prefill_status(workspace: Path, target, ledger_records: list) -> tuple[str, str | None, str]:
    records = e2e_records_from_ledger(Path(workspace), target.name, ledger_records)
    return prefill_state(records, head_backend_tree(workspace, target))


def run_e2e_if_due(target, workspace: Path, unit_states: dict[str, str], prefill_units: list[str],
                   ledger_records: list, *, run: Callable[[], GateResult],
                   record: Callable[[GateResult], object]) -> GateResult | None:
    """Run the e2e gate (`run`: porter run builds the backend and calls the gate through the driver)
    when every prefill-tier unit is verified and the backend tree at HEAD has no e2e record yet; hand
    the result to `record`.  None when not due."""
    records = e2e_records_from_ledger(Path(workspace), target.name, ledger_records)
    due, _why = e2e_due(unit_states, prefill_units, records, head_backend_tree(workspace, target))
    if not due:
        return None
    res = run()
    record(res)
    return res
