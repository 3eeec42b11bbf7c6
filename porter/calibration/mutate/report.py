"""The mutation table: what became of each mutant, counted per operator, per unit and overall.

Outcomes of one mutant:

    did-not-build  nvcc (or the link) refused it
    equivalent     same machine code as the known-good, or a survivor the target declares equivalent
                   (equivalent_mutants.toml: its reason is shown)
    duplicate      same machine code as an earlier mutant: counted once, under the first
    killed         parity refused it (by the check named), or perf did where parity passed
    survived       parity and perf accepted it: a gap in the spec, or an equivalent nobody declared yet
    not-run        built, but nothing judged it (no GPU here, the known-good itself was refused, a skip)

score = killed / (killed + survived).  Declarations are applied when a table is shown, not when it is
recorded: targets/<t>/mutation.json keeps what was measured, and a survivor reviewed after the run reads
as equivalent without running it again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from porter.calibration.mutate.declared import Declared
from porter.errors import PorterError

RECORD = "mutation.json"
FORMAT = 1
OUTCOMES = ("did-not-build", "equivalent", "duplicate", "killed", "survived", "not-run")


def declared_outcomes(mutants: list[dict], declared: dict[str, Declared]) -> tuple[list[dict], list[Declared]]:
    """The mutants with every survivor the target declares (same id, unit and operator) made equivalent,
    with its reason; and the declarations that matched no mutant of these units (stale, or for a unit
    not in this table) are returned apart."""
    out, used = [], set()
    for m in mutants:
        d = declared.get(m["id"])
        if d is not None and d.unit == m["unit"] and d.op == m["op"]:
            used.add(d.id)
            if m["outcome"] == "survived":
                m = dict(m, outcome="equivalent", declared=True, reason=d.reason)
        out.append(m)
    units = {m["unit"] for m in mutants}
    unmatched = [d for d in declared.values() if d.id not in used and d.unit in units]
    return out, unmatched


def counts(mutants: list[dict]) -> dict:
    """generated, each outcome, the checks that killed, and the score (None when nothing was judged)."""
    c = {"generated": len(mutants), **{o: 0 for o in OUTCOMES}, "killed_by": {}, "killed_by_screen": 0}
    for m in mutants:
        c[m["outcome"]] += 1
        if m["outcome"] == "killed":
            c["killed_by"][m.get("check") or "?"] = c["killed_by"].get(m.get("check") or "?", 0) + 1
            c["killed_by_screen"] += bool(m.get("screen"))  # on the untimed cases alone (runner.screen)
    judged = c["killed"] + c["survived"]
    c["score"] = round(c["killed"] / judged, 4) if judged else None
    return c


def summarize(mutants: list[dict]) -> dict:
    """{"overall": counts, "ops": {op: counts}, "units": {unit: counts}, "unit_ops": {unit: {op: counts}}}."""
    ops: dict[str, list] = {}
    units: dict[str, list] = {}
    unit_ops: dict[str, dict[str, list]] = {}
    for m in mutants:
        ops.setdefault(m["op"], []).append(m)
        units.setdefault(m["unit"], []).append(m)
        unit_ops.setdefault(m["unit"], {}).setdefault(m["op"], []).append(m)
    return {"overall": counts(mutants), "ops": {k: counts(v) for k, v in ops.items()},
            "units": {k: counts(v) for k, v in units.items()},
            "unit_ops": {u: {k: counts(v) for k, v in d.items()} for u, d in unit_ops.items()}}


def score_text(c: dict) -> str:
    return "-" if c.get("score") is None else f"{100 * c['score']:.1f}%"


# ---------------------------------------------------------------------------
# the recorded table
# ---------------------------------------------------------------------------

def record_path(target) -> Path:
    return Path(target.dir) / RECORD


SAME_RUN = ("target", "known_good", "seed", "budget", "ops")  # records with these equal are parts of one table


def write_record(target, report: dict) -> tuple[Path, str]:
    """targets/<t>/mutation.json: the measured outcomes (declarations are applied when read), survivors with
    their diffs.  A table drawn the same way (same known-good, seed, budget and operators: e.g. another
    --chunk of the units) is merged, this run's units replacing theirs; any other is replaced.
    Returns the path and what became of the table there before."""
    path = record_path(target)
    keep = {k: report[k] for k in (*SAME_RUN, "toolchain", "devices", "seconds", "units", "mutants") if k in report}
    keep["mutants"] = [m if m.get("outcome") == "survived" else {k: v for k, v in m.items() if k != "diff"}
                       for m in keep.get("mutants", [])]
    try:
        old = read_record(target)
    except PorterError:
        old = None
    what = "new table"
    if old is not None and all(old.get(k) == keep.get(k) for k in SAME_RUN):
        mine = set(keep.get("units") or {})
        keep["units"] = {**{u: f for u, f in (old.get("units") or {}).items() if u not in mine}, **keep["units"]}
        keep["mutants"] = [m for m in old["mutants"] if m.get("unit") not in mine] + keep["mutants"]
        keep["devices"] = sorted(set(old.get("devices") or []) | set(keep.get("devices") or []))
        keep["seconds"] = round((old.get("seconds") or 0) + (keep.get("seconds") or 0), 1)
        what = f"merged with the {len(set(old.get('units') or {}) - mine)} other unit(s) of the same draw"
    elif old is not None:
        what = "replaced a table drawn otherwise (known-good, seed, budget or operators)"
    measured = summarize(keep["mutants"])  # for a reader of the file; a table shown applies the declarations
    data = {"format": FORMAT, "recorded": time.strftime("%Y-%m-%d %H:%M:%S %Z"), **keep,
            "measured": {"overall": measured["overall"], "units": measured["units"], "ops": measured["ops"]}}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return path, what


def read_record(target) -> dict | None:
    """The recorded table, or None when the target has none; PorterError on one that does not read."""
    path = record_path(target)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PorterError(f"{path}: not a mutation table: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("mutants"), list):
        raise PorterError(f"{path}: not a mutation table of format {FORMAT}")
    return data


def stale_units(record: dict, spec_sha256: dict[str, str]) -> set[str]:
    """Units whose spec changed since the table was measured (or that have no spec now)."""
    return {u for u, facts in (record.get("units") or {}).items()
            if spec_sha256.get(u) is None or facts.get("spec_sha256") != spec_sha256.get(u)}


# ---------------------------------------------------------------------------
# rendering
# ---------------------------------------------------------------------------

def op_table(summary: dict, possible: dict[str, int], width: int | None = None, judged: bool = True) -> str:
    """One row per operator (every one asked for, in `possible`'s order: how many edits it had to draw
    from) and one for all: generated, did not build, equivalent, duplicate, then killed, survived and
    the score (or, where nothing was judged, how many are built and waiting)."""
    from porter.term import Column, Table

    tail = [Column("killed", right=True), Column("survived", right=True), Column("score", right=True),
            Column("killed by")] if judged else [Column("to run", right=True)]
    t = Table([Column("op", key=True), Column("of", right=True), Column("generated", right=True),
               Column("no build", right=True), Column("equiv", right=True), Column("dup", right=True)] + tail,
              rule=False)

    def row(name, of, c):
        base = [name, of, c["generated"], c["did-not-build"], c["equivalent"], c["duplicate"]]
        if judged:
            by = ", ".join(f"{k} {v}" for k, v in sorted(c["killed_by"].items(), key=lambda kv: (-kv[1], kv[0])))
            if c.get("killed_by_screen"):
                by += f" ({c['killed_by_screen']} on the untimed cases alone)"
            t.add_row(*base, c["killed"], c["survived"], score_text(c), by or "-")
        else:
            t.add_row(*base, c["not-run"])

    for op, of in possible.items():
        row(op, of, summary["ops"].get(op) or counts([]))
    t.add_section()
    row("all", sum(possible.values()), summary["overall"])
    return t.text(width)


def unit_table(summary: dict, prefix: str = "", stale: set[str] = frozenset(), width: int | None = None) -> str:
    """One row per unit: killed, survived, equivalent, score (stale: its spec changed since)."""
    from porter.term import Column, Table

    t = Table([Column("unit", key=True), Column("generated", right=True), Column("killed", right=True),
               Column("survived", right=True), Column("equiv", right=True), Column("score", right=True)],
              rule=False)
    for u, c in sorted(summary["units"].items()):
        t.add_row(u.removeprefix(prefix), c["generated"], c["killed"], c["survived"], c["equivalent"],
                  score_text(c) + (" (stale)" if u in stale else ""))
    return t.text(width)


def survivors_text(mutants: list[dict]) -> str:
    """Each survivor as its diff, headed by its id and operator (the line to declare it equivalent)."""
    parts = []
    for m in mutants:
        if m["outcome"] != "survived":
            continue
        parts.append(f"survived {m['unit']} {m['op']} {m['id']} at {m['location']} ({m['where']} "
                     f"{m['function']}): {m['note']}\n{m.get('diff', '').rstrip()}")
    return "\n\n".join(parts)


def recorded_scores(target, spec_sha256: dict[str, str], declared: dict[str, Declared]) -> dict | None:
    """What `porter calibrate` shows of the recorded table: {unit: score text}, overall, when, and
    which units are stale; None without a table."""
    rec = read_record(target)
    if rec is None:
        return None
    mutants, _unmatched = declared_outcomes(rec["mutants"], declared)
    s = summarize(mutants)
    stale = stale_units(rec, spec_sha256)
    return {"recorded": rec.get("recorded"), "seed": rec.get("seed"), "budget": rec.get("budget"),
            "overall": s["overall"], "units": {u: score_text(c) + (" (stale)" if u in stale else "")
                                               for u, c in s["units"].items()},
            "stale": sorted(stale)}


def recorded_text(scores: dict, units: list[str], prefix: str, where: str, width: int | None = None) -> str:
    """calibrate's mutation column: each of `units`' recorded score, under a line saying where from."""
    from porter.term import Column, Table

    o = scores["overall"]
    head = (f"mutation score ({where}, recorded {scores.get('recorded') or '?'}, seed {scores.get('seed')}, budget "
            f"{scores.get('budget')}): {score_text(o)} overall ({o['killed']} killed, {o['survived']} survived)")
    t = Table([Column("unit", key=True), Column("mutation score", right=True)], rule=False)
    for u in units:
        t.add_row(u.removeprefix(prefix).removesuffix("_tensor"), scores["units"].get(u, "not measured"))
    return head + "\n" + t.text(width)
