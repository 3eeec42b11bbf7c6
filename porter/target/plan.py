"""`porter plan`: the order units are ported in, and why.

Tiers, in order:
  runtime      target [units].runtime and the tensor functions (<prefix>tensor_*):
               every op's test needs them; header order (init, alloc, ... first)
  prefill      reachable from the engine's prefill entry point
  decode       reachable only from the decode entry point
  unreachable  neither (debug helpers, abandoned variants): last
Inside a tier: call-graph depth from the entry point, then census relevance
(how many tensors of the model file the unit reads; 0 without --model), then
header order; finally a unit moves in front of the same-tier units whose host
implementation calls it (attention_output_q8_batch calls matmul_q8_0: the
matmul goes first).

Reachability comes from porter.target.scan (engine call graph + host API->API calls),
kernels from the host dispatch map, quant types from the GGUF census when a
model file is given (otherwise the types the target's census table expects and
the quant types named by the unit's kernels).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from porter.errors import PorterError
from porter.target.gguf_file import check_model_file

TIERS = ("runtime", "prefill", "decode", "unreachable")


@dataclass
class RankedUnit:
    unit: str
    tier: str
    rank: int
    reasons: list[str]
    kernels: list[str]
    quant_types: list[str]
    depth: int | None = None
    path: list[str] = field(default_factory=list)  # call chain from the entry point (prefill, else decode)
    phases: list[str] = field(default_factory=list)  # "prefill", "decode"
    unresolved: list[str] = field(default_factory=list)
    candidate_kernels: list[str] = field(default_factory=list)  # host names an unresolved pattern fits
    absent_types: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    relevance: int = 0
    header_index: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def ranked_units(target, model_path=None, scan_result=None, census_result=None) -> list[RankedUnit]:
    from porter.target.scan import scan
    from porter.target.scan.census import census, load_rules, quant_types_in

    s = scan_result if scan_result is not None else scan(target)
    rules, rules_where = load_rules(target)
    unit_kernels = {u: list(ad.kernels) for u, ad in (s.host.api.items() if s.host else [])}
    cen = census_result
    if cen is None and model_path is not None:
        cen = census(model_path, rules, unit_kernels, rules_where)

    prefix = target.symbol_prefix
    runtime = set(target.runtime_units)
    header_index = {u: i for i, u in enumerate(s.api)}
    eng = s.engine
    expected: dict[str, list[str]] = {}
    for r in rules:
        for u in r.units:
            for e in r.expect:
                expected.setdefault(u, [])
                if e not in expected[u]:
                    expected[u].append(e)

    out: list[RankedUnit] = []
    for u in target.units:
        reasons: list[str] = []
        phases = [ph for ph in ("prefill", "decode") if eng is not None and u in eng.reach.get(ph, {})]
        is_runtime = u in runtime or u.startswith(prefix + "tensor_")
        if is_runtime:
            tier = "runtime"
            reasons.append("runtime unit (target.toml [units].runtime)" if u in runtime else
                           f"tensor function ({prefix}tensor_*)")
        elif "prefill" in phases:
            tier = "prefill"
        elif "decode" in phases:
            tier = "decode"
        else:
            tier = "unreachable"
        depth, path = None, []
        ph0 = phases[0] if phases else None
        if eng is not None and ph0:
            depth = eng.depth(ph0, u)
            path = [fn for fn, _ in eng.path(ph0, u)]
            reasons.append(f"reached from {ph0} at depth {depth}: {' -> '.join(path)}")
            if len(phases) == 2:
                reasons.append("also reached from decode")
        elif eng is not None and not is_runtime:
            callers = eng.api_callers.get(u, [])
            if callers:
                names = sorted({c for c, _ in callers})
                reasons.append(f"unreachable: called only from {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                               f" (not reached from {', '.join(eng.entries.get('prefill', []))} or "
                               f"{', '.join(eng.entries.get('decode', []))})")
            else:
                reasons.append("unreachable: no engine function calls it")
        elif eng is None:
            reasons.append("no engine sources scanned: reachability unknown")

        ad = s.dispatch(u)
        kernels = list(ad.kernels) if ad else []
        unresolved = [f"{x.pattern} ({x.reason}) at {x.where}" for x in ad.unresolved] if ad else []
        cands = sorted({c for x in ad.unresolved for c in x.candidates}) if ad else []
        if s.host is None:
            reasons.append("no host file scanned: kernels unknown")
        elif ad is None or ad.line == 0:
            reasons.append(f"not defined in {s.host.file}")
        elif kernels or unresolved:
            msg = f"dispatches {len(kernels)} kernel{'s' if len(kernels) != 1 else ''}"
            if ad.helpers:
                msg += f" via {', '.join(ad.helpers[:3])}{' ...' if len(ad.helpers) > 3 else ''}"
            reasons.append(msg)
            if unresolved:
                reasons.append(f"{len(unresolved)} UNRESOLVED dispatch{'es' if len(unresolved) != 1 else ''}: "
                               + "; ".join(unresolved[:3]))
        else:
            reasons.append("dispatches no Metal kernel (host-side only)")
        if ad and ad.api_calls:
            deps = [c for c in ad.api_calls if c in header_index]
            if deps:
                reasons.append(f"its host implementation calls {', '.join(deps)}")
        if s.unknown_kernels.get(u):
            reasons.append(f"names not in the Metal library: {', '.join(s.unknown_kernels[u])}")

        relevance = 0
        absent: list[str] = []
        flags: list[str] = []
        if cen is not None:
            c = cen.unit(u)
            if c is not None:
                relevance = c.relevance
                quant = sorted(c.required, key=lambda t: (-c.required[t], t))
                absent = list(c.absent)
                flags = list(c.flags)
                if c.required:
                    reasons.append("census: needs " + ", ".join(f"{t} ({c.required[t]} tensors, e.g. {c.examples[t]})"
                                                                 for t in quant))
                if absent:
                    reasons.append(f"census: absent from this file: {', '.join(absent)}")
                for f_ in flags:
                    reasons.append(f"census FLAG: {f_}")
            else:
                quant = []
        else:
            quant = list(expected.get(u, []))
            for q in quant_types_in(kernels):
                if q not in quant:
                    quant.append(q)
            if quant:
                reasons.append(f"expected types (no model file given): {', '.join(quant)}")
        out.append(RankedUnit(unit=u, tier=tier, rank=0, reasons=reasons, kernels=kernels, quant_types=quant,
                              depth=depth, path=path, phases=phases, unresolved=unresolved, candidate_kernels=cands,
                              absent_types=absent, flags=flags, relevance=relevance,
                              header_index=header_index.get(u, 0)))

    ordered: list[RankedUnit] = []
    for tier in TIERS:
        group = [r for r in out if r.tier == tier]
        if tier == "runtime":
            group.sort(key=lambda r: r.header_index)
        elif tier == "unreachable":
            group.sort(key=lambda r: (-r.relevance, r.header_index))
        else:
            group.sort(key=lambda r: (r.depth if r.depth is not None else 1 << 30, -r.relevance, r.header_index))
        ordered.extend(_dependencies_first(group, s))
    for i, r in enumerate(ordered, 1):
        r.rank = i
    return ordered


def _dependencies_first(group: list[RankedUnit], s) -> list[RankedUnit]:
    """Stable: a unit is moved in front of the first unit of the group whose host code calls it."""
    names = {r.unit for r in group}
    calls = {}
    for r in group:
        ad = s.dispatch(r.unit)
        calls[r.unit] = [c for c in (ad.api_calls if ad else []) if c in names and c != r.unit]
    by = {r.unit: r for r in group}
    out: list[RankedUnit] = []
    placed: set[str] = set()

    def place(u: str, stack: set[str]):
        if u in placed or u in stack:
            return
        stack.add(u)
        for d in calls.get(u, []):
            place(d, stack)
        stack.discard(u)
        placed.add(u)
        out.append(by[u])

    for r in group:
        place(r.unit, set())
    return out


# ---------------------------------------------------------------- CLI


def add_arguments(parser) -> None:
    parser.add_argument("--model", metavar="GGUF", help="census this model file: which quant variants each unit needs")
    parser.add_argument("--why", metavar="UNIT", help="print the call chain(s) from the entry points to UNIT")
    parser.add_argument("--rescan", action="store_true", help="ignore the scan cache (runs/scan-cache/)")
    from porter.term import add_wide_argument

    add_wide_argument(parser)
    for flag, kw in (("--json", dict(action="store_true", help="machine-readable output")),
                     ("--target", dict(metavar="NAME", help="target to plan")),
                     ("--source", dict(metavar="DIR", help="the target's source checkout"))):
        try:
            parser.add_argument(flag, **kw)
        except Exception:  # already added by the CLI's common options  # noqa: BLE001
            pass


def run(args) -> int:
    from porter.target.scan import scan
    from porter.target import load_target

    workspace = Path(getattr(args, "workspace", None) or ".")
    target = load_target(workspace, args.target, getattr(args, "source", None))
    s = scan(target, cache=not getattr(args, "rescan", False))
    model = getattr(args, "model", None)
    if model is not None:
        check_model_file(model)
    ranked = ranked_units(target, model, scan_result=s)
    why = getattr(args, "why", None)
    as_json = getattr(args, "json", False)
    if why:
        return _why(target, s, ranked, why, as_json)
    if as_json:
        print(json.dumps({
            "target": target.name,
            "scan": {"seconds": round(s.seconds, 3), "from_cache": s.from_cache, "lines": s.lines,
                     "missing": s.missing, "kernels": len(s.metal.kernels), "host_names": len(s.metal.host_names),
                     "metal_error_nodes": {f.path: f.error_nodes for f in s.metal.files},
                     "undispatched": s.undispatched,
                     "unresolved": [{"unit": u, "pattern": x.pattern, "reason": x.reason, "where": x.where,
                                     "candidates": list(x.candidates)} for u, x in s.unresolved()]},
            "entries": s.engine.entries if s.engine else {},
            "model": str(model) if model else None,
            "units": [r.to_dict() for r in ranked],
        }, indent=2))
        return 0
    _print_table(target, s, ranked, model, getattr(args, "wide", False))
    return 0


def _important(reason: str) -> bool:
    return reason.startswith(("census FLAG", "census: absent")) or "UNRESOLVED" in reason or "unreachable" in reason


def plan_table(ranked: list[RankedUnit], wide: bool = False):
    """One row per unit in plan order, a section per tier; its kernels and notes are the tail."""
    from porter.term import Column, Table

    table = Table([Column("#", right=True), Column("unit", key=True), Column("tier"),
                   Column("depth", right=True), Column("quant types")], tail="kernels / notes")
    tier = None
    for r in ranked:
        if tier is not None and r.tier != tier:
            table.add_section()
        tier = r.tier
        shown = r.kernels if wide else r.kernels[:3]
        ks = ", ".join(shown) + (f" +{len(r.kernels) - len(shown)}" if len(r.kernels) > len(shown) else "")
        notes = "; ".join(x for x in r.reasons if wide or _important(x))
        table.add_row(str(r.rank), r.unit, r.tier, str(r.depth) if r.depth is not None else "",
                      "/".join(r.quant_types) or "-", tail="; ".join(x for x in (ks, notes) if x))
    return table


def _print_table(target, s, ranked: list[RankedUnit], model, wide: bool = False, con=None) -> None:
    from porter.term import console as make_console

    con = con or make_console(wide)

    def say(text: str) -> None:  # scanned names and paths are data, never rich markup
        con.print(text, markup=False, highlight=False)

    counts = {t: sum(r.tier == t for r in ranked) for t in TIERS}
    src = "cached scan" if s.from_cache else "scan"
    say(f"{target.name}: {len(ranked)} units — " + ", ".join(f"{counts[t]} {t}" for t in TIERS)
        + f"  ({src} of {s.lines} lines, {s.seconds:.2f}s)")
    if s.engine:
        say(f"  prefill entry: {', '.join(s.engine.entries.get('prefill', []))}; "
            f"decode entry: {', '.join(s.engine.entries.get('decode', []))}"
            + (f"; MISSING entry functions: {', '.join(s.engine.missing_entries)}" if s.engine.missing_entries else ""))
    if s.missing:
        say(f"  not found in the checkout: {', '.join(s.missing)}")
    say(f"  model: {model}" if model else "  model: none (quant types are what the target expects; pass --model GGUF)")

    plan_table(ranked, wide).print(con, wide)
    unres = s.unresolved()
    if unres:
        say(f"\nUNRESOLVED dispatches ({len(unres)}):")
        for u, x in unres:
            c = f" -> fits {', '.join(x.candidates)}" if x.candidates else ""
            say(f"  {u}: {x.pattern} — {x.reason} [{x.where}]{c}")
    say("\nwhy a unit is where it is: porter plan --why UNIT" + ("" if wide else "; every reason and kernel: --wide"))


def _why(target, s, ranked: list[RankedUnit], unit: str, as_json: bool) -> int:
    if unit not in s.api:
        raise PorterError(f"unknown unit {unit!r} for target {target.name} (see `porter units --target {target.name}`)")
    r = next((x for x in ranked if x.unit == unit), None)
    chains = {}
    if s.engine:
        for ph in ("prefill", "decode"):
            chain = s.engine.path(ph, unit)
            if chain:
                chains[ph] = [{"function": fn, "file": s.engine.functions.get(fn, ("", 0))[0],
                               "line": s.engine.functions.get(fn, ("", 0))[1], "calls_next_at_line": ln}
                              for fn, ln in chain]
    if as_json:
        print(json.dumps({"unit": unit, "tier": r.tier if r else "skipped", "rank": r.rank if r else None,
                          "chains": chains, "reasons": r.reasons if r else []}, indent=2))
        return 0
    print(f"{unit}: tier {r.tier if r else 'skipped'}" + (f", rank {r.rank}" if r else ""))
    if not chains:
        callers = s.engine.api_callers.get(unit, []) if s.engine else []
        if callers:
            print("  not reachable from an entry point; called from: "
                  + ", ".join(f"{c} (line {ln})" for c, ln in callers[:8]))
        else:
            print("  not reachable from an entry point and called by no engine function")
    for ph, chain in chains.items():
        parts = []
        for el in chain:
            where = f" [{el['file']}:{el['calls_next_at_line']}]" if el["calls_next_at_line"] else ""
            parts.append(f"{el['function']}{where}")
        print(f"  {ph}: " + " -> ".join(parts))
    if r:
        for reason in r.reasons:
            print(f"  - {reason}")
    return 0
