"""The two calls the lead wires in: status's prefill line, and porter run's e2e step.

    state, commit, reason = prefill_status(workspace, target, ledger_records)
    res = run_e2e_if_due(target, workspace, library, unit_states, prefill_units, ledger_records,
                         record=lambda res: <append a "gate" record with gate "e2e", storing res.evidence>)

`ledger_records` are the ledger's records (oldest first); an e2e record counts
through its evidence only (porter.gates.e2e.state.e2e_records_from_ledger).
`unit_states` maps unit -> status word ("verified", "stale", ...), and
`prefill_units` are the units ranked on the prefill tier (porter.plan).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from porter.gates.e2e import tree
from porter.gates.e2e.gate import E2EOptions, run_e2e
from porter.gates.e2e.state import e2e_due, e2e_records_from_ledger, prefill_state
from porter.gates.result import GateResult


def head_backend_tree(workspace: Path, target) -> str | None:
    return tree.tree_hash_at(Path(workspace), tree.backend_dirs(target))


def prefill_status(workspace: Path, target, ledger_records: list[dict]) -> tuple[str, str | None, str]:
    records = e2e_records_from_ledger(Path(workspace), target.name, ledger_records)
    return prefill_state(records, head_backend_tree(workspace, target))


def run_e2e_if_due(target, workspace: Path, library: Path, unit_states: dict[str, str], prefill_units: list[str],
                   ledger_records: list[dict], *, record: Callable[[GateResult], object],
                   options: E2EOptions | None = None, run=run_e2e) -> GateResult | None:
    """Run the e2e gate when every prefill-tier unit is verified and the backend tree at HEAD has no
    e2e record yet; hand the result to `record` (the caller stores evidence and appends the ledger
    record, so the gate itself stores nothing here).  None when not due."""
    records = e2e_records_from_ledger(Path(workspace), target.name, ledger_records)
    due, _why = e2e_due(unit_states, prefill_units, records, head_backend_tree(workspace, target))
    if not due:
        return None
    opts = options or E2EOptions()
    opts.store = False
    res = run(target, Path(workspace), Path(library), options=opts)
    record(res)
    return res
