"""The one mutant type: code known to be wrong, and the check that must catch it.

A mutant is either a whole candidate file for one unit (`source`: the adversarial
corpus and scripted bad answers) or named search/replace `rules` applied to a
known-good source file at build time (`file`: mutants.toml, e.g. ds4's upstream
ds4_cuda.cu, never copied here).  Each rule's search text must occur exactly
once, so a changed upstream can never silently yield an unmutated "mutant".

must_fail_check is a check of porter/gates/parity/compare.py CHECK_ORDER, a perf
check (porter/gates/perf.py PERF_CHECKS: the mutant passes parity and the perf gate
must refuse it, judged against the known-good run of the same calibration), or
"any" (a scripted answer expected to fail parity somehow).  Perf mutants (correct
but slow kernels, timing hacks) live beside the parity ones: perf_mutants.toml,
and scripted answers whose expect is "perf".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from porter.errors import PorterError
from porter.gates.extract import extract_unit_source
from porter.gates import registry
from porter.gates.parity.compare import CHECK_ORDER
from porter.gates.perf import PERF_CHECKS
from porter.tomlfile import read_toml

ADVERSARIAL_MANIFEST = Path("adversarial") / "manifest.toml"
RULES_FILE = "mutants.toml"
PERF_RULES_FILE = "perf_mutants.toml"  # correct-but-slow kernels and timing hacks, same schema


@dataclass(frozen=True)
class Rule:
    search: str
    replace: str


@dataclass(frozen=True)
class Mutant:
    unit: str
    name: str
    must_fail_check: str
    why: str
    origin: str  # "adversarial" | "scripted" | "rules"
    source: str | None = None  # a whole candidate file for the unit
    file: str | None = None  # with rules: the known-good file they apply to
    rules: tuple[Rule, ...] = ()
    timeout: float | None = None

    def apply(self, text: str) -> str:
        """The rules applied to `text`; each search text must occur exactly once."""
        for j, rule in enumerate(self.rules):
            n = text.count(rule.search)
            if n != 1:
                first = rule.search.strip().splitlines()[0][:60] if rule.search.strip() else repr(rule.search)
                raise PorterError(f"mutant {self.name} rule {j + 1}: search text ({first!r}...) occurs {n} times "
                                  f"in {self.file}, must occur exactly once")
            text = text.replace(rule.search, rule.replace, 1)
        return text

    @property
    def perf(self) -> bool:
        """Refused by the perf gate, not parity: calibration runs perf on it when parity passes."""
        return self.must_fail_check in PERF_CHECKS

    def rejected_by(self, got: str) -> bool:
        if self.must_fail_check == "any":
            return got not in ("pass", "skipped")
        return got == self.must_fail_check


def _check_name(where: str, check: str) -> None:
    if check not in CHECK_ORDER and check not in PERF_CHECKS:
        raise PorterError(f"{where}: unknown check {check!r}")


def adversarial(target) -> list[Mutant]:
    """targets/<t>/adversarial/manifest.toml: candidate files (or scripted answers) and their checks."""
    path = target.dir / ADVERSARIAL_MANIFEST
    if not path.is_file():
        return []
    out = []
    for i, m in enumerate(read_toml(path).get("mutant", [])):
        where = f"{path}: mutant #{i + 1}"
        for k in ("unit", "must_fail_check", "why"):
            if k not in m:
                raise PorterError(f"{where} lacks {k}")
        if ("file" in m) == ("scripted" in m):
            raise PorterError(f"{where} needs exactly one of file / scripted")
        _check_name(where, m["must_fail_check"])
        if "file" in m:
            src_path, name, origin = path.parent / m["file"], m["file"], "adversarial"
        else:
            src_path, name, origin = target.scripted_dir / m["scripted"], m["scripted"], "scripted"
        if not src_path.is_file():
            raise PorterError(f"{where}: {src_path.name} is missing")
        text = src_path.read_text()
        src = text if origin == "adversarial" else extract_unit_source(text, m["unit"], target)
        out.append(Mutant(m["unit"], name, m["must_fail_check"], m["why"], origin, source=src,
                          timeout=m.get("timeout")))
    return out


def scripted_answers(target) -> list[dict]:
    path = target.scripted_dir / "manifest.toml"
    return list(read_toml(path, missing={}).get("answer", []))


def scripted_bad(target, skip: set[str] = frozenset()) -> list[Mutant]:
    """Scripted bad answers that reach parity: expect a gate that runs the candidate and names the check
    its mutants must fail (the registry's mutant_check: 'parity': fail it somehow; 'perf': pass parity and
    be refused as slower than the known-good allows), except those the adversarial manifest already
    names with a sharper check."""
    out = []
    for a in scripted_answers(target):
        check = registry.mutant_check(a.get("expect"))
        if check is None or a["file"] in skip:
            continue
        try:
            src = extract_unit_source((target.scripted_dir / a["file"]).read_text(), a["unit"], target)
        except PorterError:
            continue
        out.append(Mutant(a["unit"], a["file"], check, a.get("why", ""), "scripted", source=src))
    return out


def rule_mutants(target) -> list[Mutant]:
    """targets/<t>/mutants.toml and perf_mutants.toml, validated (names unique across both, checks
    known, rules non-empty and mutating)."""
    out, seen = [], set()
    for path in (target.dir / RULES_FILE, target.dir / PERF_RULES_FILE):
        if path.is_file():
            out += _rules_of(path, seen)
    return out


def perf_rule_mutants(target) -> list[Mutant]:
    """targets/<t>/perf_mutants.toml alone: the correct-but-slow kernels and timing hacks."""
    path = target.dir / PERF_RULES_FILE
    return _rules_of(path, set()) if path.is_file() else []


def _rules_of(path: Path, seen: set) -> list[Mutant]:
    out = []
    for i, m in enumerate(read_toml(path).get("mutant", [])):
        where = f"{path.name}: mutant #{i + 1}"
        for k in ("name", "unit", "file", "must_fail_check", "why", "rule"):
            if k not in m:
                raise PorterError(f"{where} lacks {k!r}")
        if m["name"] in seen:
            raise PorterError(f"{where}: duplicate name {m['name']!r}")
        seen.add(m["name"])
        _check_name(where, m["must_fail_check"])
        rules = []
        for j, r in enumerate(m["rule"]):
            if not isinstance(r.get("search"), str) or not r["search"] or not isinstance(r.get("replace"), str):
                raise PorterError(f"{where} rule {j + 1}: needs a non-empty 'search' and a 'replace' string")
            if r["search"] == r["replace"]:
                raise PorterError(f"{where} rule {j + 1}: replace equals search (no mutation)")
            rules.append(Rule(r["search"], r["replace"]))
        if not rules:
            raise PorterError(f"{where}: no rules")
        out.append(Mutant(m["unit"], m["name"], m["must_fail_check"], m["why"], "rules", file=m["file"],
                          rules=tuple(rules), timeout=m.get("timeout")))
    return out


def load_mutants(target) -> list[Mutant]:
    """Every mutant of the target: the adversarial corpus, scripted bad answers, rule mutants."""
    corpus = adversarial(target)
    named = {m.name for m in corpus if m.origin == "scripted"}
    return corpus + scripted_bad(target, named) + rule_mutants(target)


def digest_of(m: Mutant) -> str:
    """What a calibration ran of this mutant: its code (the whole file, or its rules and the file they apply
    to) and the check it must fail by."""
    what = [m.unit, m.name, m.must_fail_check, m.source, m.file, [[r.search, r.replace] for r in m.rules]]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()


# A known-good built from a whole library (upstream's backend) cannot take a whole-file mutant of one
# unit (calibrator.select_mutants): such a calibration's scope is the rule mutants alone.
SCOPES = ("all", "rules")


def in_scope(mutants: list[Mutant], scope: str) -> list[Mutant]:
    return [m for m in mutants if m.source is None] if scope == "rules" else list(mutants)


def current_digests(target, unit: str, every: list[Mutant] | None = None) -> dict[str, dict[str, str]]:
    """{scope: {mutant name: digest}} of the unit's mutants as the target's files are now: what a calibration
    must have run, in its scope, for the spec to read calibrated (`every`: the target's mutants, loaded once
    by a caller asking for many units).  Mutant files that do not load give
    {} in every scope, which no calibration that ran a mutant matches (calibrate says what is wrong)."""
    try:
        mine = [m for m in (load_mutants(target) if every is None else every) if m.unit == unit]
    except (PorterError, OSError, ValueError):
        return {scope: {} for scope in SCOPES}
    return {scope: {m.name: digest_of(m) for m in in_scope(mine, scope)} for scope in SCOPES}
