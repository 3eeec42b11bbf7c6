"""Slicing one API function out of an existing CUDA backend, with what it reaches.

The reference provider answers a unit with upstream's own code for it: the API
function, the kernels it launches and every file-scope helper, device
function, constant, type and macro those reach.  This module does the
mechanical part, with tree-sitter (porter.target.cparse), in three steps:

1. `CudaFile.parse`: the file's top-level declarations, each with the names
   it defines, its kind and the identifiers its text mentions.  Quoted
   includes named by the rules are expanded in place first (their
   declarations then carry the rule's storage prefix, e.g. `static`).
2. `closure`: from the unit's definition, follow mentioned names to the
   declarations that define them.  Names the conventions header provides
   (SliceRules.provided and the keys of SliceRules.rename) and other API
   functions (resolved at link time through extern "C") are not followed.
3. `render`: the chosen declarations in source order, renames applied to
   identifiers outside comments and strings, a non-API extern "C" function
   turned into a static one, system includes dropped (the conventions header
   includes what the backend needs; the extractor would refuse most of them).

A mutable file-scope variable is shared state: slicing it into a unit would
give that unit a private copy, which is silently wrong.  It must be renamed to
the conventions' shared variable or named in `per_unit`; otherwise render()
refuses with a one-line error naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import tree_sitter as ts

from porter.target.cparse import parse_cuda
from porter.errors import PorterError
from porter.target.scan.common import IDENT, blank, blank_attribute_macros, mask_comments

# `__align__(16)` and friends confuse the grammar; blanked in the parsed copy only.
_ALIGN = re.compile(rb"\b__align__\s*\(\s*\d+\s*\)")
_INCLUDE_LINE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[^\n]*$', re.M)


class SliceError(PorterError):
    """The file cannot be sliced as the rules say (unknown unit, unrenamed shared state...)."""


@dataclass(frozen=True)
class SliceRules:
    provided: frozenset[str] = frozenset()  # defined by the conventions header under the same name
    rename: dict = field(default_factory=dict)  # upstream name -> conventions name (not sliced)
    per_unit: frozenset[str] = frozenset()  # mutable globals a unit may own a private copy of
    inline_includes: dict = field(default_factory=dict)  # quoted include -> storage prefix ("static")
    api: frozenset[str] = frozenset()  # API functions: calls between them stay calls
    append_missing_params: bool = False  # see porter.providers.reference

    @property
    def not_sliced(self) -> frozenset[str]:
        return self.provided | frozenset(self.rename)


@dataclass
class Decl:
    """One top-level declaration of the file."""

    kind: str  # function, prototype, variable, type, macro, include, other
    names: tuple[str, ...]
    start: int
    end: int
    refs: frozenset[str]
    extern_c: bool = False
    prefix: str = ""  # storage added on render (inlined includes)
    mutable: bool = False  # a variable that is neither const nor __constant__
    include: str = ""  # for kind == include: the file name
    body_start: int = 0  # extern "C": where the inner declaration starts


def _t(node: ts.Node) -> str:
    return node.text.decode("utf-8", "replace")


def _declarator_names(node: ts.Node) -> list[str]:
    """Names declared by a declarator (identifier inside pointer/array/init/function declarators)."""
    out = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type in ("identifier", "type_identifier", "field_identifier"):
            out.append(_t(n))
            continue
        if n.type in ("qualified_identifier", "destructor_name", "operator_name"):
            out.append(_t(n))
            continue
        if n.type == "parameter_list" or n.type == "argument_list":
            continue
        decl = n.child_by_field_name("declarator")
        if decl is not None:
            stack.append(decl)
        elif n.type in ("init_declarator",):
            stack.extend(n.named_children[:1])
    return out


def _is_function_declarator(node: ts.Node | None) -> bool:
    while node is not None:
        if node.type == "function_declarator":
            return True
        node = node.child_by_field_name("declarator")
    return False


class CudaFile:
    """A CUDA source as top-level declarations (see the module docstring)."""

    def __init__(self, name: str, src: bytes, decls: list[Decl]):
        self.name = name
        self.src = src
        self.decls = decls
        self.by_name: dict[str, list[Decl]] = {}
        for d in decls:
            for n in d.names:
                self.by_name.setdefault(n, []).append(d)

    @classmethod
    def parse(cls, path: Path, rules: SliceRules, text: str | None = None) -> "CudaFile":
        path = Path(path)
        src = text.encode() if text is not None else path.read_bytes()
        # Expand the rules' quoted includes in place; remember which bytes came from which.
        inlined: list[tuple[int, int, str]] = []
        while True:
            m = next((m for m in _INCLUDE_LINE.finditer(src) if m.group(1).decode() in rules.inline_includes
                      and not any(a <= m.start() < b for a, b, _ in inlined)), None)
            if m is None:
                break
            inc_name = m.group(1).decode()
            inc_path = path.parent / inc_name
            if not inc_path.is_file():
                raise SliceError(f"{path.name} includes {inc_name}, which the rules inline, but {inc_path} does not exist")
            body = inc_path.read_bytes()
            if not body.endswith(b"\n"):
                body += b"\n"
            src = src[: m.start()] + body + src[m.end():]
            delta = len(body) - (m.end() - m.start())
            inlined = [(a + (delta if a > m.start() else 0), b + (delta if b > m.start() else 0), s) for a, b, s in inlined]
            inlined.append((m.start(), m.start() + len(body), rules.inline_includes[inc_name]))
        parsed = blank_attribute_macros(_ALIGN.sub(lambda m: blank(m.group(0)), src))
        tree = parse_cuda(parsed)
        masked = mask_comments(src, strings=True)
        decls: list[Decl] = []
        children = list(tree.root_node.children)
        for i, node in enumerate(children):
            d = _decl(node, src, masked)
            if d is None:
                continue
            # `struct x {...}` parses as a specifier followed by a lone ';' sibling.
            if node.type in ("struct_specifier", "enum_specifier", "union_specifier", "class_specifier") \
                    and i + 1 < len(children) and children[i + 1].type == ";":
                d.end = children[i + 1].end_byte
            for a, b, storage in inlined:
                if a <= d.start < b and storage:
                    d.prefix = storage.strip() + " "
            decls.append(d)
        return cls(path.name, src, decls)

    def text(self, d: Decl) -> str:
        return self.src[d.start: d.end].decode("utf-8", "replace")

    def definition(self, name: str) -> Decl:
        for d in self.by_name.get(name, []):
            if d.kind == "function":
                return d
        raise SliceError(f"{self.name} defines no function {name}")


def _refs(masked: bytes, start: int, end: int, own: tuple[str, ...]) -> frozenset[str]:
    return frozenset(m.group(0).decode() for m in IDENT.finditer(masked, start, end)) - set(own)


def _mutable(head: str, declarator: ts.Node) -> bool:
    """Can code write this variable?  `const T *p` can be repointed; `T *const p` and `const T x` cannot."""
    if re.search(r"\b(constexpr|__constant__)\b", head):
        return False
    node = declarator.child_by_field_name("declarator") if declarator.type == "init_declarator" else declarator
    if node is not None and node.type == "pointer_declarator":
        return not any(c.type == "type_qualifier" and _t(c) == "const" for c in node.children)
    return not re.search(r"\bconst\b", head)


def _decl(node: ts.Node, src: bytes, masked: bytes) -> Decl | None:
    t = node.type
    start, end = node.start_byte, node.end_byte
    if t in ("comment", ";"):
        return None
    if t == "preproc_include":
        path = node.child_by_field_name("path")
        name = _t(path).strip('"<>') if path is not None else ""
        return Decl("include", (), start, end, frozenset(), include=name)
    if t in ("preproc_def", "preproc_function_def"):
        name = _t(node.child_by_field_name("name"))
        return Decl("macro", (name,), start, end, _refs(masked, start, end, (name,)))
    if t in ("preproc_ifdef", "preproc_if"):
        names = tuple(_t(c.child_by_field_name("name")) for c in node.named_children
                      if c.type in ("preproc_def", "preproc_function_def"))
        return Decl("macro", names, start, end, _refs(masked, start, end, names))
    if t == "linkage_specification":
        body = node.child_by_field_name("body")
        if body is None or body.type not in ("function_definition", "declaration"):
            return Decl("other", (), start, end, _refs(masked, start, end, ()))
        inner = _decl(body, src, masked)
        if inner is None:
            return None
        inner.start, inner.end, inner.extern_c, inner.body_start = start, end, True, body.start_byte
        inner.refs = _refs(masked, start, end, inner.names)
        return inner
    if t == "template_declaration":
        inner_node = next((c for c in node.named_children if c.type in ("function_definition", "declaration")), None)
        if inner_node is None:
            return Decl("other", (), start, end, _refs(masked, start, end, ()))
        inner = _decl(inner_node, src, masked)
        if inner is None:
            return None
        params = tuple(_declarator_names(p) and _declarator_names(p)[0] or "" for p in
                       (node.child_by_field_name("parameters").named_children if node.child_by_field_name("parameters") else []))
        inner.start, inner.end = start, end
        inner.refs = _refs(masked, start, end, inner.names + params)
        return inner
    if t == "function_definition":
        names = tuple(_declarator_names(node.child_by_field_name("declarator"))[:1])
        return Decl("function", names, start, end, _refs(masked, start, end, names))
    if t == "declaration":
        declarators = node.children_by_field_name("declarator")
        if declarators and all(_is_function_declarator(d) for d in declarators):
            names = tuple(n for d in declarators for n in _declarator_names(d)[:1])
            return Decl("prototype", names, start, end, _refs(masked, start, end, names))
        names = tuple(n for d in declarators for n in _declarator_names(d)[:1])
        # `struct s {...} x;` also defines the struct's tag.
        type_node = node.child_by_field_name("type")
        if type_node is not None and type_node.type in ("struct_specifier", "enum_specifier", "union_specifier") \
                and type_node.child_by_field_name("body") is not None and type_node.child_by_field_name("name") is not None:
            names = names + (_t(type_node.child_by_field_name("name")),)
        head = " ".join(_t(c) for c in node.children if c.type in ("type_qualifier", "storage_class_specifier")
                        or _t(c) in ("__constant__", "__device__", "__shared__", "constexpr"))
        return Decl("variable", names, start, end, _refs(masked, start, end, names),
                    mutable=any(_mutable(head, d) for d in declarators))
    if t in ("struct_specifier", "enum_specifier", "union_specifier", "class_specifier"):
        names = []
        name = node.child_by_field_name("name")
        if name is not None:
            names.append(_t(name))
        body = node.child_by_field_name("body")
        if t == "enum_specifier" and body is not None:
            names += [_t(e.child_by_field_name("name")) for e in body.named_children if e.type == "enumerator"]
        return Decl("type", tuple(names), start, end, _refs(masked, start, end, tuple(names)))
    if t in ("type_definition", "alias_declaration"):
        names = tuple(n for d in node.children_by_field_name("declarator") for n in _declarator_names(d)[:1])
        if t == "alias_declaration" and node.child_by_field_name("name") is not None:
            names = (_t(node.child_by_field_name("name")),)
        type_node = node.child_by_field_name("type")
        if type_node is not None and type_node.child_by_field_name("name") is not None \
                and type_node.child_by_field_name("body") is not None:
            names = names + (_t(type_node.child_by_field_name("name")),)
        return Decl("type", names, start, end, _refs(masked, start, end, names))
    return Decl("other", (), start, end, _refs(masked, start, end, ()))


@dataclass
class Slice:
    unit: str
    decls: list[Decl]  # in source order
    text: str
    api_calls: list[str]  # other API functions it calls (resolved at link time)
    provided_used: list[str]  # names the conventions header must provide

    def names(self) -> set[str]:
        return {n for d in self.decls for n in d.names}


def closure(cf: CudaFile, unit: str, rules: SliceRules) -> tuple[list[Decl], set[str], set[str]]:
    """(declarations the unit needs, API functions it calls, provided names it uses)."""
    root = cf.definition(unit)
    chosen: dict[int, Decl] = {id(root): root}
    api_calls: set[str] = set()
    provided: set[str] = set()
    todo = [root]
    while todo:
        d = todo.pop()
        for name in d.refs:
            if name == unit:
                continue
            if name in rules.not_sliced:
                provided.add(name)
                continue
            if name in rules.api:
                api_calls.add(name)
                continue
            for dep in cf.by_name.get(name, []):
                if id(dep) not in chosen and dep.kind not in ("include", "other"):
                    chosen[id(dep)] = dep
                    todo.append(dep)
    return sorted(chosen.values(), key=lambda d: d.start), api_calls, provided


def path_decls(cf: CudaFile, unit: str, rules: SliceRules) -> list[Decl]:
    """What a call of `unit` can run: its slice and, transitively, the slices of the API functions
    it calls (an API function this file does not define contributes nothing)."""
    seen, todo, out = set(), [unit], []
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        try:
            decls, calls, _ = closure(cf, u, rules)
        except SliceError:
            if u == unit:
                raise
            continue
        out.extend(decls)
        todo.extend(calls)
    return out


def _apply_renames(text: str, rename: dict) -> str:
    if not rename:
        return text
    data = text.encode()
    masked = mask_comments(data, strings=True)
    out, last = [], 0
    for m in IDENT.finditer(masked):
        new = rename.get(m.group(0).decode())
        if new is None:
            continue
        # member access (`r.bytes`) is not the file-scope name
        before = masked[:m.start()].rstrip()
        if before.endswith((b".", b"->")) or (before.endswith(b"::") and not before.endswith(b" ::")):
            continue
        out.append(data[last: m.start()])
        out.append(new.encode())
        last = m.end()
    out.append(data[last:])
    return b"".join(out).decode("utf-8", "replace")


def render_decl(cf: CudaFile, d: Decl, rules: SliceRules) -> str:
    text = cf.text(d)
    if d.extern_c and not any(n in rules.api for n in d.names):
        # a helper upstream exports but the API header does not name: private to this unit
        text = "static " + cf.src[d.body_start: d.end].decode("utf-8", "replace")
    elif d.prefix and not text.lstrip().startswith(d.prefix.strip()):
        text = d.prefix + text
    return _apply_renames(text, rules.rename)


def slice_unit(cf: CudaFile, unit: str, rules: SliceRules, header: str, banner: str = "") -> Slice:
    decls, api_calls, provided = closure(cf, unit, rules)
    shared = [n for d in decls if d.kind == "variable" and d.mutable for n in d.names if n not in rules.per_unit]
    if shared:
        raise SliceError(f"{unit} reaches file-scope state {', '.join(sorted(shared))} of {cf.name}: rename it to the "
                         f"conventions' shared variable or list it in per_unit (a private copy per unit is wrong)")
    parts = []
    if banner:
        parts.append("\n".join("// " + l if l else "//" for l in banner.splitlines()))
    parts.append(f'#include "{header}"')
    for d in decls:
        if d.kind == "include":
            continue
        parts.append(render_decl(cf, d, rules))
    text = "\n\n".join(parts) + "\n"
    return Slice(unit, decls, text, sorted(api_calls), sorted(provided))
