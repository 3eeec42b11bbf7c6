"""Each mutant compiled as the build gate compiles a unit, then sorted by the machine code it made.

The compile is porter.gates.build.compile_object: the target's flags, the forced conventions header,
the sandboxed compiler and the content-addressed object cache (so the parity run's link later finds
every object already made).  Then, in the mutants' order:

    did-not-build  nvcc refused it (its first error kept)
    equivalent     its machine code is the known-good's (porter.calibration.mutate.fingerprint):
                   equivalent by construction, nothing a test could tell apart
    duplicate      its machine code is an earlier mutant's: one mutant, run once (`same_as` names it)
    distinct       a mutant to run
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from porter.calibration.mutate import fingerprint
from porter.calibration.mutate.generate import Mutation
from porter.errors import PorterError
from porter.gates import build as build_gate
from porter.gates import build_cache

DID_NOT_BUILD, EQUIVALENT, DUPLICATE, DISTINCT = "did-not-build", "equivalent", "duplicate", "distinct"


@dataclass
class Built:
    mutation: Mutation
    status: str
    digest: str | None = None
    same_as: str | None = None  # duplicate: the id of the first mutant with this machine code
    error: str = ""  # did-not-build: the compiler's first error


def compile_digest(target, unit: str, source: str, cache: Path) -> str:
    """The machine-code digest of `source` compiled as `unit`; build_gate.CompileFailure when nvcc refuses it."""
    obj = build_gate.compile_object(target, unit, source.encode(), Path(cache))[0]
    return fingerprint.digest(obj, unit)


def _compile_error(exc: build_gate.CompileFailure) -> str:
    if exc.timed_out:
        return f"nvcc ran past {build_gate.NVCC_TIMEOUT_S:.0f} s"
    return build_gate.first_error(exc.output)


def known_good_digest(target, unit: str, source: str, cache: Path) -> str:
    try:
        return compile_digest(target, unit, source, cache)
    except build_gate.CompileFailure as exc:
        raise PorterError(f"the known-good {unit} does not compile: {_compile_error(exc)}") from None


def classify(mutations: list[Mutation], digests: list[str | Exception], known_good: str) -> list[Built]:
    """Each mutation's status from its compile (a digest, or the compile's failure), in the given order."""
    first: dict[str, str] = {}
    out = []
    for m, d in zip(mutations, digests):
        if isinstance(d, Exception):
            out.append(Built(m, DID_NOT_BUILD, error=_compile_error(d) if isinstance(d, build_gate.CompileFailure)
                             else str(d)))
        elif d == known_good:
            out.append(Built(m, EQUIVALENT, d))
        elif d in first:
            out.append(Built(m, DUPLICATE, d, same_as=first[d]))
        else:
            first[d] = m.id
            out.append(Built(m, DISTINCT, d))
    return out


def build_all(target, known_good: dict[str, str], mutations: list[Mutation], cache: Path,
              progress=None, jobs: int | None = None) -> list[Built]:
    """Compile every mutation (side by side) and classify it against its unit's known-good source."""
    from porter.term import Steps

    units = sorted({m.unit for m in mutations})
    good = {u: known_good_digest(target, u, known_good[u], cache) for u in units}

    def one(m: Mutation):
        try:
            build_cache.maybe_prune(Path(cache))  # thousands of objects: the cache's bound holds (once a minute)
            return compile_digest(target, m.unit, m.source, cache)
        except build_gate.CompileFailure as exc:
            return exc
        except PorterError as exc:
            return exc
        finally:
            steps.advance()

    with (progress or Steps)(f"compiling {len(mutations)} mutants", len(mutations)) as steps, \
            ThreadPoolExecutor(max_workers=max(1, jobs or os.cpu_count() or 1)) as pool:
        digests = list(pool.map(one, mutations))
    out: list[Built] = []
    for u in units:
        idx = [i for i, m in enumerate(mutations) if m.unit == u]
        out += classify([mutations[i] for i in idx], [digests[i] for i in idx], good[u])
    order = {id(m): i for i, m in enumerate(mutations)}
    return sorted(out, key=lambda b: order[id(b.mutation)])
