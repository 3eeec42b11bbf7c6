"""Parsing C, C++/CUDA and Objective-C with tree-sitter.

porter never finds a signature or a function body with a regex: the static
gate, the scanner and the prompt all read sources through this module, so the
exact signature a candidate must define is the one the compiler would see.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import tree_sitter as ts

from porter.errors import PorterError


@lru_cache(maxsize=None)
def language(name: str) -> ts.Language:
    """tree-sitter Language for 'c', 'cpp', 'cuda' or 'objc'."""
    if name == "c":
        import tree_sitter_c as mod
    elif name == "cpp":
        import tree_sitter_cpp as mod
    elif name == "cuda":
        import tree_sitter_cuda as mod
    elif name == "objc":
        import tree_sitter_objc as mod
    else:
        raise PorterError(f"no tree-sitter grammar for language {name!r}")
    return ts.Language(mod.language())


def parser(name: str) -> ts.Parser:
    return ts.Parser(language(name))


# `extern "C" {` opened in one #ifdef __cplusplus and closed in another is
# unbalanced for any single-pass parser; blanking those regions (keeping every
# byte offset and newline) lets the header parse as plain C.
_CPLUSPLUS_BLOCK = re.compile(
    rb"^[ \t]*#[ \t]*(?:ifdef[ \t]+__cplusplus|if[ \t]+defined\(?[ \t]*__cplusplus[ \t]*\)?)\b.*?^[ \t]*#[ \t]*endif[^\n]*",
    re.M | re.S,
)


def blank_cplusplus_guards(src: bytes) -> bytes:
    return _CPLUSPLUS_BLOCK.sub(lambda m: re.sub(rb"[^\n]", b" ", m.group(0)), src)


@dataclass(frozen=True)
class Param:
    type: str  # normalised type text without the name, e.g. "const mini_gpu_tensor *"
    name: str

    @property
    def canonical(self) -> str:
        return canonical_type(self.type)


@dataclass(frozen=True)
class ApiFunction:
    """One function declared by a backend API header."""

    name: str
    return_type: str
    params: tuple[Param, ...]
    declaration: str  # the declaration as written in the header
    doc: str = ""  # the comment block directly above, if any
    line: int = 0

    @property
    def signature_key(self) -> tuple[str, tuple[str, ...]]:
        """What two declarations must share to be the same C function."""
        return canonical_type(self.return_type), tuple(p.canonical for p in self.params)

    def c_signature(self) -> str:
        params = ", ".join(f"{p.type} {p.name}".replace("* ", "*") for p in self.params) or "void"
        return f"{self.return_type} {self.name}({params})"


def canonical_type(text: str) -> str:
    """Whitespace- and layout-insensitive spelling of a C type ('const  T*' == 'const T *')."""
    text = re.sub(r"\s*\*\s*", " * ", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text.replace("* *", "**")


def _text(node: ts.Node) -> str:
    return node.text.decode("utf-8", "replace")


def _declarator_chain(node: ts.Node) -> tuple[ts.Node | None, str]:
    """Walk pointer declarators down to the function_declarator; return it and the '*'s seen."""
    stars = ""
    while node is not None and node.type in ("pointer_declarator", "reference_declarator"):
        stars += "*" if node.type == "pointer_declarator" else "&"
        node = node.child_by_field_name("declarator")
    if node is not None and node.type == "function_declarator":
        return node, stars
    return None, stars


def _param_from_node(node: ts.Node) -> Param | None:
    if node.type == "variadic_parameter":
        return Param("...", "")
    if node.type not in ("parameter_declaration", "optional_parameter_declaration"):
        return None
    type_node = node.child_by_field_name("type")
    quals = [_text(c) for c in node.children if c.type == "type_qualifier"]
    base = " ".join(quals + [_text(type_node)]) if type_node is not None else ""
    decl = node.child_by_field_name("declarator")
    stars, name = "", ""
    while decl is not None:
        if decl.type == "pointer_declarator":
            stars += "*"
            # `T *const p`: qualifiers on the pointer itself
            for c in decl.children:
                if c.type == "type_qualifier":
                    stars += f" {_text(c)} "
            decl = decl.child_by_field_name("declarator")
        elif decl.type == "reference_declarator":
            stars += "&"
            decl = next((c for c in decl.named_children), None)
        elif decl.type == "array_declarator":
            stars += "*"  # an array parameter decays to a pointer
            decl = decl.child_by_field_name("declarator")
        elif decl.type == "identifier":
            name = _text(decl)
            break
        else:
            name = _text(decl)
            break
    if base == "void" and not stars and not name:
        return None  # f(void)
    return Param(canonical_type(f"{base} {stars}"), name)


def _params(func_decl: ts.Node) -> tuple[Param, ...]:
    plist = func_decl.child_by_field_name("parameters")
    out = []
    for child in plist.named_children if plist is not None else []:
        p = _param_from_node(child)
        if p is not None:
            out.append(p)
    return tuple(out)


def _return_type(decl_node: ts.Node, stars: str) -> str:
    type_node = decl_node.child_by_field_name("type")
    quals = [
        _text(c)
        for c in decl_node.children
        if c.type in ("type_qualifier",) and c.end_byte <= (type_node.start_byte if type_node else 0)
    ]
    return canonical_type(" ".join(quals + [_text(type_node) if type_node else "int", stars]))


def _doc_above(node: ts.Node) -> str:
    prev = node.prev_sibling
    if prev is not None and prev.type == "comment" and node.start_point[0] - prev.end_point[0] <= 1:
        return _text(prev)
    return ""


def _function_declarations(root: ts.Node):
    """Yield (declaration node, function_declarator, stars) for top-level-ish prototypes."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "declaration":
            fd, stars = _declarator_chain(node.child_by_field_name("declarator"))
            if fd is not None:
                yield node, fd, stars
            continue
        if node.type in ("function_definition",):
            continue
        stack.extend(reversed(node.named_children))


