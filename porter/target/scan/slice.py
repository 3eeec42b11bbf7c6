"""Source slices: a kernel's definition plus everything it uses, for the prompt and the audit.

`metal_slice(target, names)` takes kernel function names, host names
(`kernel_mul_mv_f16_f32`, which selects the template instantiation), or any
top-level Metal symbol, and returns the transitive closure of the top-level
items they use (helpers, structs, typedefs, macros with their #undefs,
function constants, template kernels and instantiations), in library order.
An item defined in a file that the library concatenates after its user (ds4
splices the prelude of ds4_metal.m and the .metal files in a fixed order) is
moved in front of its first user, so the slice reads top to bottom.
"""

from __future__ import annotations

from porter.errors import PorterError
from porter.target.scan.common import IDENT, mask_comments
from porter.target.scan.metal import MetalScan, MetalSymbol


def closure(metal: MetalScan, names: list[str]) -> tuple[list[MetalSymbol], list[str]]:
    """(symbols in emission order, names that matched nothing)."""
    by_name: dict[str, list[MetalSymbol]] = {}
    for s in metal.symbols:
        for n in s.names:
            by_name.setdefault(n, []).append(s)
    undefs: dict[str, list[MetalSymbol]] = {}
    for s in metal.symbols:
        if s.kind == "undef" and s.undefines:
            undefs.setdefault(s.undefines, []).append(s)

    roots: list[MetalSymbol] = []
    unknown: list[str] = []
    for n in names:
        hits = by_name.get(f"host:{n}") or by_name.get(n)
        if not hits and n in metal.host_names:
            hits = by_name.get(metal.host_names[n].kernel)
        if not hits:
            unknown.append(n)
            continue
        roots.extend(hits)

    chosen, excluded = _instantiation_args(metal, roots)

    def defs(name: str) -> list[MetalSymbol]:
        """Definitions of a used name; among overloads/specialisations, those for the requested instantiation."""
        ds = by_name.get(name, [])
        if len(ds) < 2 or not excluded:
            return ds
        keep = []
        for d in ds:
            head = _head_idents(d)
            if head & excluded and not head & chosen:
                continue
            keep.append(d)
        return keep or ds

    included: dict[int, MetalSymbol] = {}
    stack = list(roots)
    while stack:
        s = stack.pop()
        if s.order in included:
            continue
        included[s.order] = s
        for u in s.uses:
            stack.extend(defs(u))
        for n in s.names:
            for und in undefs.get(n, ()):
                if und.order not in included:
                    included[und.order] = und
    if included:
        for s in metal.symbols:
            if s.kind == "global":
                included.setdefault(s.order, s)

    def deps(s: MetalSymbol) -> list[MetalSymbol]:
        out = []
        for u in s.uses:
            for d in defs(u):
                if d.order in included and d.file != s.file and d.order > s.order:
                    out.append(d)
        return out

    emitted: list[MetalSymbol] = []
    done: set[int] = set()
    visiting: set[int] = set()

    def visit(s: MetalSymbol):
        if s.order in done or s.order in visiting:
            return
        visiting.add(s.order)
        for d in sorted(deps(s), key=lambda x: x.order):
            visit(d)
        visiting.discard(s.order)
        done.add(s.order)
        emitted.append(s)

    for order in sorted(included):
        visit(included[order])
    return emitted, unknown


def _head_idents(sym: MetalSymbol) -> set[str]:
    """Identifiers of a definition's head (before its body): its parameter and specialisation types."""
    head = sym.text.split("{", 1)[0]
    return {t.decode() for t in IDENT.findall(mask_comments(head.encode()))}


