"""Running an e2e calibration: every backend of the target's variants.toml through the same prefill."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from porter.errors import PorterError
from porter.gates.e2e import calibration as cal_mod
from porter.gates.e2e.compare import Comparison, compare, worst


UNIT_SWAP_BASE = "cuda-scripted"  # the backend the adversarial units are swapped into (variants.toml)


def calibrate_minimoe(target, scratch: Path, mode: str, model: Path | None = None, out=print) -> cal_mod.Calibration:
    from porter.gates.e2e.minimoe import Backend, CudaLibraries, MinimoeEngine, plan_variants

    spec = target.spec.e2e
    if mode not in ("cpu", "cuda"):
        raise PorterError(f"calibration mode {mode!r} (cpu or cuda)")
    eng = MinimoeEngine(target, scratch, model, n_prompt=spec.prompt_tokens, n_decode=spec.decode_steps)
    ref = eng.run(eng.build(Backend("reference")), "reference")
    out(f"reference  mini_cpu.c -O2: {ref.wall_s:.2f}s, tokens {' '.join(map(str, ref.tokens))}")
    t0 = time.monotonic()
    cuda = CudaLibraries(target, scratch) if mode == "cuda" else None
    plans = plan_variants(target, mode, cuda)
    if cuda:
        out(f"built {len({p.backend.library for p in plans if p.backend.library})} CUDA libraries in "
            f"{time.monotonic() - t0:.1f}s")
    variants, runs = [], {}
    for p in plans:
        try:  # each backend as the gate runs a candidate: [e2e] runs prefills, the worst judged
            built = eng.build(p.backend)
            outs = [eng.run(built, p.name) for _ in range(spec.runs)]
            cand = runs[p.name] = outs[0]
            cmp, wall = worst([compare(ref, o) for o in outs]), cand.wall_s
        except PorterError as exc:
            # A backend that crashes or refuses is a measured outcome: it can never be accepted.
            cmp = Comparison(ref.stage_names, _inf_like(ref), float("inf"), ref.tokens, [], problem=f"run failed: {exc}")
            wall = None
        # a unit swapped into the scripted backend whose prefill equals that backend's bit for bit is wrong
        # only at shapes the engine never uses (parity's odd sizes catch it): unreached, as for ds4's mutants
        base = runs.get(UNIT_SWAP_BASE)
        cand = runs.get(p.name)
        unreached = (p.kind == "broken" and p.name.startswith("unit:") and base is not None and cand is not None
                     and np.array_equal(cand.states, base.states) and np.array_equal(cand.logits, base.logits))
        variants.append(cal_mod.Variant(p.name, p.kind, cmp, p.why, wall, unreached))
    setup = dict(eng.setup(), runs=spec.runs)
    setup["mode"] = mode
    if mode == "cuda":
        from porter.gates.e2e.gate import _toolchain

        setup["device"] = _toolchain().get("gpu")
    return cal_mod.calibrate(variants, tokens_exact=spec.decode_steps > 0, setup=setup)


def _inf_like(ref):
    import numpy as np

    return np.full(ref.states.shape[:2], np.inf)
