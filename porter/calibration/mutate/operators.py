"""The mutation operators: each finds, at one node of a function body, the small edits a wrong kernel
is made of.  An operator never looks outside the body it is given (porter.calibration.mutate.scope).

    arith          + <-> -, * <-> /, % -> *, and their compound assignments; ++ <-> --
    bitwise        << <-> >>, & <-> |, ^ -> &, and their compound assignments
    compare        < <-> <=, > <-> >=, == <-> !=
    logic          && <-> ||
    loop_bound     a for loop's bound or start one off: `i < n` -> `i < (n) + 1` / `(n) - 1`, `i = a` -> `(a) + 1`
    index          a subscript one off: `x[i]` -> `x[(i) + 1]` / `x[(i) - 1]`
    constant       a number perturbed: integers +1 / -1, floats x2 / x0.5 (0 -> 1)
    drop_store     a store to memory removed (`a[i] = v;`, `*p += v;`, `s->f = v;`, atomics, memcpy/memset)
    drop_sync      a barrier or fence removed (`__syncthreads();`, `__syncwarp();`, `__threadfence();`, stream syncs)
    drop_guard     a bounds check removed: `if (...) return ...;` (or continue / break) with no else
    swap_args      two neighbouring arguments of a call, or of a kernel launch's <<<...>>>, swapped
    early_return   `return;` (or `return {};` in a function with a value) inserted before a statement
    narrow         a float value rounded through half: `__half2float(__float2half(v))` (the conventions
                   header must reach cuda_fp16.h, as both bundled targets' do; elsewhere they do not build)

Each edit replaces one byte range of the source; `note` says what it did in a few words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import tree_sitter as ts

from porter.calibration.mutate.scope import Body, in_preprocessor, inside_nested_function, text, walk


@dataclass(frozen=True)
class Edit:
    start: int  # byte offsets into the source; start == end inserts
    end: int
    replacement: str
    note: str
    at: tuple[int, int]  # (line, column), 1-based, of the code the edit is about


@dataclass
class Context:
    data: bytes
    body: Body
    float_names: set[str] = field(default_factory=set)  # the function's float scalars (parameters and locals)


def _at(node: ts.Node) -> tuple[int, int]:
    return node.start_point[0] + 1, node.start_point[1] + 1


def _swap_token(node: ts.Node, table: dict[str, str]) -> list[Edit]:
    op = node.child_by_field_name("operator")
    if op is None:
        return []
    have = text(op)
    if have not in table:
        return []
    want = table[have]
    return [Edit(op.start_byte, op.end_byte, want, f"`{have}` -> `{want}`", _at(op))]


ARITH = {"+": "-", "-": "+", "*": "/", "/": "*", "%": "*"}
ARITH_ASSIGN = {"+=": "-=", "-=": "+=", "*=": "/=", "/=": "*=", "%=": "*="}
BITWISE = {"<<": ">>", ">>": "<<", "&": "|", "|": "&", "^": "&"}
BITWISE_ASSIGN = {"<<=": ">>=", ">>=": "<<=", "&=": "|=", "|=": "&=", "^=": "&="}
COMPARE = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}
LOGIC = {"&&": "||", "||": "&&"}


def arith(node: ts.Node, ctx: Context) -> list[Edit]:
    if node.type == "binary_expression":
        return _swap_token(node, ARITH)
    if node.type == "assignment_expression":
        return _swap_token(node, ARITH_ASSIGN)
    if node.type == "update_expression":
        op = node.child_by_field_name("operator")
        if op is not None and text(op) in ("++", "--"):
            want = "--" if text(op) == "++" else "++"
            return [Edit(op.start_byte, op.end_byte, want, f"`{text(op)}` -> `{want}`", _at(op))]
    return []


def bitwise(node: ts.Node, ctx: Context) -> list[Edit]:
    if node.type == "binary_expression":
        return _swap_token(node, BITWISE)
    if node.type == "assignment_expression":
        return _swap_token(node, BITWISE_ASSIGN)
    return []


def compare(node: ts.Node, ctx: Context) -> list[Edit]:
    return _swap_token(node, COMPARE) if node.type == "binary_expression" else []


def logic(node: ts.Node, ctx: Context) -> list[Edit]:
    return _swap_token(node, LOGIC) if node.type == "binary_expression" else []


def _one_off(expr: ts.Node, what: str) -> list[Edit]:
    t = text(expr)
    return [Edit(expr.start_byte, expr.end_byte, f"({t}) {sign} 1", f"{what} `{t}` {sign} 1", _at(expr))
            for sign in ("+", "-")]


def loop_bound(node: ts.Node, ctx: Context) -> list[Edit]:
    if node.type != "for_statement":
        return []
    out = []
    cond = node.child_by_field_name("condition")
    if cond is not None and cond.type == "binary_expression" and \
            text(cond.child_by_field_name("operator")) in ("<", "<=", ">", ">=", "!="):
        out += _one_off(cond.child_by_field_name("right"), "loop bound")
    init = node.child_by_field_name("initializer")
    if init is not None:
        values = [d.child_by_field_name("value") for d in init.named_children if d.type == "init_declarator"] \
            if init.type == "declaration" else \
            [init.child_by_field_name("right")] if init.type == "assignment_expression" else []
        for v in values:
            if v is not None:
                t = text(v)
                out.append(Edit(v.start_byte, v.end_byte, f"({t}) + 1", f"loop start `{t}` + 1", _at(v)))
    return out


def index(node: ts.Node, ctx: Context) -> list[Edit]:
    if node.type != "subscript_expression":
        return []
    args = node.child_by_field_name("indices")
    if args is None:
        args = next((c for c in node.children if c.type == "subscript_argument_list"), None)
    idx = [c for c in args.named_children if c.type != "comment"] if args is not None else \
        [node.child_by_field_name("index")] if node.child_by_field_name("index") is not None else []
    return _one_off(idx[0], "index") if len(idx) == 1 else []


_INT = re.compile(r"^(-?)(0[xX][0-9a-fA-F]+|[0-9]+)([uUlL]*)$")
_FLOAT = re.compile(r"^(-?)((?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?)([fFlL]?)$")


def _format_int(value: int, like: str) -> str:
    return hex(value) if like.lower().startswith("0x") else str(value)


def _format_float(value: float) -> str:
    s = repr(value)
    return s if any(c in s for c in ".eEn") else s + ".0"


def perturbed(literal: str) -> list[str]:
    """The perturbed spellings of one number literal (its sign and suffix kept); [] for one we do not read."""
    m = _INT.match(literal)
    if m:
        sign, digits, suffix = m.groups()
        value = int(digits, 0) * (-1 if sign else 1)
        unsigned = "u" in suffix.lower()
        out = [value + 1] + ([value - 1] if value - 1 >= 0 or not unsigned else [])
        return [("-" + _format_int(-v, digits) if v < 0 else _format_int(v, digits)) + suffix for v in out]
    m = _FLOAT.match(literal)
    if m and (any(c in m.group(2) for c in ".eE") or m.group(3).lower() == "f"):
        sign, digits, suffix = m.groups()
        value = float(digits)
        if value == 0.0:
            return [f"{sign}1.0{suffix}"]
        return [f"{sign}{_format_float(value * k)}{suffix}" for k in (2.0, 0.5)]
    return []


def constant(node: ts.Node, ctx: Context) -> list[Edit]:
    if node.type != "number_literal":
        return []
    lit = text(node)
    return [Edit(node.start_byte, node.end_byte, new, f"constant `{lit}` -> `{new}`", _at(node))
            for new in perturbed(lit) if new != lit]


_STORE_CALL = re.compile(r"^(atomic\w+|cudaMemcpy\w*|cudaMemset\w*|memcpy|memset|memmove)$")
_SYNC_CALL = re.compile(r"^(__syncthreads\w*|__syncwarp|__threadfence\w*|cudaStreamSynchronize|"
                        r"cudaDeviceSynchronize|cudaEventSynchronize|__barrier_sync)$")
_SYNC_METHOD = re.compile(r"\.sync$")  # cooperative groups: block.sync(), grid.sync()


def _called(stmt: ts.Node) -> str | None:
    expr = stmt.named_children[0] if stmt.named_children else None
    if expr is None or expr.type != "call_expression":
        return None
    fn = expr.child_by_field_name("function")
    return text(fn) if fn is not None else None


def _drop(stmt: ts.Node, note: str) -> Edit:
    return Edit(stmt.start_byte, stmt.end_byte, ";", note, _at(stmt))


def drop_store(node: ts.Node, ctx: Context) -> list[Edit]:
    if node.type != "expression_statement" or not node.named_children:
        return []
    expr = node.named_children[0]
    if expr.type == "assignment_expression":
        left = expr.child_by_field_name("left")
        if left is not None and (left.type in ("subscript_expression", "field_expression") or
                                 left.type == "pointer_expression" and text(left).startswith("*")):
            return [_drop(node, f"store `{text(node)[:60]}` dropped")]
        return []
    called = _called(node)
    if called and _STORE_CALL.match(called):
        return [_drop(node, f"store `{called}(...)` dropped")]
    return []


def drop_sync(node: ts.Node, ctx: Context) -> list[Edit]:
    if node.type != "expression_statement":
        return []
    called = _called(node)
    if called and (_SYNC_CALL.match(called) or _SYNC_METHOD.search(called)):
        return [_drop(node, f"`{called}()` dropped")]
    return []


def _is_exit(stmt: ts.Node | None) -> bool:
    if stmt is None:
        return False
    if stmt.type in ("return_statement", "continue_statement", "break_statement"):
        return True
    if stmt.type == "compound_statement":
        inner = [c for c in stmt.named_children if c.type != "comment"]
        return len(inner) == 1 and inner[0].type in ("return_statement", "continue_statement", "break_statement")
    return False


def drop_guard(node: ts.Node, ctx: Context) -> list[Edit]:
    if node.type != "if_statement" or node.child_by_field_name("alternative") is not None:
        return []
    if not _is_exit(node.child_by_field_name("consequence")):
        return []
    cond = node.child_by_field_name("condition")
    return [_drop(node, f"guard `if {text(cond)[:60]}` dropped")]


def swap_args(node: ts.Node, ctx: Context) -> list[Edit]:
    if node.type == "argument_list" and node.parent is not None and node.parent.type == "call_expression":
        what = "arguments"
    elif node.type == "kernel_call_syntax":
        what = "launch settings"
    else:
        return []
    args = [c for c in node.named_children if c.type != "comment"]
    out = []
    for a, b in zip(args, args[1:]):
        ta, tb = text(a), text(b)
        if ta != tb:
            out.append(Edit(a.start_byte, b.end_byte,
                            tb + ctx.data[a.end_byte:b.start_byte].decode("utf-8", "replace") + ta,
                            f"{what} `{ta[:30]}` and `{tb[:30]}` swapped", _at(a)))
    return out


def early_return(node: ts.Node, ctx: Context) -> list[Edit]:
    if node.type != "compound_statement" or inside_nested_function(node, ctx.body.node):
        return []
    ret = "return {};" if ctx.body.returns_value else "return;"
    stmts = [c for c in node.named_children if c.type not in ("comment",) and not c.type.startswith("preproc_")]
    return [Edit(s.start_byte, s.start_byte, ret + " ", f"`{ret}` inserted", _at(s)) for s in stmts]


def _is_float_type(decl: ts.Node) -> bool:
    t = decl.child_by_field_name("type")
    return t is not None and t.type == "primitive_type" and text(t) == "float"


def float_names(body: Body, params: ts.Node | None) -> set[str]:
    """The float scalars of a function: its `float x` parameters and locals (not pointers or arrays)."""
    names = set()
    decls = [n for n in walk(body.node) if n.type == "declaration"]
    decls += [n for n in (params.named_children if params is not None else []) if n.type == "parameter_declaration"]
    for d in decls:
        if not _is_float_type(d):
            continue
        for c in d.named_children:
            target = c.child_by_field_name("declarator") if c.type == "init_declarator" else c
            if target is not None and target.type == "identifier":
                names.add(text(target))
    return names


_INFINITIES = {"INFINITY", "HUGE_VALF", "HUGE_VAL"}


def _exact_in_half(expr: ts.Node) -> bool:
    """A literal half holds exactly (`0.0f`, `-1.0f`, `0.5f`, `INFINITY`): rounding it through half is the
    same program, a survivor by construction (measured: `float dot = 0.0f` narrowed survived every case)."""
    t = text(expr).replace(" ", "")
    t = t[1:] if t[:1] in "+-" else t
    t = t[1:-1] if t[:1] == "(" and t[-1:] == ")" else t
    if t in _INFINITIES:
        return True
    try:
        v = float(re.sub(r"[fFlLuU]+$", "", t)) if not t.lower().startswith("0x") else float(int(t.rstrip("uUlL"), 16))
    except ValueError:
        return False
    with np.errstate(over="ignore"):
        return float(np.float16(v)) == v  # as Python floats: numpy would compare in half and call 0.1 exact


def _narrowed(expr: ts.Node, what: str) -> Edit:
    t = text(expr)
    return Edit(expr.start_byte, expr.end_byte, f"__half2float(__float2half({t}))",
                f"{what} `{t[:40]}` narrowed to half", _at(expr))


def narrow(node: ts.Node, ctx: Context) -> list[Edit]:
    if node.type == "declaration" and _is_float_type(node):
        out = []
        for c in node.named_children:
            if c.type == "init_declarator":
                target, value = c.child_by_field_name("declarator"), c.child_by_field_name("value")
                if target is not None and target.type == "identifier" and value is not None \
                        and value.type != "initializer_list" and not _exact_in_half(value):
                    out.append(_narrowed(value, f"float `{text(target)}` ="))
        return out
    if node.type == "assignment_expression":
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is not None and left.type == "identifier" and text(left) in ctx.float_names and right is not None \
                and not _exact_in_half(right):
            return [_narrowed(right, f"`{text(left)} {text(node.child_by_field_name('operator'))}`")]
        return []
    if node.type == "cast_expression":
        t = node.child_by_field_name("type")
        value = node.child_by_field_name("value")
        if t is not None and text(t) == "float" and value is not None and not _exact_in_half(value):
            return [_narrowed(value, "(float)")]
    return []


@dataclass(frozen=True)
class Operator:
    name: str
    what: str
    edits: object  # (node, Context) -> list[Edit]


OPERATORS: tuple[Operator, ...] = (
    Operator("arith", "arithmetic operator swapped", arith),
    Operator("bitwise", "shift or bitwise operator swapped", bitwise),
    Operator("compare", "comparison operator swapped", compare),
    Operator("logic", "&& and || swapped", logic),
    Operator("loop_bound", "a loop's bound or start one off", loop_bound),
    Operator("index", "a subscript one off", index),
    Operator("constant", "a number perturbed", constant),
    Operator("drop_store", "a store to memory dropped", drop_store),
    Operator("drop_sync", "a barrier or fence dropped", drop_sync),
    Operator("drop_guard", "a bounds check `if (...) return;` dropped", drop_guard),
    Operator("swap_args", "two call arguments swapped", swap_args),
    Operator("early_return", "an early return inserted", early_return),
    Operator("narrow", "a float narrowed to half", narrow),
)
BY_NAME = {o.name: o for o in OPERATORS}


def edits_in(body: Body, data: bytes, ops: tuple[Operator, ...] = OPERATORS) -> list[tuple[Operator, Edit]]:
    """Every edit each operator proposes in one function body, in source order."""
    fn = body.node.parent
    declarator = fn.child_by_field_name("declarator") if fn is not None else None
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    params = declarator.child_by_field_name("parameters") if declarator is not None else None
    ctx = Context(data, body, float_names(body, params))
    out = []
    for node in walk(body.node):
        if in_preprocessor(node, body.node):
            continue
        for op in ops:
            out += [(op, e) for e in op.edits(node, ctx)]
    return out
