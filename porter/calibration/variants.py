"""Known-good variants: the upstream backend run with environment knobs that choose other kernels.

    targets/<t>/known_good_variants.toml:
        [[variant]]
        name = "indexer-wmma64"
        why  = "..."
        env  = { DS4_CUDA_NO_INDEXER_WMMA128 = "1" }

Upstream ds4 reads ~85 DS4_CUDA_* knobs that select alternative, equally correct
kernels.  Two uses:
  - calibration: each spec must accept every variant as it accepts the default
    build (a spec that refuses one of upstream's own paths would refuse a
    correct port that made the same choice);
  - the launch trace: what a spec reaches is the union over the default run and
    its variants, so knob-only kernels are counted as reached only where a
    variant really launched them.
A variant runs for an op only where the op's path reads one of its knobs: the
`getenv("...")` names in the op's slice and the slices of the API functions it
calls (porter.target.scan.cuda_slice), so a MoE knob does not rerun the norm specs.
An op's spec file may name its own settings (KNOWN_GOOD_ENV, beside its
DISPATCH table): they run too, as variants "spec-env-<i>".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from porter.errors import PorterError
from porter.tomlfile import read_toml

FILE = "known_good_variants.toml"
_GETENV = re.compile(r'getenv\s*\(\s*"([A-Za-z0-9_]+)"\s*\)')


@dataclass(frozen=True)
class Variant:
    name: str
    why: str
    env: dict[str, str] = field(default_factory=dict)


def load_variants(target) -> list[Variant]:
    """The target's variants ([] when it declares none)."""
    path = Path(target.dir) / FILE
    data = read_toml(path, missing=None)
    if data is None:
        return []
    out, seen = [], set()
    for i, v in enumerate(data.get("variant", [])):
        name, env = v.get("name"), v.get("env")
        if not isinstance(name, str) or not name or not isinstance(env, dict) or not env:
            raise PorterError(f"{path}: variant {i + 1} needs a name and a non-empty env table")
        if name in seen:
            raise PorterError(f"{path}: two variants are named {name!r}")
        if not all(isinstance(k, str) and isinstance(val, str) for k, val in env.items()):
            raise PorterError(f"{path}: variant {name}: env values must be strings")
        seen.add(name)
        out.append(Variant(name, str(v.get("why", "")), dict(env)))
    return out


def knobs_read(cf, unit: str, rules) -> set[str]:
    """The getenv names on `unit`'s path: its slice and those of the API functions it calls."""
    from porter.target.scan.cuda_slice import path_decls

    return {name for d in path_decls(cf, unit, rules) for name in _GETENV.findall(cf.text(d))}


class VariantPlan:
    """Which variants apply to which unit, from the checkout's backend source."""

    def __init__(self, target, variants: list[Variant] | None = None, cf=None, rules=None):
        """cf, rules: the checkout's parsed backend and slice rules, where the caller has them already."""
        from porter.providers.reference import load_rules, reference_source
        from porter.target.scan.cuda_slice import CudaFile

        self.variants = load_variants(target) if variants is None else variants
        self._target = target if target.checkout else None  # spec settings are upstream's knobs too
        self._rules = rules if rules is not None else load_rules(target) if self.variants else None
        self._cf = cf if cf is not None else (CudaFile.parse(reference_source(target), self._rules)
                                              if self.variants else None)

    @lru_cache(maxsize=None)
    def knobs(self, unit: str) -> frozenset[str]:
        from porter.target.scan.cuda_slice import SliceError

        if self._cf is None:
            return frozenset()
        try:
            return frozenset(knobs_read(self._cf, unit, self._rules))
        except SliceError:  # the checkout's backend does not define it: no knob of its path to vary
            return frozenset()

    def for_unit(self, unit: str) -> list[Variant]:
        """The target's variants whose knobs this op's path reads, then each setting of the op's
        own spec (KNOWN_GOOD_ENV) that no variant already makes exactly."""
        k = self.knobs(unit)
        out = [v for v in self.variants if k & set(v.env)]
        if self._target is not None:
            from porter.spec import spec_known_good_env

            for i, env in enumerate(spec_known_good_env(self._target, unit)):
                if all(v.env != env for v in out):
                    out.append(Variant(f"spec-env-{i}", f"{unit}'s KNOWN_GOOD_ENV[{i}]", env))
        return out
