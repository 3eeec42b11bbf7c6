"""What a prompt is made of, gathered from the target and the workspace.

Every piece is read from a source, never written by hand: the signature and
doc comment from the API header (porter.target.cparse), the conventions header as it
is, the Metal slice and host dispatch from porter.target.scan (helper modules that may
be absent: then the unit's host function text, parsed out of the Metal host
file with tree-sitter, and a note saying what is missing), the quant types
from the census ranking (else the unit's name and doc), style examples from
the workspace's committed unit files whose derived state is verified with
perf judged (porter.commands.status: a 'built' unit may be wrong), and the diagnostics of earlier failures
with every verify-time seed removed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from porter.records import gitops
from porter.digest import sha256_bytes
from porter.errors import PorterError
from porter.target.placeholder import is_placeholder
from porter.target.plan import ranked_units
from porter.target.scan import scan
from porter.target.scan import slice as scan_slice
from porter.prompt.quant_layouts import canonical, layout_text, quant_types_from_text
from porter.prompt.rules import for_prompt as rules_for_prompt



@dataclass
class Section:
    title: str
    text: str
    lang: str = ""  # code-fence language, "" for prose


@dataclass
class Failure:
    attempt: int | None
    gate: str
    summary: str
    diagnostics: str


@dataclass
class UnitContext:
    target: str
    unit: str
    attempt: int
    api_header: str
    signature: str
    declaration: str
    doc: str
    conventions_name: str
    conventions: str
    rules: dict  # the target's declared rules for the system prompt (porter.prompt.rules.for_prompt)
    host_dispatch: list[Section] = field(default_factory=list)
    kernels: list[Section] = field(default_factory=list)
    helpers: list[Section] = field(default_factory=list)
    quant_types: list[str] = field(default_factory=list)
    layouts: list[Section] = field(default_factory=list)
    examples: list[Section] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    is_runtime: bool = False


# -- seeds: the verify-time seeds never reach the model ------------------------

_SEED_KV = re.compile(
    r"""(?ix)
    (["']?\b[\w.-]*seeds?\b["']?\s*[:=]\s*)          # seed= / "seeds": / rng_seed:
    ( \[[^\]]*\] | \([^)]*\) | \{[^}]*\} | "[^"]*" | '[^']*' | [^\s,;)}\]]+ )
    """
)
_SEED_NUM = r"(?:0x[0-9a-f]+|[0-9a-f]{8,}|\d+)"
_SEED_WORD = re.compile(rf"(?i)\b(seeds?)\b(\s+(?:of\s+|=\s*|#\s*)?)({_SEED_NUM}(?:\s*(?:,|and)\s*{_SEED_NUM})*)")


def _drop_seed_keys(obj):
    if isinstance(obj, dict):
        return {k: _drop_seed_keys(v) for k, v in obj.items() if "seed" not in str(k).lower()}
    if isinstance(obj, list):
        return [_drop_seed_keys(v) for v in obj]
    return obj


def strip_seeds(text: str) -> str:
    """Remove every seed value from diagnostics: JSON keys containing 'seed' are
    dropped, `seed=123`, `"seeds": [1, 2]`, `seed 42` become `seed=<withheld>`."""
    if not text:
        return text
    stripped = text.strip()
    if stripped[:1] in "{[":
        try:
            return json.dumps(_drop_seed_keys(json.loads(stripped)), indent=1, sort_keys=True)
        except ValueError:
            pass
    text = _SEED_KV.sub(lambda m: m.group(1) + "<withheld>", text)
    text = _SEED_WORD.sub(lambda m: m.group(1) + " <withheld>", text)
    return text


def _diagnostics_text(rec: dict, workspace: Path | None) -> str:
    for key in ("diagnostics_text", "text", "diagnostics_full"):
        if isinstance(rec.get(key), str) and rec[key]:
            return rec[key]
    diag = rec.get("diagnostics")
    if isinstance(diag, dict):
        return json.dumps(diag, indent=1, sort_keys=True)
    if isinstance(diag, str) and diag:
        if re.fullmatch(r"[0-9a-f]{64}", diag):
            if workspace is not None:
                p = Path(workspace) / "runs" / "diagnostics" / f"{diag}.txt"
                if p.is_file():
                    return p.read_text(errors="replace")
            return ""
        return diag
    return ""


def failures_from_records(records: list, workspace: Path | None) -> list[Failure]:
    """The prompt's failures from porter.records.history's typed failure records (or dicts shaped like ledger lines)."""
    out = []
    for rec in records or []:
        if not isinstance(rec, dict):
            rec = {k: getattr(rec, k, None) for k in ("attempt", "gate", "summary", "diagnostics")}
        out.append(Failure(
            attempt=rec.get("attempt"),
            gate=str(rec.get("gate") or "?"),
            summary=strip_seeds(str(rec.get("summary") or "")),
            diagnostics=strip_seeds(_diagnostics_text(rec, workspace)),
        ))
    return out


# -- the API header -----------------------------------------------------------

def _clean_doc(doc: str) -> str:
    return doc.strip()


def declaration_as_written(target, fn) -> str:
    """The declaration with the header's own line breaks (from its line to the ';')."""
    try:
        lines = Path(target.api_header).read_text(errors="replace").splitlines()
    except OSError:
        return fn.declaration
    if not fn.line or fn.line > len(lines):
        return fn.declaration
    out = []
    for line in lines[fn.line - 1 :]:
        out.append(line.rstrip())
        if ";" in line:
            break
    text = "\n".join(out)
    return text if fn.name in text else fn.declaration


