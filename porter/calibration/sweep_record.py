"""targets/<t>/seed_sweep.json: the known-good's worst error over many fresh seed sets, per spec, kept with
the target (issue: spec strength measured).  A ledger record of the same sweep lives in one workspace; this
file is what a reviewer of the target reads, and what the next device session adds to.

    porter calibrate --target ds4 --known-good upstream --seed-sets 20 --no-mutants --write

Each unit's entry is the sweep's compact form (seed_sweep.compact: sets, the rule's verdict, the worst
ratio with its case, output, metric, set and seed, the first refused set with its seeds) plus the spec's
hash, the known-good and the GPU it ran on.  A later run replaces the entries of the units it swept and
keeps the others (one lease rarely sweeps a whole target); an entry whose spec has changed since is stale,
and shown so, never counted.  A run of one seed set is no sweep and writes nothing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from porter.calibration import seed_sweep
from porter.errors import PorterError
from porter.records import durable

RECORD = "seed_sweep.json"
FORMAT = 1


def record_path(target) -> Path:
    return Path(target.dir) / RECORD


def read(target) -> dict | None:
    """The recorded sweeps ({"format", "units": {unit: entry}}), None without a file; PorterError on one
    that does not read."""
    path = record_path(target)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PorterError(f"{path}: not a seed-sweep record: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("units"), dict):
        raise PorterError(f"{path}: not a seed-sweep record of format {FORMAT}")
    return data


def write(target, report: dict, spec_sha256: dict[str, str]) -> tuple[Path, list[str]]:
    """Merge the report's sweeps of two or more sets into the record; returns its path and the units written."""
    sweeps = {u: s for u, s in (report.get("seed_sweep") or {}).items() if (s.get("sets") or 0) >= 2}
    if not sweeps:
        return record_path(target), []
    old = read(target) or {"format": FORMAT, "units": {}}
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    for u, s in sweeps.items():
        old["units"][u] = {**seed_sweep.compact(s), "spec_sha256": spec_sha256.get(u),
                           "known_good": report.get("known_good"), "device": report.get("device"), "recorded": when}
    old["units"] = dict(sorted(old["units"].items()))
    path = record_path(target)
    durable.write_atomic(path, (json.dumps(old, indent=1, default=str) + "\n").encode())
    return path, sorted(sweeps)


def standing(target, spec_sha256: dict[str, str], data: dict | None = None) -> dict:
    """What the record (`data`, else the target's file) says of the specs as they are now: {"current": {unit:
    entry}, "stale": [units whose spec changed since], "refused": [current units the known-good failed on
    some set], "unswept": [specs with no entry]}."""
    data = data or read(target) or {"units": {}}
    current = {u: e for u, e in data["units"].items() if u in spec_sha256 and e.get("spec_sha256") == spec_sha256[u]}
    return {"current": current,
            "stale": sorted(u for u in data["units"] if u in spec_sha256 and u not in current),
            "refused": sorted(u for u, e in current.items() if not e.get("ok")),
            "unswept": sorted(u for u in spec_sha256 if u not in data["units"])}


def line(target, spec_sha256: dict[str, str]) -> str:
    """One line for `porter calibrate`'s table: how many specs hold a current sweep, the worst ratio among
    them, and what is stale, refused or unswept ("" without a record)."""
    data = read(target)
    if data is None:
        return ""
    s = standing(target, spec_sha256, data)
    cur = s["current"]
    ratios = [(e["worst"].get("ratio"), u) for u, e in cur.items() if e.get("worst")]
    worst = max(ratios, key=lambda x: float("inf") if x[0] is None else x[0], default=None)
    text = f"recorded seed sweep ({RECORD}): {len(cur)} of {len(spec_sha256)} specs current"
    if worst:
        text += (f", worst {seed_sweep.ratio_text(seed_sweep.INF if worst[0] is None else worst[0])} of tolerance "
                 f"({worst[1].removeprefix(getattr(target, 'symbol_prefix', ''))})")
    for key in ("refused", "stale", "unswept"):
        if s[key]:
            text += f"; {len(s[key])} {key}"
    return text
