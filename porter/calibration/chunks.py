"""A target's specs in n chunks of about equal calibration work, for runs under a time limit.

    porter calibrate --target ds4 --known-good upstream --chunk 2/3
    porter dev trace --target ds4 --chunk 2/3
    porter dev chunks --target ds4 --weights 1/3   (each chunk's specs and work)

A device call ends after ten minutes, and `porter calibrate --known-good upstream`
over all of ds4 (57 specs, their env-knob variants, 134 mutants) is more than
one call.  Each spec's work is about one parity run per known-good, variant
and mutant, so the chunks are filled heaviest first, each spec into the chunk
with the least work so far (the classic longest-first schedule).  The union of
the n chunks is every spec that `porter calibrate` runs by default, each once.
"""

from __future__ import annotations

import argparse
import re
import sys

from porter.errors import PorterError


def unit_weights(target) -> dict[str, int]:
    """spec -> parity runs its calibration makes (known-good + variants + mutants)."""
    from porter.calibration.calibrator import calibration_runs
    from porter.gates.mutants import load_mutants
    from porter.calibration.variants import VariantPlan
    from porter.spec import load_specs

    plan = VariantPlan(target) if target.checkout else None
    mutants = load_mutants(target)
    return {u: calibration_runs(u, plan, mutants) for u in sorted(load_specs(target))}


def parse_chunk(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise PorterError(f"chunk {text!r}: expected i/n with 1 <= i <= n (e.g. 2/3)")
    return int(m.group(1)), int(m.group(2))


def split(weights: dict[str, int], n: int) -> list[list[str]]:
    """n lists of units, filled heaviest first into the lightest list (ties: by name, then list order)."""
    chunks: list[list[str]] = [[] for _ in range(n)]
    load = [0] * n
    for unit in sorted(weights, key=lambda u: (-weights[u], u)):
        k = min(range(n), key=lambda i: (load[i], i))
        chunks[k].append(unit)
        load[k] += weights[unit]
    return [sorted(c) for c in chunks]


def chunk_units(target, chunk: str, units: list[str] | None = None) -> list[str]:
    """The chunk `i/n` of `units` (default: every spec), balanced by calibration work."""
    i, n = parse_chunk(chunk)
    weights = unit_weights(target)
    if units is not None:
        weights = {u: weights.get(u, 1) for u in units}
    return split(weights, n)[i - 1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="porter dev chunks", description=__doc__.split("\n\n")[0])
    ap.add_argument("-C", dest="workspace", default=".")
    ap.add_argument("--target", required=True)
    ap.add_argument("--source", default=None)
    ap.add_argument("--weights", action="store_true", help="print each chunk's units and work instead")
    ap.add_argument("chunk", help="i/n: the i-th of n chunks")
    a = ap.parse_args(argv)
    from porter.target import load_target

    try:
        target = load_target(a.workspace, a.target, a.source)
        i, n = parse_chunk(a.chunk)
        weights = unit_weights(target)
        chunks = split(weights, n)
    except PorterError as exc:
        print(f"porter: {exc}", file=sys.stderr)
        return 2
    if a.weights:
        for k, c in enumerate(chunks, 1):
            print(f"{k}/{n}: {sum(weights[u] for u in c)} runs over {len(c)} specs: {' '.join(c)}")
        return 0
    print(" ".join(f"--unit {u}" for u in chunks[i - 1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