# -- Metal side ------------------------------------------------------------------

def _host_functions(target) -> dict[str, tuple[str, list[str]]]:
    """name -> (text with the comment above it, names it calls) for every function
    defined in the Metal host file (tree-sitter objc)."""
    path = Path(target.metal_host)
    if not path.is_file():
        return {}
    from porter.target.cparse import parser

    src = path.read_bytes()
    tree = parser("objc").parse(src)
    out: dict[str, tuple[str, list[str]]] = {}
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type != "function_definition":
            stack.extend(node.children)
            continue
        decl = node.child_by_field_name("declarator")
        while decl is not None and decl.type == "pointer_declarator":
            decl = decl.child_by_field_name("declarator")
        if decl is None or decl.type != "function_declarator":
            continue
        name_node = decl.child_by_field_name("declarator")
        if name_node is None:
            continue
        start = node.start_byte
        prev = node.prev_sibling
        if prev is not None and prev.type == "comment" and node.start_point[0] - prev.end_point[0] <= 1:
            start = prev.start_byte
        calls: list[str] = []
        inner = [node]
        while inner:
            n = inner.pop()
            if n.type == "call_expression":
                f = n.child_by_field_name("function")
                if f is not None and f.type == "identifier":
                    calls.append(f.text.decode())
            inner.extend(n.children)
        out[name_node.text.decode()] = (src[start : node.end_byte].decode("utf-8", "replace"), calls)
    return out


def host_function_text(target, unit: str) -> str | None:
    """The unit's definition in the Metal host file (tree-sitter objc), or None."""
    found = _host_functions(target).get(unit)
    return found[0] if found else None


def host_dispatch_fallback(target, unit: str, max_depth: int = 2) -> list[Section]:
    """The unit's host function, then the functions of the same file it calls
    (transitively, up to max_depth) that encode a dispatch: the grid, threadgroup
    sizes and buffer bindings the Metal backend uses."""
    funcs = _host_functions(target)
    if unit not in funcs:
        return []
    host = Path(target.metal_host).name
    out = [Section(f"{unit} in {host}", funcs[unit][0], "objc")]
    seen = {unit}
    frontier = [unit]
    for _ in range(max_depth):
        nxt = []
        for name in frontier:
            for callee in funcs[name][1]:
                if callee in seen or callee not in funcs:
                    continue
                seen.add(callee)
                text = funcs[callee][0]
                if "dispatchThread" in text:
                    out.append(Section(f"{callee} in {host} (called by {name})", text, "objc"))
                nxt.append(callee)
        frontier = nxt
    return out


_KERNEL_KINDS = ("kernel", "template_kernel", "instantiation")


def _symbol_section(sym) -> Section:
    names = ", ".join(n for n in sym.names if not n.startswith("host:")) or sym.kind
    return Section(f"{Path(sym.file).name}:{sym.line} {names}", sym.text.rstrip(), "metal")


