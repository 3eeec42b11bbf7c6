"""Gates: the checks a candidate unit must pass, cheapest first (porter.gates.registry lists them).

extract (porter.gates.extract) -> static -> build -> parity -> (perf) -> e2e.
Every gate returns a porter.gates.result.GateResult whose `evidence` the loop
stores content-addressed in the ledger.
"""
