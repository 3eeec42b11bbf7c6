"""The engine's call graph: which API functions prefill and decode reach, and by which path.

The engine sources (ds4.c, engine.c) are parsed with the C grammar (Objective-C
for .m) only to find function boundaries; inside each body, with comments and
strings masked, every identifier naming a function of the engine or of the API
is an edge (a call when followed by `(`, a reference otherwise: a function
handed over as a callback is reachable too).  Macros whose bodies name such
functions are nodes of their own.  A breadth-first walk from each entry point
keeps parent pointers, so every reached function has one shortest call chain.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from porter.target.scan.common import LineIndex, blank_attribute_macros, mask_comments

_TOKEN = re.compile(rb"([A-Za-z_]\w*)(\s*\()?")
_MACRO = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+(\w+)((?:[^\n\\]|\\.)*(?:\\\n(?:[^\n\\]|\\.)*)*)", re.M)


@dataclass
class Edge:
    callee: str
    line: int
    kind: str  # call | ref


@dataclass
class EngineGraph:
    files: list[str]
    functions: dict[str, tuple[str, int]]  # name -> (file, line); macros as "macro:NAME"
    edges: dict[str, list[Edge]]  # API functions have "host" edges to API functions their implementation calls
    api_callers: dict[str, list[tuple[str, int]]]  # unit -> [(caller, line)]
    entries: dict[str, list[str]]  # phase -> entry functions
    missing_entries: list[str]
    reach: dict[str, dict[str, tuple[int, str | None, int]]]  # phase -> node -> (depth, parent, line in parent)
    error_nodes: dict[str, int] = field(default_factory=dict)

    def path(self, phase: str, node: str) -> list[tuple[str, int]]:
        """[(function, line of the call in it)] from the phase's entry point to node; [] if unreachable."""
        r = self.reach.get(phase, {})
        if node not in r:
            return []
        nodes: list[str] = []
        cur: str | None = node
        while cur is not None:
            nodes.append(cur)
            cur = r[cur][1]
        nodes.reverse()
        return [(fn, r[nodes[i + 1]][2] if i + 1 < len(nodes) else 0) for i, fn in enumerate(nodes)]

    def depth(self, phase: str, node: str) -> int | None:
        r = self.reach.get(phase, {})
        return r[node][0] if node in r else None


def split_entries(spec: str) -> list[str]:
    """An entry point setting may name several functions: "a, b" or "a b"."""
    return [s for s in re.split(r"[\s,]+", spec or "") if s]


def scan_engine(sources: list[tuple[str, bytes]], api_names: list[str], entry_specs: dict[str, str],
                host_api_calls: dict[str, list[str]] | None = None) -> EngineGraph:
    """host_api_calls: API function -> API functions its host implementation calls (edges of kind "host")."""
    from porter.target.cparse import error_nodes, parser

    api = set(api_names)
    funcs: dict[str, tuple[str, int]] = {}
    bodies: list[tuple[str, str, bytes, int, LineIndex]] = []  # (name, file, masked body, body start, lines)
    macro_bodies: list[tuple[str, str, bytes, int, LineIndex]] = []
    errors: dict[str, int] = {}
    for fname, src in sources:
        lang = "objc" if fname.endswith((".m", ".mm")) else "c"
        tree = parser(lang).parse(blank_attribute_macros(src))
        errors[fname] = len(error_nodes(tree))
        lines = LineIndex(src)
        masked = mask_comments(src, strings=True)
        stack = [tree.root_node]
        while stack:
            n = stack.pop()
            if n.type == "function_definition":
                name = _function_name(n, src)
                body = n.child_by_field_name("body")
                if name and body is not None and name not in funcs:
                    funcs[name] = (fname, lines.line(n.start_byte))
                    bodies.append((name, fname, masked[body.start_byte : body.end_byte], body.start_byte, lines))
                continue
            if n.type in ("translation_unit", "preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif",
                          "linkage_specification", "declaration_list", "ERROR"):
                stack.extend(reversed(n.named_children))
        for m in _MACRO.finditer(masked):
            name = m.group(1).decode()
            macro_bodies.append((f"macro:{name}", fname, m.group(2), m.start(2), lines))

    macro_names = {mb[0][6:]: mb[0] for mb in macro_bodies}
    known = set(funcs) | api
    edges: dict[str, list[Edge]] = {}
    api_callers: dict[str, list[tuple[str, int]]] = {}

    def collect(owner: str, text: bytes, base: int, lines: LineIndex) -> list[Edge]:
        out: list[Edge] = []
        for m in _TOKEN.finditer(text):
            tok = m.group(1).decode()
            if tok == owner:
                continue
            if tok in known:
                target = tok
            elif tok in macro_names and macro_names[tok] != owner:
                target = macro_names[tok]
            else:
                continue
            out.append(Edge(target, lines.line(base + m.start()), "call" if m.group(2) else "ref"))
        return out

    for name, fname, text, base, lines in bodies + macro_bodies:
        es = collect(name, text, base, lines)
        if name.startswith("macro:") and not es:
            continue
        if name.startswith("macro:"):
            funcs.setdefault(name, (fname, lines.line(base)))
        edges.setdefault(name, []).extend(es)
    # macros that name nothing of interest are not nodes
    for name in list(edges):
        edges[name] = [e for e in edges[name] if not e.callee.startswith("macro:") or e.callee in edges]
        for e in edges[name]:
            if e.callee in api:
                api_callers.setdefault(e.callee, []).append((name, e.line))

    for u, callees in (host_api_calls or {}).items():
        if u in api:
            edges.setdefault(u, []).extend(Edge(c, 0, "host") for c in callees if c in api and c != u)

    entries = {phase: split_entries(spec) for phase, spec in entry_specs.items()}
    missing = [e for es in entries.values() for e in es if e not in funcs]
    reach: dict[str, dict[str, tuple[int, str | None, int]]] = {}
    for phase, es in entries.items():
        r: dict[str, tuple[int, str | None, int]] = {}
        q: deque[str] = deque()
        for e in es:
            if e in funcs and e not in r:
                r[e] = (0, None, 0)
                q.append(e)
        while q:
            cur = q.popleft()
            d = r[cur][0]
            for e in edges.get(cur, []):
                if e.callee not in r:
                    r[e.callee] = (d + 1, cur, e.line)
                    q.append(e.callee)
        reach[phase] = r
    return EngineGraph(
        files=[f for f, _ in sources],
        functions=funcs,
        edges=edges,
        api_callers=api_callers,
        entries=entries,
        missing_entries=missing,
        reach=reach,
        error_nodes=errors,
    )


def _function_name(node, src: bytes) -> str | None:
    d = node.child_by_field_name("declarator")
    seen = 0
    while d is not None and seen < 16:
        seen += 1
        if d.type == "function_declarator":
            inner = d.child_by_field_name("declarator")
            if inner is not None and inner.type in ("identifier", "field_identifier"):
                return src[inner.start_byte : inner.end_byte].decode()
            d = inner
            continue
        d = d.child_by_field_name("declarator")
    return None