def metal_context(target, unit: str, ctx: UnitContext) -> None:
    """Fill host dispatch, kernels and helpers from porter.target.scan / porter.target.plan, or fall back
    to the unit's host function text (and say what is missing)."""
    result = None
    try:
        result = scan(target)
    except Exception as exc:  # noqa: BLE001 - the prompt must still be buildable
        ctx.missing.append(f"the Metal scan failed ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})")

    # the kernels and quant types: the ranking (census-aware) first, else the dispatch map
    kernels: list[str] = []
    ranked = None
    if result is not None:
        try:
            ranked = next((r for r in ranked_units(target) if r.unit == unit), None)
        except Exception as exc:  # noqa: BLE001
            ctx.missing.append(f"the unit ranking failed ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})")
    if ranked is not None:
        kernels = list(getattr(ranked, "kernels", None) or [])
        kernels += [k for k in (getattr(ranked, "candidate_kernels", None) or []) if k not in kernels]
        qt = [canonical(q) for q in (getattr(ranked, "quant_types", None) or [])]
        ctx.quant_types = [q for q in qt if q]
    ad = result.dispatch(unit) if result is not None else None
    if ad is not None:
        for k in list(ad.kernels) + [c for u in ad.unresolved for c in u.candidates]:
            if k not in kernels:
                kernels.append(k)

    # host side: the scanner's dispatch summary + the host functions on the way to each dispatch
    host_name = Path(target.metal_host).name
    funcs = _host_functions(target)
    if ad is not None and ad.line:
        try:
            summary = scan_slice.unit_dispatch_text(target, unit, result)
        except Exception:  # noqa: BLE001
            summary = ""
        if summary.strip():
            ctx.host_dispatch.append(Section("dispatch summary (porter.target.scan: kernels, buffer bindings, grid)",
                                             summary.rstrip(), "text"))
        for name in [unit] + [h for h in ad.helpers if h != unit]:
            if name in funcs:
                title = f"{name} in {host_name}" + ("" if name == unit else " (on the way to a dispatch)")
                ctx.host_dispatch.append(Section(title, funcs[name][0], "objc"))
    else:
        ctx.host_dispatch = host_dispatch_fallback(target, unit)
        if result is None and ctx.host_dispatch:
            ctx.missing.append("the host dispatch scan (porter.target.scan) is not available: the host function "
                               "text is shown instead of its resolved kernels, bindings and grid")
    if not ctx.host_dispatch:
        ctx.missing.append(f"no definition of {unit} was found in the Metal host file {host_name}")

    # the Metal slice: the kernels themselves, then everything they use
    if result is not None and kernels:
        try:
            syms, unknown = scan_slice.closure(result.metal, kernels)
        except Exception as exc:  # noqa: BLE001
            syms, unknown = [], []
            ctx.missing.append(f"the Metal source slice failed ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:160]})")
        for sym in syms:
            (ctx.kernels if sym.kind in _KERNEL_KINDS else ctx.helpers).append(_symbol_section(sym))
        if unknown:
            ctx.missing.append(f"no Metal source found for {', '.join(unknown)}")
    if ad is not None and ad.unresolved:
        for u in ad.unresolved:
            ctx.missing.append(f"a kernel name the scanner could not resolve statically: {u.pattern} ({u.reason})")
    if not ctx.kernels and not ctx.is_runtime:
        if result is None:
            ctx.missing.append("the Metal kernel source slice (porter.target.scan) is not available: only the host "
                               "function is shown; follow its pipeline names and the API contract above")
        elif ad is not None and ad.sites:
            ctx.missing.append("the Metal source of the kernels this unit dispatches was not found")


# -- style examples ----------------------------------------------------------

def _committed_units(target) -> dict[str, str]:
    """unit -> text of its committed (HEAD) file under the workspace's ported dir."""
    ws = Path(target.workspace)
    rel_dir = Path(target.ported_dir).relative_to(ws).as_posix()
    try:
        listed = gitops.read(ws, "ls-tree", "--name-only", "HEAD", rel_dir + "/").decode()
    except PorterError:
        return {}
    out = {}
    for rel in listed.split():
        if not rel.endswith(".cu"):
            continue
        blob = gitops.committed_blob(ws, rel)
        if blob is not None:
            out[Path(rel).stem] = blob.decode("utf-8", "replace")
    return out