def _instantiation_args(metal: MetalScan, roots: list[MetalSymbol]) -> tuple[set[str], set[str]]:
    """(identifiers in the requested instantiations' arguments, the types only other instantiations use).

    The types are those the Metal sources define (block_q8_0, block_q4_k, ...), never builtins like half:
    slicing kernel_mul_mv<block_q8_0> leaves out block_dot(device const block_q4_k *) and
    block_traits<block_iq2_xxs>, overloads and specialisations only other instantiations need."""
    chosen: set[str] = set()
    for r in roots:
        if r.kind != "instantiation":
            continue
        for inst in metal.instantiations:
            if inst.file == r.file and inst.line == r.line:
                for a in inst.args:
                    chosen.update(t.decode() for t in IDENT.findall(a.encode()))
    if not chosen:
        return set(), set()
    types = {n for s in metal.symbols if s.kind in ("struct", "typedef", "enum") for n in s.names}
    others: set[str] = set()
    for inst in metal.instantiations:
        for a in inst.args:
            others.update(t.decode() for t in IDENT.findall(a.encode()))
    return chosen, (others & types) - chosen


def render(symbols: list[MetalSymbol], unknown: list[str] = ()) -> str:
    out: list[str] = []
    prev: MetalSymbol | None = None
    for n in unknown:
        out.append(f"// porter: no Metal kernel, host name or symbol named {n}")
    for s in symbols:
        if prev is None or s.file != prev.file or s.order != prev.order + 1:
            out.append(f"\n// ---- {s.file}:{s.line} ----")
        out.append(s.text.rstrip())
        prev = s
    return "\n".join(out).lstrip("\n") + "\n"


def metal_slice(target, kernel_names, scan_result=None, strict: bool = False) -> str:
    """The Metal source slice of the given kernels/host names/symbols of `target`."""
    if isinstance(kernel_names, str):
        kernel_names = [kernel_names]
    if scan_result is None:
        from porter.target.scan import scan

        scan_result = scan(target)
    syms, unknown = closure(scan_result.metal, list(kernel_names))
    if strict and unknown:
        raise PorterError(f"no Metal kernel or symbol named {', '.join(unknown)} in target {target.name}")
    return render(syms, unknown)


def unit_slice(target, unit: str, scan_result=None) -> str:
    """The slice of every kernel the unit's host function dispatches (resolved and candidate names)."""
    if scan_result is None:
        from porter.target.scan import scan

        scan_result = scan(target)
    ad = scan_result.dispatch(unit)
    names: list[str] = []
    if ad is not None:
        names.extend(ad.kernels)
        for u in ad.unresolved:
            names.extend(c for c in u.candidates if c not in names)
    if not names:
        return f"// porter: {unit} dispatches no Metal kernel that the scan could resolve\n"
    return metal_slice(target, names, scan_result)


def unit_dispatch_text(target, unit: str, scan_result=None) -> str:
    """The unit's host dispatch, for the prompt: per dispatch site the kernels, buffer bindings and grid."""
    if scan_result is None:
        from porter.target.scan import scan

        scan_result = scan(target)
    ad = scan_result.dispatch(unit)
    host = scan_result.host.file if scan_result.host else "the host file"
    if ad is None or ad.line == 0:
        return f"{unit}: not defined in {host}\n"
    lines = [f"{unit} ({host}:{ad.line})"]
    if not ad.sites:
        lines.append("  dispatches no Metal kernel (host-side only)")
    for s in ad.sites:
        via = " -> ".join(s.path)
        lines.append(f"  dispatch at {s.function}:{s.line} (via {via})")
        lines.append(f"    pipeline {s.pipeline_expr}: {', '.join(s.kernels) or '(no static name)'}")
        for u in s.unresolved:
            c = f"; fits {', '.join(u.candidates)}" if u.candidates else ""
            lines.append(f"    UNRESOLVED {u.pattern}: {u.reason}{c}")
        for b in s.bindings:
            extra = (f" {'length' if b.kind == 'bytes' else 'offset'} {b.offset}") if b.offset else ""
            lines.append(f"    [{b.kind} {b.index}] {b.expr}{extra}")
        for g in s.grids:
            lines.append(f"    {g}")
    return "\n".join(lines) + "\n"