def parse_api_header(path: Path, prefix: str) -> list[ApiFunction]:
    """Every function declared in the API header whose name starts with `prefix`, in header order."""
    try:
        src = Path(path).read_bytes()
    except OSError as exc:
        raise PorterError(f"cannot read API header {path}: {exc.strerror}") from exc
    tree = parser("c").parse(blank_cplusplus_guards(src))
    funcs: list[ApiFunction] = []
    for decl, fd, stars in _function_declarations(tree.root_node):
        name_node = fd.child_by_field_name("declarator")
        if name_node is None or name_node.type != "identifier":
            continue
        name = _text(name_node)
        if not name.startswith(prefix):
            continue
        funcs.append(
            ApiFunction(
                name=name,
                return_type=_return_type(decl, stars),
                params=_params(fd),
                declaration=" ".join(_text(decl).split()),
                doc=_doc_above(decl),
                line=decl.start_point[0] + 1,
            )
        )
    if not funcs:
        raise PorterError(f"API header {path} declares no function starting with {prefix!r}")
    return funcs


@dataclass(frozen=True)
class FunctionDefinition:
    """A function defined in a candidate translation unit."""

    name: str
    return_type: str
    params: tuple[Param, ...]
    extern_c: bool
    body: str  # the compound statement, braces included
    body_node_statements: int
    start_line: int
    end_line: int
    qualifiers: tuple[str, ...] = field(default_factory=tuple)  # __global__, static, ...

    @property
    def signature_key(self) -> tuple[str, tuple[str, ...]]:
        return canonical_type(self.return_type), tuple(p.canonical for p in self.params)


def parse_cuda(src: str | bytes) -> ts.Tree:
    data = src.encode() if isinstance(src, str) else src
    return parser("cuda").parse(data)


def function_definitions(src: str | bytes) -> list[FunctionDefinition]:
    """All function definitions in a CUDA/C++ source, with whether each has C linkage."""
    tree = parse_cuda(src)
    out: list[FunctionDefinition] = []
    stack: list[tuple[ts.Node, bool]] = [(tree.root_node, False)]
    while stack:
        node, in_extern_c = stack.pop()
        if node.type == "linkage_specification":
            is_c = any(c.type == "string_literal" and '"C"' in _text(c) for c in node.children)
            for c in reversed(node.named_children):
                stack.append((c, in_extern_c or is_c))
            continue
        if node.type == "function_definition":
            fd, stars = _declarator_chain(node.child_by_field_name("declarator"))
            name_node = fd.child_by_field_name("declarator") if fd is not None else None
            body = node.child_by_field_name("body")
            if name_node is not None and body is not None:
                quals = tuple(
                    _text(c)
                    for c in node.children
                    if c.type in ("storage_class_specifier", "attribute_specifier", "ms_declspec_modifier")
                    or _text(c) in ("__global__", "__device__", "__host__", "__forceinline__")
                )
                out.append(
                    FunctionDefinition(
                        name=_text(name_node),
                        return_type=_return_type(node, stars),
                        params=_params(fd),
                        extern_c=in_extern_c,
                        body=_text(body),
                        body_node_statements=len(body.named_children),
                        start_line=node.start_point[0] + 1,
                        end_line=node.end_point[0] + 1,
                        qualifiers=quals,
                    )
                )
            continue
        for c in reversed(node.named_children):
            stack.append((c, in_extern_c))
    return out


def calls_to(src: str | bytes, names: set[str]) -> set[str]:
    """Which of `names` the source calls (call expressions only: comments, strings and
    declarations do not count)."""
    found: set[str] = set()
    stack = [parse_cuda(src).root_node]
    while stack:
        node = stack.pop()
        if node.type == "call_expression":
            fn = node.child_by_field_name("function")
            if fn is not None and fn.type == "identifier" and _text(fn) in names:
                found.add(_text(fn))
        stack.extend(node.named_children)
    return found


def error_nodes(tree: ts.Tree) -> list[ts.Node]:
    """ERROR and MISSING nodes: what the grammar could not make sense of."""
    found = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            found.append(node)
            continue
        if node.has_error:
            stack.extend(node.children)
    return found
