"""Calibrating the e2e rule like a parity spec: accept known-good backends, reject broken ones.

Procedure (no number in it is tuned to make a table pass):
1. Every known-good backend is compared with the reference; per stage the
   ceiling is MARGIN times the largest NMSE any of them shows at that stage
   (never below NMSE_FLOOR); the logits ceiling likewise.
2. Acceptance is held out: each known-good backend must pass the rule derived
   from the OTHER known-good backends alone.  A rule derived from one backend
   would accept that backend by construction, so at least two are required.
3. Every broken backend (one mutated unit; integration faults) must be
   rejected by the rule from step 1.
The rule is calibrated only when 2 and 3 hold for every row; the table says
which row broke it otherwise.  MARGIN is the one declared constant: wide
enough for a different but correct summation order (measured spread between
known-good backends is well inside it), narrow enough that a wrong op, which
moves NMSE by orders of magnitude, cannot hide under it; step 2 checks the
first half and step 3 the second half on every calibration.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from porter.errors import PorterError
from porter.gates.e2e.compare import Comparison
from porter.gates.e2e.rule import Rule, Verdict, decide

MARGIN = 10.0
NMSE_FLOOR = 1e-12  # below float32 round-off of a correct op; a bit-exact known-good set still gets a ceiling


@dataclass
class Variant:
    name: str
    kind: str  # "good" | "broken"
    comparison: Comparison
    why: str = ""
    wall_s: float | None = None
    # broken only: its outputs are bit-identical to its unmutated base backend's, so the prefill
    # never ran the mutated code; no tolerance can reject it, and it proves nothing either way
    unreached: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("good", "broken"):
            raise ValueError(f"variant kind {self.kind!r} (good or broken)")


@dataclass
class Row:
    variant: str
    kind: str
    verdict: Verdict
    as_expected: bool
    why: str = ""
    wall_s: float | None = None
    unreached: bool = False


@dataclass
class Calibration:
    rule: Rule
    rows: list[Row]
    setup: dict = field(default_factory=dict)  # what the rule holds for: prompt, stages, engine sha256, device
    variants: list[Variant] = field(default_factory=list)  # the measurements the rule is derived from

    @property
    def reached_broken(self) -> int:
        return sum(1 for r in self.rows if r.kind == "broken" and not r.unreached)

    @property
    def calibrated(self) -> bool:
        return bool(self.rows) and all(r.as_expected for r in self.rows) and self.reached_broken > 0

    def to_json(self) -> dict:
        return {"rule": self.rule.to_json(), "calibrated": self.calibrated, "margin": MARGIN,
                "nmse_floor": NMSE_FLOOR, "setup": self.setup,
                "variants": [{"name": v.name, "kind": v.kind, "why": v.why, "wall_s": v.wall_s,
                              "unreached": v.unreached, "comparison": v.comparison.to_json()}
                             for v in self.variants],
                "rows": [{"variant": r.variant, "kind": r.kind, "as_expected": r.as_expected, "why": r.why,
                          "wall_s": r.wall_s, "unreached": r.unreached, "verdict": r.verdict.to_json()}
                         for r in self.rows]}

    def table(self) -> str:
        lines = [f"{'variant':<34} {'kind':<7} {'verdict':<8} {'worst/ceil':>10} {'wall s':>7}  where / why",
                 "-" * 110]
        for r in self.rows:
            v = r.verdict
            worst = "inf" if not np.isfinite(v.worst_ratio) else f"{v.worst_ratio:.3g}"
            where = ""
            if not v.ok:
                where = f"{v.stage} token {v.token}" if v.token is not None else (v.stage or v.reason)
            mark = "" if r.as_expected else "   <-- NOT AS EXPECTED"
            wall = f"{r.wall_s:.1f}" if r.wall_s is not None else "-"
            verdict = "unreached" if r.unreached else ("accept" if v.ok else "reject")
            if r.unreached:
                where = "outputs bit-identical to the unmutated backend"
            lines.append(f"{r.variant:<34} {r.kind:<7} {verdict:<9} {worst:>9} {wall:>7}  "
                         f"{where}{' — ' if where and r.why else ''}{r.why}{mark}")
        n_unreached = sum(r.unreached for r in self.rows)
        lines.append(f"calibrated: {'yes' if self.calibrated else 'NO'} "
                     f"({sum(r.kind == 'good' for r in self.rows)} known-good accepted held-out, "
                     f"{self.reached_broken} broken rejected"
                     + (f", {n_unreached} mutant(s) unreached by this prefill" if n_unreached else "")
                     + f"; margin {MARGIN:g})")
        return "\n".join(lines)


def envelope_rule(goods: list[Comparison], tokens_exact: bool) -> Rule:
    if not goods:
        raise PorterError("e2e calibration needs known-good backends")
    names = goods[0].stage_names
    for g in goods:
        if g.problem:
            raise PorterError(f"e2e calibration: a known-good backend could not be compared: {g.problem}")
        if g.stage_names != names:
            raise PorterError("e2e calibration: known-good backends expose different stages")
        if list(g.probe_nmse) != list(goods[0].probe_nmse):
            raise PorterError("e2e calibration: known-good backends expose different probes")
        # an infinite error in a known-good would make an infinite ceiling: a rule that accepts anything
        if not (np.all(np.isfinite(g.stage_nmse)) and all(np.isfinite(v) for v in g.probe_nmse.values())):
            raise PorterError("e2e calibration: a known-good backend has a non-finite error (missing or "
                              "non-finite outputs); no ceiling can be derived from it")
    per_stage = np.max(np.stack([g.stage_nmse.max(axis=1) for g in goods]), axis=0)
    logits = max(g.logits_nmse for g in goods)
    probes = list(goods[0].probe_nmse)
    probe_tol = [max(g.probe_nmse[p] for g in goods) for p in probes]
    return Rule(tuple(names), tuple(float(max(NMSE_FLOOR, MARGIN * v)) for v in per_stage),
                float(max(NMSE_FLOOR, MARGIN * logits)), tokens_exact, tuple(probes),
                tuple(float(max(NMSE_FLOOR, MARGIN * v)) for v in probe_tol))


def calibrate(variants: list[Variant], *, tokens_exact: bool, setup: dict | None = None) -> Calibration:
    goods = [v for v in variants if v.kind == "good"]
    broken = [v for v in variants if v.kind == "broken"]
    if len(goods) < 2:
        raise PorterError(f"e2e calibration needs at least 2 known-good backends (held-out acceptance); got {len(goods)}")
    if not broken:
        raise PorterError("e2e calibration needs broken backends to reject (a rule nothing fails is not a gate)")
    # a known-good that could not run or be compared is a row that breaks the calibration, not a
    # reason to print no table: the rule comes from the ones that ran
    failed = [g for g in goods if g.comparison.problem]
    goods = [g for g in goods if not g.comparison.problem]
    if len(goods) < 2:
        raise PorterError(f"e2e calibration: {len(goods)} known-good backend(s) ran; at least 2 are needed "
                          + "".join(f"; {g.name}: {g.comparison.problem}" for g in failed))
    rule = envelope_rule([g.comparison for g in goods], tokens_exact)
    rows = []
    for g in goods:
        held_out = envelope_rule([o.comparison for o in goods if o is not g], tokens_exact)
        v = decide(g.comparison, held_out)
        rows.append(Row(g.name, "good", v, v.ok, g.why, g.wall_s))
    for g in failed:
        rows.append(Row(g.name, "good", Verdict(False, f"e2e: {g.comparison.problem}", worst_ratio=float("inf")),
                        False, g.why, g.wall_s))
    for b in broken:
        if b.unreached:
            v = Verdict(True, "unreached: outputs bit-identical to the unmutated backend")
            rows.append(Row(b.name, "broken", v, True, b.why, b.wall_s, unreached=True))
            continue
        v = decide(b.comparison, rule)
        rows.append(Row(b.name, "broken", v, not v.ok, b.why, b.wall_s))
    return Calibration(rule, rows, dict(setup or {}), list(variants))


def save(cal: Calibration, path: Path) -> str:
    body = json.dumps(cal.to_json(), indent=1, sort_keys=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    return hashlib.sha256(body.encode()).hexdigest()


def load(path: Path) -> tuple[Calibration, str]:
    """The calibration re-derived from the measurements stored in `path`, and the file's sha256.

    The stored rule and verdicts are not trusted: the rule is derived again
    from the stored known-good comparisons and every row decided again, so an
    edited ceiling or a flipped verdict changes nothing.
    """
    try:
        body = Path(path).read_bytes()
    except FileNotFoundError:
        raise PorterError(f"e2e is uncalibrated: no {path} (run the e2e calibration on a GPU machine)") from None
    try:
        d = json.loads(body)
        variants = [Variant(v["name"], v["kind"], Comparison.from_json(v["comparison"]), v.get("why", ""),
                            v.get("wall_s"), bool(v.get("unreached", False))) for v in d["variants"]]
        cal = calibrate(variants, tokens_exact=bool(d["rule"]["tokens_exact"]), setup=d.get("setup") or {})
    except (ValueError, KeyError, TypeError) as exc:
        raise PorterError(f"malformed e2e calibration {path}: {exc}") from exc
    return cal, hashlib.sha256(body).hexdigest()


def load_rule(path: Path) -> tuple[Rule, dict, str]:
    """(rule, setup, sha256 of the file) of a calibration that holds; PorterError otherwise."""
    cal, sha = load(path)
    if not cal.calibrated:
        bad = next((r for r in cal.rows if not r.as_expected), None)
        if bad is None:
            raise PorterError(f"e2e calibration {path} does not hold: no broken backend was reached")
        raise PorterError(f"e2e calibration {path} does not hold: {bad.kind} backend {bad.variant} is "
                          f"{'rejected' if bad.kind == 'good' else 'accepted'}; the rule is not trusted")
    return cal.rule, cal.setup, sha
