"""Metal Shading Language sources, read with the C++ tree-sitter grammar.

MSL is C++14 plus a few things the grammar does not know: `kernel` (and
`vertex`/`fragment`) function specifiers, address spaces (`device`, `constant`,
`threadgroup`, `thread`) and `[[...]]` attributes in places C++ does not allow
them (`uint gid [[thread_position_in_grid]]`, `template [[host_name("x")]] kernel T f<...>;`).
A pre-pass replaces each of those with the same number of spaces, recording
what it removed and where; every node of the parse then still points at the
original bytes.  Loop macros of the form `#define M(x) ... for (x)` (ds4's
FOR_UNROLL) are rewritten to `for` padded to the same length.

What comes out (MetalScan): each file's ERROR-node count, the kernels with
their parameters (address space, attributes, buffer index), template kernels
and their explicit instantiations (host name -> template + arguments), function
constants, and every top-level symbol with the names it defines and uses, which
porter.target.scan.slice turns into a self-contained source slice.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from porter.target.scan.common import IDENT, LineIndex, blank, eval_int, mask_comments, norm_ws

ADDRESS_SPACES = ("device", "constant", "threadgroup", "thread")
FUNCTION_SPECIFIERS = ("kernel", "vertex", "fragment")
_ATTR = re.compile(rb"\[\[(.*?)\]\]", re.S)
_KEYWORD = re.compile(rb"\b(kernel|vertex|fragment|device|constant|threadgroup|thread)\b")
_LOOP_MACRO_DEF = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]*\([ \t]*(\w+)[ \t]*\)([^\n]*)$", re.M)
_OBJ_MACRO_DEF = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+([^\n]*?)[ \t]*$", re.M)
_HOST_NAME = re.compile(r'^\s*host_name\s*\(\s*"([^"]*)"\s*\)\s*$')
_BUFFER = re.compile(r"^\s*buffer\s*\((.*)\)\s*$", re.S)
_FUNCTION_CONSTANT = re.compile(r"^\s*function_constant\s*\((.*)\)\s*$", re.S)


@dataclass(frozen=True)
class MetalParam:
    name: str
    decl: str  # as written, attributes removed, whitespace normalised: "device const char * src0"
    type: str  # decl without the name
    address_space: str | None
    attributes: tuple[str, ...]  # e.g. ("buffer(0)",), ("thread_position_in_grid",)
    buffer: int | None  # Metal buffer index (explicit [[buffer(n)]] or assigned in order)
    buffer_implicit: bool = False


@dataclass(frozen=True)
class MetalKernel:
    name: str  # the C++ function name
    file: str
    line: int
    params: tuple[MetalParam, ...]
    attributes: tuple[str, ...]  # attributes in front of the function, e.g. host_name("x")
    host_name: str | None  # explicit [[host_name]] (non-template kernels)
    template: bool
    template_params: str | None
    specifier: str = "kernel"


@dataclass(frozen=True)
class Instantiation:
    host_name: str | None
    template: str  # the template kernel's name
    args: tuple[str, ...]
    type_name: str | None  # the function type named in the instantiation (a decltype typedef)
    file: str
    line: int
    text: str


@dataclass(frozen=True)
class HostName:
    """A name the host can ask the library for (newFunctionWithName:)."""

    name: str
    kernel: str  # the kernel function (or template) behind it
    template_args: tuple[str, ...] | None  # None: a plain kernel
    file: str
    line: int


@dataclass(frozen=True)
class FunctionConstant:
    name: str
    type: str
    index_expr: str
    index: int | None
    file: str
    line: int


@dataclass
class MetalSymbol:
    """One top-level item of a Metal source, with the comment/attribute lines in front of it."""

    order: int  # position in library order (files in order, items in file order)
    kind: str  # function kernel template_kernel struct enum typedef macro undef variable function_constant
    #           instantiation declaration global other
    names: tuple[str, ...]
    file: str
    line: int
    text: str
    uses: tuple[str, ...] = ()
    undefines: str | None = None  # for `#undef X`


@dataclass
class MetalFileReport:
    path: str
    lines: int
    error_nodes: int
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line, first bytes) of the first few


@dataclass
class MetalScan:
    files: list[MetalFileReport]
    kernels: list[MetalKernel]
    instantiations: list[Instantiation]
    host_names: dict[str, HostName]
    function_constants: list[FunctionConstant]
    symbols: list[MetalSymbol]
    macros: dict[str, str]
    duplicate_host_names: list[str] = field(default_factory=list)

    def kernel(self, name: str) -> MetalKernel | None:
        for k in self.kernels:
            if k.name == name:
                return k
        return None

    def helpers(self) -> list[MetalSymbol]:
        """Top-level non-kernel definitions: functions, structs, enums, typedefs, macros, constants."""
        return [s for s in self.symbols if s.kind in ("function", "struct", "enum", "typedef", "template", "macro",
                                                      "variable", "function_constant")]

    @property
    def error_node_total(self) -> int:
        return sum(f.error_nodes for f in self.files)


# ---------------------------------------------------------------- pre-pass


@dataclass
class _Prepared:
    name: str
    original: bytes
    nocomment: bytes  # comments blanked
    parsed: bytes  # what the grammar sees
    attrs: list[tuple[int, int, str]]  # (start, end, content)
    attr_starts: list[int]
    keywords: list[tuple[int, str]]
    keyword_starts: list[int]


def loop_macros(sources: list[bytes]) -> set[str]:
    """Names of `#define M(x) ... for (x)` macros in any of the sources."""
    found: set[str] = set()
    for src in sources:
        for m in _LOOP_MACRO_DEF.finditer(src):
            name, param, body = m.group(1), m.group(2), m.group(3)
            if re.search(rb"\bfor\s*\(\s*" + re.escape(param) + rb"\s*\)\s*$", body.rstrip(b"\\ \t")):
                found.add(name.decode())
    return found


def object_macros(sources: list[bytes]) -> dict[str, str]:
    out: dict[str, str] = {}
    for src in sources:
        for m in _OBJ_MACRO_DEF.finditer(mask_comments(src)):
            out[m.group(1).decode()] = m.group(2).decode("utf-8", "replace").strip()
    return out


def prepare(name: str, src: bytes, loop_macro_names: set[str]) -> _Prepared:
    nc = mask_comments(src)
    out = bytearray(nc)
    attrs: list[tuple[int, int, str]] = []
    for m in _ATTR.finditer(nc):
        attrs.append((m.start(), m.end(), norm_ws(m.group(1).decode("utf-8", "replace"))))
        out[m.start() : m.end()] = blank(m.group(0))
    keywords: list[tuple[int, str]] = []
    for m in _KEYWORD.finditer(nc):
        before = nc[max(0, m.start() - 2) : m.start()]
        if before.endswith((b".", b"::", b"->")) or nc[m.end() : m.end() + 2] == b"::":
            continue
        if bytes(out[m.start() : m.end()]) != m.group(0):  # already blanked (inside an attribute)
            continue
        keywords.append((m.start(), m.group(1).decode()))
        out[m.start() : m.end()] = b" " * (m.end() - m.start())
    if loop_macro_names:
        pat = re.compile(rb"\b(" + b"|".join(re.escape(n.encode()) for n in sorted(loop_macro_names)) + rb")\b(\s*)\(")
        for m in pat.finditer(bytes(out)):
            # leave the #define line itself alone
            line_start = out.rfind(b"\n", 0, m.start()) + 1
            if re.match(rb"[ \t]*#", bytes(out[line_start : m.start()])):
                continue
            span = m.end() - 1 - m.start()
            out[m.start() : m.end() - 1] = b"for" + b" " * (span - 3)
    return _Prepared(
        name=name,
        original=src,
        nocomment=nc,
        parsed=bytes(out),
        attrs=attrs,
        attr_starts=[a[0] for a in attrs],
        keywords=keywords,
        keyword_starts=[k[0] for k in keywords],
    )


def _attrs_in(p: _Prepared, lo: int, hi: int) -> list[str]:
    i = bisect.bisect_left(p.attr_starts, lo)
    out = []
    while i < len(p.attrs) and p.attrs[i][0] < hi:
        out.append(p.attrs[i][2])
        i += 1
    return out


def _attr_spans_in(p: _Prepared, lo: int, hi: int) -> list[tuple[int, int]]:
    i = bisect.bisect_left(p.attr_starts, lo)
    out = []
    while i < len(p.attrs) and p.attrs[i][0] < hi:
        out.append((p.attrs[i][0], p.attrs[i][1]))
        i += 1
    return out


def _keywords_in(p: _Prepared, lo: int, hi: int) -> list[str]:
    i = bisect.bisect_left(p.keyword_starts, lo)
    out = []
    while i < len(p.keywords) and p.keywords[i][0] < hi:
        out.append(p.keywords[i][1])
        i += 1
    return out


# ---------------------------------------------------------------- tree helpers


def _t(node, src: bytes) -> str:
    return src[node.start_byte : node.end_byte].decode("utf-8", "replace")


def _declarator_name(node, src: bytes) -> tuple[str | None, object]:
    """Follow declarator fields down to the declared name; returns (name, function_declarator or None)."""
    fd = None
    seen = 0
    while node is not None and seen < 32:
        seen += 1
        t = node.type
        if t in ("identifier", "field_identifier", "type_identifier", "operator_name", "destructor_name"):
            return _t(node, src), fd
        if t == "qualified_identifier":
            return _t(node, src), fd
        if t == "template_function":
            n = node.child_by_field_name("name")
            return (_t(n, src) if n is not None else _t(node, src)), fd
        if t == "function_declarator":
            fd = node
        nxt = node.child_by_field_name("declarator")
        if nxt is None:
            nxt = next((c for c in node.named_children if c.type not in ("type_qualifier", "attribute_specifier",
                                                                            "attribute_declaration")), None)
        node = nxt
    return None, fd


def _declared_names(node, src: bytes) -> list[str]:
    names = []
    for d in node.children_by_field_name("declarator"):
        n, _ = _declarator_name(d, src)
        if n:
            names.append(n)
    return names


def _type_names(type_node, src: bytes) -> list[str]:
    """Names introduced by a struct/enum/class specifier used as a type."""
    if type_node is None:
        return []
    out = []
    if type_node.type in ("struct_specifier", "class_specifier", "union_specifier", "enum_specifier"):
        n = type_node.child_by_field_name("name")
        if n is not None and type_node.child_by_field_name("body") is not None:
            out.append(_t(n, src))
        if type_node.type == "enum_specifier":
            body = type_node.child_by_field_name("body")
            for e in body.named_children if body is not None else []:
                if e.type == "enumerator":
                    en = e.child_by_field_name("name")
                    if en is not None:
                        out.append(_t(en, src))
    return out


# ---------------------------------------------------------------- the scan


def scan_metal(sources: list[tuple[str, bytes]]) -> MetalScan:
    """Scan Metal sources given in library order as (display name, bytes)."""
    from porter.target.cparse import error_nodes, parser

    raw = [s for _, s in sources]
    loops = loop_macros(raw)
    macros = object_macros(raw)
    cpp = parser("cpp")

    files: list[MetalFileReport] = []
    kernels: list[MetalKernel] = []
    insts: list[Instantiation] = []
    fconsts: list[FunctionConstant] = []
    symbols: list[MetalSymbol] = []
    raw_uses: list[set[bytes]] = []

    for fname, src in sources:
        p = prepare(fname, src, loops)
        tree = cpp.parse(p.parsed)
        errs = error_nodes(tree)
        lines = LineIndex(src)
        files.append(
            MetalFileReport(
                path=fname,
                lines=src.count(b"\n") + (0 if src.endswith(b"\n") or not src else 1),
                error_nodes=len(errs),
                errors=[(e.start_point[0] + 1, _t(e, src)[:60]) for e in errs[:10]],
            )
        )
        prev_end = 0
        for node in tree.root_node.named_children:
            if node.type == "comment":
                continue
            start = prev_end
            # the item owns the comment and attribute lines in front of it
            while start < node.start_byte and src[start : start + 1] in (b" ", b"\t", b"\n", b"\r"):
                start += 1
            end = node.end_byte
            m = re.match(rb"[ \t]*;", p.parsed[end:])
            if m and node.type in ("struct_specifier", "enum_specifier", "class_specifier", "union_specifier"):
                end += m.end()
            prev_end = end
            text = src[start:end].decode("utf-8", "replace")
            line = lines.line(node.start_byte)
            kind, names, undef = _classify(node, p, start, fname, line, text, macros, kernels, insts, fconsts)
            sym = MetalSymbol(order=len(symbols), kind=kind, names=tuple(names), file=fname, line=line, text=text,
                              undefines=undef)
            symbols.append(sym)
            raw_uses.append(set(IDENT.findall(p.nocomment[start:end])))

    defined: set[str] = set()
    for s in symbols:
        defined.update(s.names)
    defined_b = {n.encode() for n in defined}
    for s, toks in zip(symbols, raw_uses):
        own = set(s.names)
        s.uses = tuple(sorted(t.decode() for t in (toks & defined_b) if t.decode() not in own))

    host_names: dict[str, HostName] = {}
    dups: list[str] = []

    def add_host(h: HostName):
        if h.name in host_names and host_names[h.name] != h:
            dups.append(h.name)
        host_names.setdefault(h.name, h)

    for k in kernels:
        if not k.template:
            add_host(HostName(k.host_name or k.name, k.name, None, k.file, k.line))
    for inst in insts:
        if inst.host_name:
            add_host(HostName(inst.host_name, inst.template, inst.args, inst.file, inst.line))
    return MetalScan(
        files=files,
        kernels=kernels,
        instantiations=insts,
        host_names=host_names,
        function_constants=fconsts,
        symbols=symbols,
        macros=macros,
        duplicate_host_names=sorted(set(dups)),
    )


def _classify(node, p: _Prepared, start: int, fname: str, line: int, text: str, macros, kernels, insts, fconsts):
    """Returns (kind, names, undefines) and records kernels/instantiations/function constants."""
    src = p.original
    t = node.type
    if t in ("preproc_def", "preproc_function_def"):
        n = node.child_by_field_name("name")
        return "macro", [_t(n, src)] if n is not None else [], None
    if t == "preproc_call":
        d = node.child_by_field_name("directive")
        a = node.child_by_field_name("argument")
        if d is not None and _t(d, src).replace(" ", "") == "#undef" and a is not None:
            return "undef", [], _t(a, src).strip()
        return "global", [], None
    if t in ("preproc_include", "using_declaration", "namespace_alias_definition"):
        return "global", [], None
    if t in ("preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif", "namespace_definition", "linkage_specification"):
        names: list[str] = []
        for c in node.named_children:
            if c.type in ("identifier", "preproc_defined", "comment") or c.type.startswith("preproc_else"):
                continue
            _, ns, _ = _classify(c, p, c.start_byte, fname, line, text, macros, kernels, insts, fconsts)
            names.extend(ns)
        return "block", names, None
    if t == "template_instantiation":
        return _instantiation(node, p, start, fname, line, text, insts)
    if t == "template_declaration":
        inner = [c for c in node.named_children if c.type != "template_parameter_list"]
        params = node.child_by_field_name("parameters") or next(
            (c for c in node.named_children if c.type == "template_parameter_list"), None)
        if inner:
            body = inner[-1]
            if body.type == "function_definition":
                kind, names = _function(body, p, start, fname, line, kernels, template_params=params)
                return ("template_kernel" if kind == "kernel" else "function"), names, None
            kind, names, _ = _classify(body, p, start, fname, line, text, macros, kernels, insts, fconsts)
            return kind if kind != "declaration" else "template", names, None
        return "template", [], None
    if t == "function_definition":
        kind, names = _function(node, p, start, fname, line, kernels, template_params=None)
        return kind, names, None
    if t in ("struct_specifier", "class_specifier", "union_specifier"):
        return "struct", _type_names(node, src), None
    if t == "enum_specifier":
        return "enum", _type_names(node, src), None
    if t == "type_definition":
        names = _declared_names(node, src) + _type_names(node.child_by_field_name("type"), src)
        return "typedef", names, None
    if t == "alias_declaration":
        n = node.child_by_field_name("name")
        return "typedef", [_t(n, src)] if n is not None else [], None
    if t == "declaration":
        names = _declared_names(node, src) + _type_names(node.child_by_field_name("type"), src)
        attrs = _attrs_in(p, start, node.end_byte)
        fc = [a for a in attrs if _FUNCTION_CONSTANT.match(a)]
        if fc and names:
            expr = _FUNCTION_CONSTANT.match(fc[0]).group(1).strip()
            ty = node.child_by_field_name("type")
            quals = [_t(c, src) for c in node.children if c.type == "type_qualifier"]
            fconsts.append(FunctionConstant(name=names[0], type=norm_ws(" ".join(quals + [_t(ty, src) if ty else ""])),
                                            index_expr=expr, index=eval_int(expr, macros), file=fname, line=line))
            return "function_constant", names, None
        return "variable", names, None
    return "other", [], None


def _function(node, p: _Prepared, start: int, fname: str, line: int, kernels: list, template_params):
    src = p.original
    name, fd = _declarator_name(node.child_by_field_name("declarator"), src)
    if not name:
        return "function", []
    name_node_start = fd.start_byte if fd is not None else node.start_byte
    specs = [k for k in _keywords_in(p, start, name_node_start) if k in FUNCTION_SPECIFIERS]
    if not specs:
        return "function", [name]
    attrs = tuple(_attrs_in(p, start, name_node_start))
    host = None
    for a in attrs:
        m = _HOST_NAME.match(a)
        if m:
            host = m.group(1)
    params = _params(fd, p) if fd is not None else ()
    kernels.append(
        MetalKernel(
            name=name,
            file=fname,
            line=line,
            params=params,
            attributes=attrs,
            host_name=host,
            template=template_params is not None,
            template_params=norm_ws(_t(template_params, src)) if template_params is not None else None,
            specifier=specs[0],
        )
    )
    return "kernel", [name]


def _params(fd, p: _Prepared) -> tuple[MetalParam, ...]:
    src = p.original
    plist = fd.child_by_field_name("parameters")
    if plist is None:
        return ()
    seps = [plist.start_byte + 1]
    for c in plist.children:
        if c.type == ",":
            seps.append(c.start_byte)
    seps.append(plist.end_byte - 1)
    named = [c for c in plist.named_children if c.type.endswith("parameter_declaration") or c.type == "variadic_parameter"]
    out: list[MetalParam] = []
    used_buffers: set[int] = set()
    pending: list[int] = []
    for i, par in enumerate(named):
        # the separators around this parameter
        j = bisect.bisect_right(seps, par.start_byte) - 1
        lo, hi = seps[max(j, 0)], seps[min(j + 1, len(seps) - 1)]
        attrs = tuple(_attrs_in(p, lo, hi))
        spaces = [k for k in _keywords_in(p, lo, hi) if k in ADDRESS_SPACES]
        pname, _ = _declarator_name(par.child_by_field_name("declarator"), src)
        pieces = []
        cursor = lo + (1 if src[lo : lo + 1] in (b",", b"(") else 0)
        for a0, a1 in _attr_spans_in(p, lo, hi):
            pieces.append(p.nocomment[cursor:a0])
            cursor = a1
        pieces.append(p.nocomment[cursor:hi])
        decl = norm_ws(b"".join(pieces).decode("utf-8", "replace"))
        ty = decl
        if pname and decl.endswith(pname):
            ty = decl[: -len(pname)].strip()
        buffer = None
        for a in attrs:
            m = _BUFFER.match(a)
            if m:
                buffer = eval_int(m.group(1))
        if buffer is not None:
            used_buffers.add(buffer)
        elif not attrs and spaces and spaces[0] in ("device", "constant"):
            pending.append(len(out))
        out.append(MetalParam(name=pname or "", decl=decl, type=ty, address_space=spaces[0] if spaces else None,
                              attributes=attrs, buffer=buffer))
    nxt = 0
    for idx in pending:
        while nxt in used_buffers:
            nxt += 1
        prm = out[idx]
        out[idx] = MetalParam(prm.name, prm.decl, prm.type, prm.address_space, prm.attributes, nxt, True)
        used_buffers.add(nxt)
    return tuple(out)


def _instantiation(node, p: _Prepared, start: int, fname: str, line: int, text: str, insts: list):
    src = p.original
    attrs = _attrs_in(p, start, node.end_byte)
    host = None
    for a in attrs:
        m = _HOST_NAME.match(a)
        if m:
            host = m.group(1)
    decl = node.child_by_field_name("declarator")
    if decl is not None and decl.type == "function_declarator":
        decl = decl.child_by_field_name("declarator")
    template, args = None, ()
    if decl is not None and decl.type == "template_function":
        n = decl.child_by_field_name("name")
        template = _t(n, src) if n is not None else None
        al = decl.child_by_field_name("arguments")
        if al is not None:
            args = tuple(norm_ws(p.nocomment[a.start_byte : a.end_byte].decode("utf-8", "replace"))
                         for a in al.named_children)
    elif decl is not None:
        template = _t(decl, src)
    ty = node.child_by_field_name("type")
    insts.append(Instantiation(host_name=host, template=template or "", args=args,
                               type_name=_t(ty, src) if ty is not None else None, file=fname, line=line,
                               text=norm_ws(_t(node, src))))
    names = [f"host:{host}"] if host else []
    return "instantiation", names, None
