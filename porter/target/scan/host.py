"""The host dispatch map: which Metal kernels each API function of the host file encodes.

The host file (ds4_metal.m, mini_metal.m) is parsed with the Objective-C
grammar.  Every `[enc setComputePipelineState:P]` is a dispatch site; the value
of P is worked out by a small abstract interpreter over the syntax tree whose
values are sets of strings/integers plus the reasons it could not do better:

- string literals ("x", @"x"), conditionals (both arms), casts, parentheses;
- locals: the assignments that reach the use in source order (the nearest one
  that dominates it, and every conditional one in between);
- parameters: the caller's argument, context-sensitively along the call path
  from the API function (API -> static helper -> ... -> dispatch site);
- calls to functions of the host file: the values of their `return`s, with
  branches on statically known arguments pruned (if/switch/?:);
- globals: their initialiser plus every assignment anywhere in the file
  (pipelines cached in globals at init time are followed to where they are
  created with a name);
- tables (static const char *names[] = {...}) subscripted: every entry, or the
  one a constant index picks;
- struct fields: designated initialisers of compound literals (`.function_name = ...`)
  and field assignments;
- snprintf/sprintf into a buffer and [NSString stringWithFormat:]: every
  combination of the argument values; an argument without a static value makes
  the name UNRESOLVED with its pattern (e.g. "kernel_mul_mv_%s_f32");
- Metal API messages: newFunctionWithName:, newComputePipelineStateWithFunction:,
  stringWithUTF8String: pass their argument's value through; a cache lookup
  (objectForKey:, or subscripting a global container that is not a constant
  table) adds nothing: the same function fills the cache from its creation path.
Anything else is UNRESOLVED with the reason, never dropped.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from porter.target.scan.common import LineIndex, blank_attribute_macros, decode_c_string, eval_int, mask_comments, norm_ws

_FORMAT_SPEC = re.compile(r"%(%|[-+ #0]*\d*(?:\.\d+)?(?:hh|h|ll|l|z|j|t|L|q)?([diouxXscfeEgGp@]))")
_PASS_THROUGH = {
    "newFunctionWithName:", "newFunctionWithName:constantValues:error:", "newFunctionWithName:constantValues:completionHandler:",
    "newComputePipelineStateWithFunction:error:", "newComputePipelineStateWithFunction:",
    "newComputePipelineStateWithFunction:options:reflection:error:",
    "stringWithUTF8String:", "stringWithCString:encoding:", "initWithUTF8String:", "stringWithString:",
    "UTF8String", "copy", "retain", "autorelease",
}
_OPAQUE = {"objectForKey:", "valueForKey:", "objectAtIndex:", "objectForKeyedSubscript:", "alloc", "init", "new",
           "dictionary", "array", "string", "dictionaryWithCapacity:", "arrayWithCapacity:"}
_FORMAT_SELECTORS = {"stringWithFormat:", "initWithFormat:"}
_BIND_SELECTORS = {
    "setBuffer:offset:atIndex:": "buffer",
    "setBytes:length:atIndex:": "bytes",
    "setThreadgroupMemoryLength:atIndex:": "threadgroup_memory",
    "setTexture:atIndex:": "texture",
    "setSamplerState:atIndex:": "sampler",
}
_GRID_SELECTORS = {"dispatchThreadgroups:threadsPerThreadgroup:", "dispatchThreads:threadsPerThreadgroup:"}
_PIPELINE_SELECTOR = "setComputePipelineState:"
_FORMAT_FUNCS = {"snprintf": 2, "sprintf": 1}  # name -> index of the format argument
_MAX_COMBOS = 512
_CALLED = re.compile(rb"([A-Za-z_]\w*)\s*\(")
_ASSIGNED = re.compile(rb"([A-Za-z_]\w*)\s*(?:\[[^\]\n]*\]\s*)?=(?!=)")
_MAX_DEPTH = 60


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class Unresolved:
    pattern: str  # the expression or format pattern that has no static value
    reason: str
    where: str = ""  # function:line of the dispatch site
    candidates: tuple[str, ...] = ()  # host names of the Metal library the pattern fits


@dataclass(frozen=True)
class Binding:
    kind: str  # buffer | bytes | threadgroup_memory | texture | sampler
    index: int | str
    expr: str  # what is bound (buffer expression / bytes / length)
    offset: str | None = None


@dataclass(frozen=True)
class DispatchSite:
    function: str
    line: int
    path: tuple[str, ...]  # API function -> ... -> function
    pipeline_expr: str
    kernels: tuple[str, ...]
    unresolved: tuple[Unresolved, ...]
    bindings: tuple[Binding, ...]
    grids: tuple[str, ...]


@dataclass
class ApiDispatch:
    unit: str
    line: int  # 0: not defined in the host file
    sites: list[DispatchSite] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)  # union over sites, first-seen order
    unresolved: list[Unresolved] = field(default_factory=list)
    helpers: list[str] = field(default_factory=list)  # host functions on the way to a dispatch
    api_calls: list[str] = field(default_factory=list)  # other API functions it calls


@dataclass
class HostScan:
    file: str
    lines: int
    error_nodes: int
    api: dict[str, ApiDispatch]
    preludes: list[tuple[str, bytes]]  # Metal source embedded in string literals: (name, text)
    functions: int = 0


# ---------------------------------------------------------------- values


class Val:
    __slots__ = ("vals", "unres")

    def __init__(self, vals=(), unres=()):
        self.vals = frozenset(vals)
        self.unres = frozenset(unres)

    def __or__(self, other: "Val") -> "Val":
        if not other.vals and not other.unres:
            return self
        if not self.vals and not self.unres:
            return other
        return Val(self.vals | other.vals, self.unres | other.unres)

    @property
    def empty(self) -> bool:
        return not self.vals and not self.unres

    def ints(self) -> set[int] | None:
        if self.unres or not self.vals or not all(isinstance(v, int) for v in self.vals):
            return None
        return {int(v) for v in self.vals}

    def truth(self) -> bool | None:
        """True/False when every possible value agrees; None when unknown."""
        if self.unres or not self.vals:
            return None
        ts = {bool(v) if not isinstance(v, str) else True for v in self.vals}
        return ts.pop() if len(ts) == 1 else None


EMPTY = Val()


def _un(pattern: str, reason: str) -> Val:
    return Val((), [(norm_ws(pattern)[:160], reason)])


# ---------------------------------------------------------------- per-function facts


class Func:
    """Facts about one function definition, gathered in one walk of its body."""

    def __init__(self, name: str, node, host: "HostFile"):
        self.name = name
        self.node = node
        self.host = host
        self.params: list[str] = []
        self.locals: set[str] = set()
        self.assigns: dict[str, list[tuple[int, object, object, str]]] = {}  # key -> [(pos, rhs, stmt, kind)]
        self.returns: list = []
        self.calls: list[tuple[str, object]] = []  # (callee, call node) for host-file functions
        self.events: list[tuple[int, str, object]] = []  # (pos, kind, message node)
        self._walked = False
        fd = _function_declarator(node.child_by_field_name("declarator"))
        plist = fd.child_by_field_name("parameters") if fd is not None else None
        for p in plist.named_children if plist is not None else []:
            n = _decl_name(p.child_by_field_name("declarator"), host.src)
            if n:
                self.params.append(n)

    def walk(self):
        if self._walked:
            return
        self._walked = True
        src = self.host.src
        body = self.node.child_by_field_name("body")
        stack = [body] if body is not None else []
        while stack:
            n = stack.pop()
            t = n.type
            if t == "declaration":
                for d in n.children_by_field_name("declarator"):
                    name = _decl_name(d, src)
                    if not name:
                        continue
                    self.locals.add(name)
                    if d.type == "init_declarator":
                        v = d.child_by_field_name("value")
                        if v is not None:
                            self.assigns.setdefault(name, []).append((d.start_byte, v, n, "init"))
            elif t == "assignment_expression":
                left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
                op = n.child_by_field_name("operator")
                optext = _t(op, src) if op is not None else "="
                key = _lvalue_key(left, src)
                if key and optext == "=" and right is not None:
                    self.assigns.setdefault(key, []).append((n.start_byte, right, n, "assign"))
                elif key and right is not None:
                    self.assigns.setdefault(key, []).append((n.start_byte, n, n, "compound"))
            elif t == "return_statement":
                self.returns.append(n)
            elif t == "call_expression":
                fn = n.child_by_field_name("function")
                if fn is not None and fn.type == "identifier":
                    callee = _t(fn, src)
                    if callee in self.host.funcs:
                        self.calls.append((callee, n))
                    elif callee in _FORMAT_FUNCS:
                        args = _args(n)
                        if args:
                            key = _lvalue_key(args[0], src)
                            if key:
                                self.assigns.setdefault(key, []).append((n.start_byte, n, n, "format"))
            elif t == "message_expression":
                sel, parts = self.host.msg(n)
                if sel == _PIPELINE_SELECTOR:
                    self.events.append((n.start_byte, "pipeline", n))
                elif sel in _BIND_SELECTORS or sel in _GRID_SELECTORS:
                    self.events.append((n.start_byte, "bind" if sel in _BIND_SELECTORS else "grid", n))
            stack.extend(reversed(n.named_children))
        self.events.sort(key=lambda e: e[0])
        for k in self.assigns:
            self.assigns[k].sort(key=lambda a: a[0])


def _t(node, src: bytes) -> str:
    return src[node.start_byte : node.end_byte].decode("utf-8", "replace")


def _function_declarator(node):
    while node is not None and node.type != "function_declarator":
        node = node.child_by_field_name("declarator")
    return node


def _decl_name(node, src: bytes) -> str | None:
    seen = 0
    while node is not None and seen < 16:
        seen += 1
        if node.type == "identifier":
            return _t(node, src)
        nxt = node.child_by_field_name("declarator")
        if nxt is None:
            nxt = next((c for c in node.named_children if c.type == "identifier"), None)
        node = nxt
    return None


def _lvalue_key(node, src: bytes) -> str | None:
    """'x' for x, 'x.f' for x.f / x->f, 'x' for x[i] (a table entry written)."""
    if node is None:
        return None
    if node.type == "identifier":
        return _t(node, src)
    if node.type == "field_expression":
        arg = node.child_by_field_name("argument")
        fld = node.child_by_field_name("field")
        base = _lvalue_key(arg, src)
        if base and fld is not None and "." not in base:
            return f"{base}.{_t(fld, src)}"
        return None
    if node.type == "subscript_expression":
        return _lvalue_key(node.child_by_field_name("argument"), src)
    if node.type == "parenthesized_expression" and node.named_children:
        return _lvalue_key(node.named_children[0], src)
    if node.type == "pointer_expression":
        return _lvalue_key(node.child_by_field_name("argument"), src)
    return None


def _args(call) -> list:
    al = call.child_by_field_name("arguments")
    return [c for c in al.named_children if c.type != "comment"] if al is not None else []


_CONTROL = {"if_statement", "for_statement", "while_statement", "do_statement", "switch_statement", "case_statement",
            "conditional_expression", "else_clause", "for_range_loop"}


def _contains(outer, inner) -> bool:
    return outer.start_byte <= inner.start_byte and inner.end_byte <= outer.end_byte


class Ctx:
    __slots__ = ("fn", "caller", "args", "path", "key")

    def __init__(self, fn: Func, caller: "Ctx | None", args: list | None, path: tuple[str, ...]):
        self.fn = fn
        self.caller = caller
        self.args = args
        self.path = path


# ---------------------------------------------------------------- the host file


class HostFile:
    def __init__(self, name: str, src: bytes, api_names: list[str]):
        from porter.target.cparse import error_nodes, parser

        self.name = name
        self.src = src
        self.lines = LineIndex(src)
        self.masked = mask_comments(src, strings=True)
        prepared = blank_attribute_macros(src)
        self.tree = parser("objc").parse(prepared)
        self.error_nodes = len(error_nodes(self.tree))
        self.api_names = list(api_names)
        self.funcs: dict[str, Func] = {}
        self.globals: dict[str, list] = {}  # name -> [declaration value nodes]
        self.tables: set[str] = set()
        self.consts: dict[str, str] = {}  # macros and enum constants (text)
        self._memo: dict = {}
        self._global_memo: dict[str, Val] = {}
        self._global_busy: set[str] = set()
        self._ctx_cache: dict = {}
        self.preludes: list[tuple[str, bytes]] = []
        self._collect()

    # -- collection
    def _collect(self):
        src = self.src
        stack = list(reversed(self.tree.root_node.named_children))
        while stack:
            n = stack.pop()
            t = n.type
            if t == "function_definition":
                name = _decl_name(_function_declarator(n.child_by_field_name("declarator")), src)
                if name and name not in self.funcs:
                    self.funcs[name] = Func(name, n, self)
            elif t == "declaration":
                for d in n.children_by_field_name("declarator"):
                    name = _decl_name(d, src)
                    if not name:
                        continue
                    v = d.child_by_field_name("value") if d.type == "init_declarator" else None
                    self.globals.setdefault(name, [])
                    if v is not None:
                        self.globals[name].append(v)
                        if v.type == "initializer_list":
                            self.tables.add(name)
                        if v.type in ("string_literal", "concatenated_string"):
                            text = self._string_value(v)
                            if text is not None and ("kernel " in text or "#include <metal_stdlib>" in text):
                                self.preludes.append((f"{self.name}:{name}", text.encode()))
            elif t == "preproc_def":
                nm, val = n.child_by_field_name("name"), n.child_by_field_name("value")
                if nm is not None and val is not None:
                    self.consts[_t(nm, src)] = _t(val, src).strip()
            elif t in ("enum_specifier",) or (t == "type_definition"):
                self._enum_consts(n)
            if t in ("preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif", "linkage_specification",
                     "declaration_list", "type_definition", "declaration", "enum_specifier"):
                stack.extend(reversed(n.named_children))
        # callee prefilter over masked text: which functions reach a dispatch site
        self.direct_calls: dict[str, set[str]] = {}
        self.assigned_in: dict[str, list[str]] = {}  # name -> functions with `name = ...` (prefilter)
        self.has_dispatch: dict[str, bool] = {}
        names = set(self.funcs)
        for name, f in self.funcs.items():
            body = f.node.child_by_field_name("body")
            if body is None:
                self.direct_calls[name] = set()
                self.has_dispatch[name] = False
                continue
            text = self.masked[body.start_byte : body.end_byte]
            toks = {m.decode() for m in _CALLED.findall(text)}
            for m in _ASSIGNED.findall(text):
                self.assigned_in.setdefault(m.decode(), []).append(name)
            self.direct_calls[name] = (toks & names) - {name}
            self.has_dispatch[name] = b"setComputePipelineState" in text
        reach = {n for n, v in self.has_dispatch.items() if v}
        changed = True
        while changed:
            changed = False
            for n, cs in self.direct_calls.items():
                if n not in reach and cs & reach:
                    reach.add(n)
                    changed = True
        self.reaches_dispatch = reach

    def _enum_consts(self, node):
        stack = [node]
        while stack:
            n = stack.pop()
            if n.type == "enumerator_list":
                nxt = 0
                for e in n.named_children:
                    if e.type != "enumerator":
                        continue
                    nm, val = e.child_by_field_name("name"), e.child_by_field_name("value")
                    if val is not None:
                        v = eval_int(_t(val, self.src), self.consts)
                        nxt = v if v is not None else nxt
                    if nm is not None:
                        self.consts[_t(nm, self.src)] = str(nxt)
                    nxt += 1
                continue
            stack.extend(n.named_children)

    def _string_value(self, node) -> str | None:
        if node.type == "string_literal":
            return decode_c_string(self.src[node.start_byte : node.end_byte])
        if node.type == "concatenated_string":
            parts = []
            for c in node.named_children:
                if c.type != "string_literal":
                    return None
                parts.append(decode_c_string(self.src[c.start_byte : c.end_byte]))
            return "".join(parts)
        return None

    def msg(self, node):
        """(selector, [(keyword, [arg nodes], arg text)]) of a message expression."""
        key = ("msg", node.id)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        src = self.src
        kids = node.children
        methods = []  # (index in kids, node, is keyword)
        for i, c in enumerate(kids):
            if node.field_name_for_child(i) == "method":
                methods.append((i, c, src[c.end_byte : c.end_byte + 64].lstrip().startswith(b":")))
        kws = [(i, c) for i, c, is_kw in methods if is_kw]
        parts = []
        if not kws:
            sel = _t(methods[0][1], src) if methods else ""
        else:
            sel = "".join(_t(c, src) + ":" for _, c in kws)
            for j, (i, c) in enumerate(kws):
                end_i = kws[j + 1][0] if j + 1 < len(kws) else len(kids)
                arg_nodes = [k for k in kids[i + 1 : end_i] if k.is_named and k.type != "comment"]
                colon = src.find(b":", c.end_byte)
                stop = kws[j + 1][1].start_byte if j + 1 < len(kws) else node.end_byte - 1
                arg_text = norm_ws(src[colon + 1 : stop].decode("utf-8", "replace")) if 0 <= colon < stop else ""
                parts.append((_t(c, src), arg_nodes, arg_text))
        out = (sel, parts)
        self._memo[key] = out
        return out

    def line(self, node) -> int:
        return self.lines.line(node.start_byte)

    # -- contexts
    def root_ctx(self, fn: Func) -> Ctx:
        key = ("root", fn.name)
        c = self._ctx_cache.get(key)
        if c is None:
            fn.walk()
            c = Ctx(fn, None, None, (fn.name,))
            self._ctx_cache[key] = c
        return c

    def call_ctx(self, caller: Ctx, callee: str, call) -> Ctx:
        key = (id(caller), call.id)
        c = self._ctx_cache.get(key)
        if c is None:
            fn = self.funcs[callee]
            fn.walk()
            c = Ctx(fn, caller, _args(call), caller.path + (callee,))
            self._ctx_cache[key] = c
        return c

    # -- evaluation
    def ev(self, node, ctx: Ctx, fld: str | None = None, depth: int = 0) -> Val:
        if node is None:
            return EMPTY
        key = (id(ctx), node.id, fld)
        memo = self._memo
        hit = memo.get(key)
        if hit is not None:
            return hit
        if depth > _MAX_DEPTH or len(ctx.path) > 24:
            return _un(_t(node, self.src), "evaluation too deep")
        memo[key] = EMPTY  # cycle guard
        try:
            val = self._ev(node, ctx, fld, depth + 1)
        except RecursionError:
            val = _un(_t(node, self.src), "evaluation too deep")
        memo[key] = val
        return val

    def _ev(self, node, ctx: Ctx, fld, depth) -> Val:
        src = self.src
        t = node.type
        text = _t(node, src)
        if t in ("string_literal", "concatenated_string"):
            s = self._string_value(node)
            return Val([s]) if s is not None else self._concat(node, ctx, depth)
        if t == "number_literal":
            v = eval_int(text)
            return Val([v]) if v is not None else _un(text, "not an integer constant")
        if t in ("true",) or text in ("YES", "true"):
            return Val([1])
        if t in ("false",) or text in ("NO", "false"):
            return Val([0])
        if t in ("null", "nil") or text in ("NULL", "nil", "Nil", "nullptr"):
            return EMPTY
        if t == "identifier":
            return self._ident(node, text, ctx, fld, depth)
        if t in ("parenthesized_expression", "comma_expression"):
            kids = [c for c in node.named_children if c.type != "comment"]
            return self.ev(kids[-1], ctx, fld, depth) if kids else EMPTY
        if t == "cast_expression":
            return self.ev(node.child_by_field_name("value"), ctx, fld, depth)
        if t == "conditional_expression":
            cond = self.ev(node.child_by_field_name("condition"), ctx, None, depth).truth()
            a = node.child_by_field_name("consequence")
            b = node.child_by_field_name("alternative")
            if cond is True:
                return self.ev(a, ctx, fld, depth)
            if cond is False:
                return self.ev(b, ctx, fld, depth)
            return self.ev(a, ctx, fld, depth) | self.ev(b, ctx, fld, depth)
        if t == "call_expression":
            return self._call(node, ctx, fld, depth)
        if t == "message_expression":
            return self._message(node, ctx, fld, depth)
        if t == "field_expression":
            arg = node.child_by_field_name("argument")
            f = node.child_by_field_name("field")
            if f is None:
                return _un(text, "field expression")
            inner = self.ev(arg, ctx, _t(f, src), depth)
            if inner.empty:
                return _un(text, f"no value for field {_t(f, src)} of {_t(arg, src)}")
            return inner
        if t == "subscript_expression":
            return self._subscript(node, ctx, fld, depth)
        if t in ("compound_literal_expression", "initializer_list"):
            lst = node.child_by_field_name("value") if t == "compound_literal_expression" else node
            if lst is None:
                return EMPTY
            if fld is None:
                out = EMPTY
                for c in lst.named_children:
                    if c.type != "initializer_pair":
                        out = out | self.ev(c, ctx, None, depth)
                return out
            for c in lst.named_children:
                if c.type == "initializer_pair":
                    des = c.child_by_field_name("designator")
                    if des is not None and _t(des, src).lstrip(".").strip() == fld:
                        return self.ev(c.child_by_field_name("value"), ctx, None, depth)
            return EMPTY
        if t == "binary_expression":
            return self._binary(node, ctx, depth)
        if t == "unary_expression":
            op = node.child_by_field_name("operator")
            v = self.ev(node.child_by_field_name("argument"), ctx, None, depth)
            ints = v.ints()
            o = _t(op, src) if op is not None else ""
            if ints is None:
                if o == "!" and v.vals and not v.unres and all(isinstance(x, str) for x in v.vals):
                    return Val([0])  # a name is never NULL
                return _un(text, "operand not static")
            fn = {"!": lambda x: int(not x), "-": lambda x: -x, "~": lambda x: ~x, "+": lambda x: x}.get(o)
            return Val({fn(x) for x in ints}) if fn else _un(text, f"operator {o}")
        if t == "pointer_expression":
            return EMPTY  # &error, *p: not a name
        if t == "sizeof_expression":
            return _un(text, "sizeof")
        if t == "assignment_expression":
            return self.ev(node.child_by_field_name("right"), ctx, fld, depth)
        return _un(text, f"{t} is not evaluated")

    def _concat(self, node, ctx, depth) -> Val:
        vals = [""]
        for c in node.named_children:
            v = self.ev(c, ctx, None, depth)
            if v.unres or not v.vals:
                return _un(_t(node, self.src), "string concatenation with a non-literal part")
            vals = [a + str(b) for a in vals for b in v.vals][:_MAX_COMBOS]
        return Val(vals)

    def _ident(self, node, name: str, ctx: Ctx, fld, depth) -> Val:
        fn = ctx.fn
        if name in fn.params or name in fn.locals:
            key = f"{name}.{fld}" if fld else name
            cands = fn.assigns.get(name, [])
            if fld:
                cands = sorted(cands + fn.assigns.get(key, []), key=lambda a: a[0])
            pos = node.start_byte
            before = [a for a in cands if a[0] < pos and not _contains_pos(a[2], pos)]
            out = EMPTY
            dominated = False
            for a in reversed(before):
                apos, rhs, stmt, kind = a
                if kind == "format":
                    out = out | self._format_call(rhs, ctx, depth)
                elif kind == "compound":
                    out = out | _un(_t(stmt, self.src), "compound assignment")
                else:
                    sub_fld = None if (fld and a in fn.assigns.get(key, [])) else fld
                    out = out | self.ev(rhs, ctx, sub_fld, depth)
                if self._dominates(stmt, node, fn):
                    dominated = True
                    break
            if not dominated:
                if name in fn.params:
                    i = fn.params.index(name)
                    if ctx.args is not None and i < len(ctx.args):
                        out = out | self.ev(ctx.args[i], ctx.caller, fld, depth)
                    elif ctx.args is None:
                        out = out | _un(name, f"parameter {name} of {fn.name}")
                    else:
                        out = out | _un(name, f"parameter {name} of {fn.name}: no argument at the call")
                elif out.empty and not before:
                    out = _un(name, f"local {name} of {fn.name} has no assignment before this use")
            return out
        if name in self.globals:
            return self._global(name, fld, depth)
        if name in self.consts:
            v = eval_int(self.consts[name], self.consts)
            if v is not None:
                return Val([v])
            c = self.consts[name].strip()
            if c.startswith(("\"", "@\"")):
                return Val([decode_c_string(c.encode())])
            return _un(name, f"macro {name} = {c[:40]}")
        if name in self.funcs:
            return EMPTY  # a function used as a value (callback)
        return _un(name, f"{name} is not defined in {self.name}")

    def _dominates(self, stmt, use, fn: Func) -> bool:
        """Does the assignment statement run on every path that reaches `use` (structured code)?"""
        body = fn.node.child_by_field_name("body")
        n = stmt.parent
        while n is not None and n.id != body.id:
            if n.type in _CONTROL and not _contains(n, use):
                return False
            if n.type == "binary_expression":
                op = n.child_by_field_name("operator")
                if op is not None and _t(op, self.src) in ("&&", "||") and not _contains(n, use):
                    return False
            n = n.parent
        return True

    def _global(self, name: str, fld, depth) -> Val:
        key = (name, fld)
        if key in self._global_memo:
            return self._global_memo[key]
        if key in self._global_busy:
            return EMPTY
        self._global_busy.add(key)
        out = EMPTY
        for v in self.globals.get(name, []):
            out = out | self.ev(v, self._file_ctx(), fld, depth)
        for fname in dict.fromkeys(self.assigned_in.get(name, [])):
            f = self.funcs[fname]
            f.walk()
            if name in f.locals or name in f.params:
                continue
            ctx = self.root_ctx(f)
            entries = list(f.assigns.get(name, []))
            if fld:
                entries += [a for a in f.assigns.get(f"{name}.{fld}", [])]
            for apos, rhs, stmt, kind in entries:
                if kind == "format":
                    out = out | self._format_call(rhs, ctx, depth)
                elif kind == "compound":
                    out = out | _un(_t(stmt, self.src), "compound assignment")
                else:
                    whole = f"{name}.{fld}" not in f.assigns or (apos, rhs, stmt, kind) not in f.assigns.get(f"{name}.{fld}", [])
                    out = out | self.ev(rhs, ctx, fld if whole else None, depth)
        self._global_busy.discard(key)
        self._global_memo[key] = out
        return out

    def _file_ctx(self) -> Ctx:
        c = self._ctx_cache.get("file")
        if c is None:
            dummy = Func.__new__(Func)
            dummy.name, dummy.node, dummy.host = "<file scope>", self.tree.root_node, self
            dummy.params, dummy.locals, dummy.assigns, dummy.returns, dummy.calls, dummy.events = [], set(), {}, [], [], []
            dummy._walked = True
            c = Ctx(dummy, None, None, ("<file scope>",))
            self._ctx_cache["file"] = c
        return c

    def _subscript(self, node, ctx, fld, depth) -> Val:
        arr = node.child_by_field_name("argument")
        idx = node.child_by_field_name("index")
        if idx is None:
            idx = next((c for c in node.named_children if c is not arr), None)
        name = _t(arr, self.src) if arr is not None and arr.type == "identifier" else None
        if name is None:
            return _un(_t(node, self.src), "subscript of a computed array")
        tables = []
        if name in ctx.fn.locals:
            tables = [a[1] for a in ctx.fn.assigns.get(name, []) if a[1].type == "initializer_list"]
        elif name in self.globals:
            tables = [v for v in self.globals[name] if v.type == "initializer_list"]
        if not tables:
            if name in ctx.fn.locals or name in ctx.fn.params:
                return self.ev(arr, ctx, fld, depth)  # a local buffer (snprintf target, ...)
            # a global container indexed at run time is a cache (g_pipelines[key]): like objectForKey:, it adds
            # no names; whoever fills it creates the pipeline from a name on its own path
            return EMPTY
        iv = self.ev(idx, ctx, None, depth).ints() if idx is not None else None
        out = EMPTY
        for tab in tables:
            entries = [c for c in tab.named_children if c.type != "comment"]
            chosen = entries
            if iv is not None and all(0 <= i < len(entries) for i in iv):
                chosen = [entries[i] for i in sorted(iv)]
            tctx = ctx if name in ctx.fn.locals else self._file_ctx()
            for e in chosen:
                out = out | self.ev(e, tctx, fld, depth)
        return out

    def _binary(self, node, ctx, depth) -> Val:
        op = node.child_by_field_name("operator")
        o = _t(op, self.src) if op is not None else ""
        a = self.ev(node.child_by_field_name("left"), ctx, None, depth)
        if o in ("&&", "||"):
            ta = a.truth()
            if o == "&&" and ta is False:
                return Val([0])
            if o == "||" and ta is True:
                return Val([1])
        b = self.ev(node.child_by_field_name("right"), ctx, None, depth)
        ia, ib = a.ints(), b.ints()
        if ia is None or ib is None:
            return _un(_t(node, self.src), "operands not static")
        fns = {
            "+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
            "/": lambda x, y: x // y if y else None, "%": lambda x, y: x % y if y else None,
            "<<": lambda x, y: x << y if 0 <= y < 64 else None, ">>": lambda x, y: x >> y if 0 <= y < 64 else None,
            "&": lambda x, y: x & y, "|": lambda x, y: x | y, "^": lambda x, y: x ^ y,
            "==": lambda x, y: int(x == y), "!=": lambda x, y: int(x != y), "<": lambda x, y: int(x < y),
            ">": lambda x, y: int(x > y), "<=": lambda x, y: int(x <= y), ">=": lambda x, y: int(x >= y),
            "&&": lambda x, y: int(bool(x) and bool(y)), "||": lambda x, y: int(bool(x) or bool(y)),
        }
        f = fns.get(o)
        if f is None or len(ia) * len(ib) > _MAX_COMBOS:
            return _un(_t(node, self.src), f"operator {o}")
        out = {f(x, y) for x in ia for y in ib}
        out.discard(None)
        return Val(out)

    def _call(self, node, ctx, fld, depth) -> Val:
        fn = node.child_by_field_name("function")
        text = _t(node, self.src)
        if fn is None or fn.type != "identifier":
            return _un(text, "call through an expression")
        name = _t(fn, self.src)
        if name in self.funcs:
            callee_ctx = self.call_ctx(ctx, name, node)
            return self._returns(callee_ctx, fld, depth)
        if name in _FORMAT_FUNCS:
            return EMPTY  # the buffer carries the value (see assigns)
        if name in ("MTLSizeMake", "MTLOriginMake", "MTLRegionMake1D", "MTLRegionMake2D", "MTLRegionMake3D"):
            return EMPTY
        return _un(text, f"call to {name} (not defined in {self.name})")

    def _returns(self, ctx: Ctx, fld, depth) -> Val:
        fn = ctx.fn
        out = EMPTY
        for r in fn.returns:
            if not self._reachable(r, ctx, depth):
                continue
            e = next((c for c in r.named_children if c.type != "comment"), None)
            if e is not None:
                out = out | self.ev(e, ctx, fld, depth)
        return out

    def _reachable(self, stmt, ctx: Ctx, depth) -> bool:
        """False when a branch on statically known values excludes this statement."""
        body = ctx.fn.node.child_by_field_name("body")
        child = stmt
        n = stmt.parent
        while n is not None and child.id != body.id:
            if n.type == "if_statement":
                cons = n.child_by_field_name("consequence")
                alt = n.child_by_field_name("alternative")
                cond = self.ev(n.child_by_field_name("condition"), ctx, None, depth).truth()
                if cons is not None and _contains(cons, stmt) and cond is False:
                    return False
                if alt is not None and _contains(alt, stmt) and cond is True:
                    return False
            elif n.type == "case_statement":
                if not self._case_matches(n, ctx, depth):
                    return False
            elif n.type == "compound_statement":
                for s in n.named_children:
                    if s.start_byte >= child.start_byte:
                        break
                    if self._always_leaves(s, ctx, depth):
                        return False
            child = n
            n = n.parent
        return True

    def _case_matches(self, case, ctx, depth) -> bool:
        sw = case.parent
        while sw is not None and sw.type != "switch_statement":
            sw = sw.parent
        if sw is None:
            return True
        v = self.ev(sw.child_by_field_name("condition"), ctx, None, depth).ints()
        if v is None:
            return True
        cases = [c for c in sw.child_by_field_name("body").named_children if c.type == "case_statement"]
        idx = next((i for i, c in enumerate(cases) if c.id == case.id), None)
        if idx is None:
            return True
        labels = []  # this case and the empty ones falling into it
        j = idx
        while True:
            val = cases[j].child_by_field_name("value")
            labels.append(val)
            if j == 0:
                break
            prev = cases[j - 1]
            if any(c for c in prev.named_children if c.type not in ("comment",) and c.id != (prev.child_by_field_name("value").id if prev.child_by_field_name("value") is not None else -1)):
                break
            j -= 1
        all_vals = set()
        for c in cases:
            cv = c.child_by_field_name("value")
            if cv is not None:
                iv = self.ev(cv, ctx, None, depth).ints()
                if iv is None:
                    return True
                all_vals |= iv
        for lab in labels:
            if lab is None:  # default
                if v - all_vals:
                    return True
                continue
            iv = self.ev(lab, ctx, None, depth).ints()
            if iv is None or iv & v:
                return True
        return False

    def _always_leaves(self, s, ctx, depth) -> bool:
        """Statement that returns on every path (given known values)."""
        t = s.type
        if t == "return_statement":
            return True
        if t == "compound_statement":
            return any(self._always_leaves(c, ctx, depth) for c in s.named_children)
        if t == "if_statement":
            cond = self.ev(s.child_by_field_name("condition"), ctx, None, depth).truth()
            cons = s.child_by_field_name("consequence")
            alt = s.child_by_field_name("alternative")
            alt_body = alt.named_children[-1] if alt is not None and alt.named_children else None
            if cond is True:
                return cons is not None and self._always_leaves(cons, ctx, depth)
            if cond is False:
                return alt_body is not None and self._always_leaves(alt_body, ctx, depth)
            return (cons is not None and alt_body is not None and self._always_leaves(cons, ctx, depth)
                    and self._always_leaves(alt_body, ctx, depth))
        if t == "switch_statement":
            body = s.child_by_field_name("body")
            cases = [c for c in body.named_children if c.type == "case_statement"] if body is not None else []
            if not any(c.child_by_field_name("value") is None for c in cases):
                return False
            for c in cases:
                stmts = [x for x in c.named_children if x.id != (c.child_by_field_name("value").id if c.child_by_field_name("value") is not None else -1)]
                if stmts and not any(self._always_leaves(x, ctx, depth) for x in stmts):
                    return False
            return bool(cases)
        return False

    def _message(self, node, ctx, fld, depth) -> Val:
        sel, parts = self.msg(node)
        text = _t(node, self.src)
        if sel in _PASS_THROUGH:
            if parts and parts[0][1]:
                return self.ev(parts[0][1][-1], ctx, None, depth)
            recv = node.child_by_field_name("receiver")
            return self.ev(recv, ctx, None, depth) if recv is not None else EMPTY
        if sel in _FORMAT_SELECTORS:
            nodes = parts[0][1] if parts else []
            if not nodes:
                return _un(text, "format without arguments")
            return self._format(nodes[0], nodes[1:], ctx, depth, text)
        if sel in _OPAQUE:
            return EMPTY
        return _un(text, f"message {sel or '?'} is not understood")

    def _format_call(self, call, ctx, depth) -> Val:
        name = _t(call.child_by_field_name("function"), self.src)
        args = _args(call)
        fi = _FORMAT_FUNCS.get(name, 1)
        if len(args) <= fi:
            return _un(_t(call, self.src), f"{name} without a format")
        return self._format(args[fi], args[fi + 1 :], ctx, depth, _t(call, self.src))

    def _format(self, fmt_node, arg_nodes, ctx, depth, text) -> Val:
        fv = self.ev(fmt_node, ctx, None, depth)
        if fv.unres or not fv.vals:
            return _un(text, "format string not static")
        out = EMPTY
        for fmt in fv.vals:
            if not isinstance(fmt, str):
                continue
            out = out | self._expand(fmt, arg_nodes, ctx, depth)
        return out

    def _expand(self, fmt: str, arg_nodes, ctx, depth) -> Val:
        specs = [m for m in _FORMAT_SPEC.finditer(fmt) if m.group(1) != "%"]
        choices = []
        unres_reasons = []
        for i, m in enumerate(specs):
            conv = m.group(2)
            if i >= len(arg_nodes):
                return _un(fmt, "format has more conversions than arguments")
            v = self.ev(arg_nodes[i], ctx, None, depth)
            argtext = norm_ws(_t(arg_nodes[i], self.src))
            if conv in "s@":
                opts = [x for x in v.vals if isinstance(x, str)]
            elif conv in "diouxXc":
                opts = [x for x in v.vals if isinstance(x, int)]
            else:
                opts = []
            if v.unres or not opts:
                why = "; ".join(sorted({r for _, r in v.unres})) or "no static value"
                unres_reasons.append(f"argument {i + 1} `{argtext}`: {why}")
            rendered = []
            for x in opts:
                try:
                    rendered.append(("%" + m.group(1)) % x if conv not in "@" else str(x))
                except (TypeError, ValueError):
                    rendered.append(str(x))
            choices.append(rendered)
        out_vals: list[str] = []
        if not unres_reasons:
            n = 1
            for c in choices:
                n *= max(1, len(c))
            if n > _MAX_COMBOS:
                return _un(fmt, f"{n} combinations")
            for combo in itertools.product(*choices):
                s, k = [], 0
                last = 0
                for m in _FORMAT_SPEC.finditer(fmt):
                    s.append(fmt[last : m.start()])
                    if m.group(1) == "%":
                        s.append("%")
                    else:
                        s.append(combo[k])
                        k += 1
                    last = m.end()
                s.append(fmt[last:])
                out_vals.append("".join(s))
            return Val(out_vals)
        return _un(fmt, "format " + "; ".join(unres_reasons))

    # -- the dispatch map
    def dispatch_map(self) -> dict[str, ApiDispatch]:
        out: dict[str, ApiDispatch] = {}
        api = set(self.api_names)
        for unit in self.api_names:
            f = self.funcs.get(unit)
            if f is None:
                out[unit] = ApiDispatch(unit=unit, line=0)
                continue
            ad = ApiDispatch(unit=unit, line=self.line(f.node))
            out[unit] = ad
            f.walk()
            ad.api_calls = sorted({c for c, _ in f.calls if c in api and c != unit})
            root = self.root_ctx(f)
            seen_sites: set = set()
            self._explore(root, ad, api, seen_sites, set())
            kn: list[str] = []
            unres: list[Unresolved] = []
            for s in ad.sites:
                for k in s.kernels:
                    if k not in kn:
                        kn.append(k)
                for u in s.unresolved:
                    if u not in unres:
                        unres.append(u)
            ad.kernels, ad.unresolved = kn, unres
        return out

    def _explore(self, ctx: Ctx, ad: ApiDispatch, api: set[str], seen_sites: set, on_path: set):
        """Dispatch sites of ctx's function and of the helpers it calls, in source order."""
        fn = ctx.fn
        fn.walk()
        if fn.name != ad.unit and fn.name not in ad.helpers:
            ad.helpers.append(fn.name)
        events = fn.events
        steps = [(pos, 0, i) for i, (pos, kind, _) in enumerate(events) if kind == "pipeline"]
        steps += [(call.start_byte, 1, k) for k, (callee, call) in enumerate(fn.calls)
                  if callee in self.reaches_dispatch and callee not in on_path and callee != fn.name]
        for pos, what, i in sorted(steps):
            if what == 1:
                callee, call = fn.calls[i]
                self._explore(self.call_ctx(ctx, callee, call), ad, api, seen_sites, on_path | {fn.name})
                continue
            node = events[i][2]
            key = (id(ctx), pos)
            if key in seen_sites:
                continue
            seen_sites.add(key)
            ad.sites.append(self._site(ctx, events, i, node))

    def _site(self, ctx: Ctx, events, i: int, node) -> DispatchSite:
        fn = ctx.fn
        sel, parts = self.msg(node)
        arg = parts[0][1][-1] if parts and parts[0][1] else None
        val = self.ev(arg, ctx) if arg is not None else _un(_t(node, self.src), "no pipeline argument")
        where = f"{fn.name}:{self.line(node)}"
        if val.empty:
            val = _un(parts[0][2] if parts else "?", "no name reaches this pipeline")
        kernels = tuple(sorted(v for v in val.vals if isinstance(v, str)))
        unres = tuple(Unresolved(p, r, where) for p, r in sorted(val.unres))
        bindings, grids = [], []
        for pos2, kind2, n2 in events[i + 1 :]:
            if kind2 == "pipeline":
                break
            sel2, parts2 = self.msg(n2)
            if kind2 == "bind":
                d = {kw: txt for kw, _, txt in parts2}
                idx_txt = d.get("atIndex", "")
                idx = eval_int(idx_txt, self.consts)
                first_kw = parts2[0][0] if parts2 else ""
                bindings.append(Binding(kind=_BIND_SELECTORS[sel2], index=idx if idx is not None else idx_txt,
                                        expr=d.get(first_kw, ""), offset=d.get("offset") or d.get("length")))
            else:
                grids.append(" ".join(f"{kw}:({txt})" for kw, _, txt in parts2))
        return DispatchSite(function=fn.name, line=self.line(node), path=ctx.path,
                            pipeline_expr=parts[0][2] if parts else "", kernels=kernels,
                            unresolved=unres, bindings=tuple(bindings), grids=tuple(grids))


def _contains_pos(node, pos: int) -> bool:
    return node.start_byte <= pos < node.end_byte


def scan_host(name: str, src: bytes, api_names: list[str]) -> HostScan:
    h = HostFile(name, src, api_names)
    api = h.dispatch_map()
    return HostScan(file=name, lines=src.count(b"\n") + 1, error_nodes=h.error_nodes, api=api, preludes=h.preludes,
                    functions=len(h.funcs))


__all__ = ["scan_host", "HostScan", "ApiDispatch", "DispatchSite", "Binding", "Unresolved"]
