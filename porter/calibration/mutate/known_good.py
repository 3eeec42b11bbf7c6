"""The known-good source of each unit, the code mutation testing mutates.

    --known-good scripted   the target's scripted good answers (as `porter calibrate` uses them)
    --known-good DIR        DIR/<unit>.cu or DIR/<unit>.md
    --known-good upstream   each unit's slice of the checkout's CUDA backend, as the reference provider
                            answers it (porter.providers.reference: the API function, its kernels and
                            helpers, adapted by the target's rules): the file a reference run verifies

A prebuilt library has no source to mutate: it is refused in one line.
"""

from __future__ import annotations

from pathlib import Path

from porter.calibration.libraries import sources_from
from porter.errors import PorterError
from porter.gates.extract import extract_unit_source


def slices(target, units: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """unit -> its reference slice; unit -> why it has none (the slicer's one-line error)."""
    from porter.providers.base import ProviderError
    from porter.providers.reference import ReferenceProvider

    try:
        provider = ReferenceProvider(target)
    except ProviderError as exc:
        raise PorterError(f"--known-good upstream: {exc}") from None
    text = provider.source.read_text()
    out, missing = {}, {}
    for u in units:
        try:
            out[u] = extract_unit_source(provider.answer_from(u, text), u, target)
        except PorterError as exc:  # ProviderError and the extractor's errors are PorterErrors
            missing[u] = str(exc)
    return out, missing


def known_good_sources(target, spec: str, units: list[str]) -> tuple[dict[str, str], str, dict[str, str]]:
    """(unit -> source for every unit that has one, what they are, unit -> why one of `units` has none)."""
    if spec.endswith(".so"):
        raise PorterError(f"--known-good {spec}: mutation testing mutates sources; use 'scripted', 'upstream' "
                          "(the reference provider's slices of the checkout) or a folder of <unit>.cu/.md")
    if spec == "upstream":
        found, missing = slices(target, list(target.units))
        source = target.spec.reference.source if getattr(target.spec, "reference", None) else "?"
        return found, f"upstream {target.name} slices of {source}", {u: missing[u] for u in units if u in missing}
    found, describe = sources_from(target, spec if spec == "scripted" else str(Path(spec).expanduser()))
    return found, describe, {u: "no known-good source" for u in units if u not in found}
