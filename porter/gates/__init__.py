"""Gates: the checks a candidate unit must pass, cheapest first (see result.GATE_ORDER).

extract (porter.extract) -> static -> build -> parity -> (perf) -> e2e.
Every gate returns a porter.gates.result.GateResult whose `evidence` the loop
stores content-addressed in the ledger.
"""