def _words(name: str, prefix: str) -> set[str]:
    return set(w for w in name.removeprefix(prefix).split("_") if w and w != "tensor")


# states whose code was judged correct by parity and fast enough by perf: what a model may imitate
TRUSTED_STATES = ("verified", "verified (unsandboxed)")


def trusted_units(target) -> tuple[dict[str, tuple[str, str]], str | None]:
    """unit -> (state, candidate sha256) of the units status derives as verified with perf judged (a
    wrong answer committed as 'built' on a machine without a GPU must never be shown as the way to
    write a unit); (empty, why) when the workspace's state cannot be derived or is not trustworthy."""
    from porter.commands.status import derive  # status reads the prompt's neighbours; imported where needed

    try:
        report = derive(target.workspace, target=target, rank=False, prefill=False)
    except Exception as exc:  # noqa: BLE001 - the prompt must still be buildable
        return {}, f"style examples: the units' states could not be derived ({type(exc).__name__}: " \
                   f"{' '.join(str(exc).split())[:160]})"
    if report.tampered:
        return {}, "style examples: none, the workspace's history is tampered or rolled back (see `porter status`)"
    return {u.unit: (u.state, u.candidate_sha256) for u in report.units if u.state in TRUSTED_STATES}, None


def style_examples(target, unit: str, limit: int = 2, max_chars: int = 6000) -> tuple[list[Section], str | None]:
    """Up to `limit` committed units whose state is verified with perf judged, most similar first;
    units that launch a kernel are preferred (they show the conventions in use).  Each example's title
    says its state.  Returns (examples, a note for the prompt's missing list or None)."""
    files = _committed_units(target)
    if not any(name != unit and not is_placeholder(text) for name, text in files.items()):
        return [], None  # nothing ported yet: nothing to derive
    trusted, why = trusted_units(target)
    mine = _words(unit, target.symbol_prefix)
    runtime = set(target.runtime_units)
    scored = []
    for name, text in files.items():
        if name == unit or is_placeholder(text) or len(text) > max_chars or name not in trusted:
            continue
        state, sha = trusted[name]
        if sha != sha256_bytes(text.encode()):
            continue  # the committed file is not the one that was verified
        score = (
            "<<<" in text,
            name not in runtime,
            len(mine & _words(name, target.symbol_prefix)),
            -len(text),
        )
        scored.append((score, name, text, state))
    scored.sort(reverse=True)
    if any(score[0] for score, *_ in scored):  # units that launch kernels show more than plumbing does
        scored = [x for x in scored if x[0][0]]
    return [Section(f"{name} ({state}: parity and perf passed)", text.strip(), "cuda")
            for _, name, text, state in scored[:limit]], why


# -- everything ----------------------------------------------------------------

def gather(target, unit: str, attempt: int, failures: list) -> UnitContext:
    fn = target.api_function(unit)
    conv_path = Path(target.conventions_header)
    conventions = conv_path.read_text(errors="replace") if conv_path.is_file() else ""
    ctx = UnitContext(
        target=target.name,
        unit=unit,
        attempt=attempt,
        api_header=Path(target.api_header).name,
        signature=fn.c_signature(),
        declaration=declaration_as_written(target, fn),
        doc=_clean_doc(fn.doc),
        conventions_name=conv_path.name,
        conventions=conventions.strip(),
        rules=rules_for_prompt(target, conventions),
        is_runtime=unit in target.runtime_units,
    )
    if not conventions:
        ctx.missing.append(f"the conventions header {conv_path.name} could not be read")
    metal_context(target, unit, ctx)
    # the unit's name names its weight type (matmul_q8_0); the doc only when the
    # name names none (its prose mentions e.g. the f16 scale inside a Q8_0 block)
    for q in quant_types_from_text(unit) or quant_types_from_text(fn.doc):
        if q not in ctx.quant_types:
            ctx.quant_types.append(q)
    for q in ctx.quant_types:
        if q == "F32":
            continue  # plain float32: nothing to explain
        try:
            ctx.layouts.append(Section(q, layout_text(q)))
        except KeyError:
            ctx.missing.append(f"no block layout description for quant type {q}")
    ctx.examples, why = style_examples(target, unit)
    if why:
        ctx.missing.append(why)
    ctx.failures = failures_from_records(failures, getattr(target, "workspace", None))
    return ctx
