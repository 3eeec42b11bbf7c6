"""The e2e gate: the target's engine on the workspace's backend, compared with a reference backend.

Modules, one job each:
  compare      what a prefill yields (stage states, logits, tokens) and the per-stage, per-token NMSE
  rule         the decision rule and its verdict (which stage, which token)
  calibration  deriving the rule from known-good backends and proving it on broken ones
  tree         the backend tree hash an e2e record is bound to
  state        prefill_state (for status) and e2e_due (for porter run)
  gate         run_e2e(target, workspace_root, library_path, options=...) -> GateResult
  target_driver  what a target's e2e driver (targets/<t>/e2e/driver.py: builds and runs its engine) provides
"""

from porter.gates.e2e.gate import E2EOptions, run_e2e
from porter.gates.e2e.state import e2e_due, e2e_records_from_ledger, prefill_line, prefill_state

__all__ = ["E2EOptions", "run_e2e", "e2e_due", "e2e_records_from_ledger", "prefill_line", "prefill_state"]
