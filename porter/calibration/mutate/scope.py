"""Where a unit's source may be mutated: the bodies of the functions it defines, never anything else.

The source is parsed with tree-sitter (porter.target.cparse).  Its includes are not expanded, so the
conventions header and every other shared header are out of reach by construction; file-scope
declarations (types, tables, macros) are left alone too.  Each body comes with what the operators
need to know about its function: its name, where it runs (kernel, device or host) and whether it
returns a value.
"""

from __future__ import annotations

from dataclasses import dataclass

import tree_sitter as ts

from porter.target.cparse import parse_cuda

# nodes whose subtree is code of a different function (a lambda's body has its own return type)
NESTED_FUNCTIONS = ("lambda_expression",)


@dataclass(frozen=True)
class Body:
    function: str  # the function's name
    where: str  # "kernel" (__global__), "device" (__device__ only) or "host"
    returns_value: bool  # False for void functions: an early return is `return;`
    node: ts.Node  # the compound_statement


def text(node: ts.Node) -> str:
    return node.text.decode("utf-8", "replace")


def _declarator_name(decl: ts.Node | None) -> tuple[str, bool]:
    """(name, is the declared thing a pointer or reference) of a function definition's declarator."""
    pointer = False
    while decl is not None and decl.type in ("pointer_declarator", "reference_declarator"):
        pointer = True
        decl = decl.child_by_field_name("declarator") or next(iter(decl.named_children), None)
    if decl is not None and decl.type == "function_declarator":
        name = decl.child_by_field_name("declarator")
        return (text(name) if name is not None else "?"), pointer
    return (text(decl) if decl is not None else "?"), pointer


def _where(fn: ts.Node) -> str:
    kinds = {c.type for c in fn.children}
    words = {text(c) for c in fn.children if c.type in ("attribute_specifier", "storage_class_specifier")}
    kinds |= words
    if "__global__" in kinds:
        return "kernel"
    if "__device__" in kinds and "__host__" not in kinds:
        return "device"
    return "host"


def bodies(tree: ts.Tree) -> list[Body]:
    """Every function definition's body, in source order (functions nested in namespaces, extern "C"
    blocks and templates too; a lambda is part of the body it is written in)."""
    out: list[Body] = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            body = node.child_by_field_name("body")
            if body is not None and body.type == "compound_statement":
                name, pointer = _declarator_name(node.child_by_field_name("declarator"))
                type_node = node.child_by_field_name("type")
                void = type_node is not None and text(type_node) == "void" and not pointer
                out.append(Body(name, _where(node), not void, body))
            continue
        stack.extend(reversed(node.children))
    return sorted(out, key=lambda b: b.node.start_byte)


def parse_bodies(source: str) -> tuple[bytes, ts.Tree, list[Body]]:
    data = source.encode()
    tree = parse_cuda(data)
    return data, tree, bodies(tree)


def walk(node: ts.Node):
    """Every node under `node`, in source order, `node` included."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def inside_nested_function(node: ts.Node, body: ts.Node) -> bool:
    """Whether `node` lies in a lambda written inside `body` (its returns are the lambda's)."""
    n = node.parent
    while n is not None and n.id != body.id:
        if n.type in NESTED_FUNCTIONS:
            return True
        n = n.parent
    return False


def in_preprocessor(node: ts.Node, body: ts.Node) -> bool:
    """Whether `node` is part of a preprocessor line inside the body (a #define, an #if's condition)."""
    n = node
    while n is not None and n.id != body.id:
        if n.type.startswith("preproc_") and n.type not in ("preproc_if", "preproc_ifdef", "preproc_else",
                                                             "preproc_elif", "preproc_elifdef"):
            return True
        if n.parent is not None and n.parent.type in ("preproc_if", "preproc_elif") \
                and n.parent.child_by_field_name("condition") is not None \
                and n.parent.child_by_field_name("condition").id == n.id:
            return True
        n = n.parent
    return False
