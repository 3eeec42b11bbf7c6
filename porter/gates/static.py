"""Static gate: refuse candidates that cannot be a real port, before compiling them.

It reads the candidate with tree-sitter (porter.target.cparse) and refuses, each with
a one-line reason:

  - the generated placeholder (its `// porter:placeholder` marker);
  - an include, or an asm `.incbin`, of a file outside the unit (porter.gates.extract.check_includes);
  - a file that does not define the unit's function, defines it twice, or
    also defines other API functions (a unit file holds one unit);
  - a definition without C linkage (extern "C");
  - a signature that differs from the API header's ("13 parameters, header has 14");
  - a stub body: nothing but a constant return (-1, NULL, 0) after comments,
    `(void)x;` casts, logging and argument checks; TODO/"not implemented"
    bodies; empty bodies; a constant return behind a condition that is always
    true (`if (1) return -1;`, `if (n >= 0)` for unsigned n) or before dead
    code; stub macros (`#define STUB return -1`) are expanded first;
  - code that would run when the library is loaded (a constructor or destructor attribute, an
    init_priority or ifunc, a section the loader runs) and macro definitions of reserved names
    (`__x`, `_X`: nvcc appends its registration code to the file and a macro could rewrite it);
    the build gate checks the object itself (porter.gates.load_time), this names it early;
  - for an op unit (not a runtime unit): a "host-side shortcut", i.e. no
    kernel launch and no CUDA call that does work on the device reachable
    from the function.
This is the check that would have caught the six STUB kernels the failed port
listed as implemented.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import tree_sitter as ts

from porter.target.cparse import canonical_type, function_definitions, parse_cuda
from porter.records.evidence import gate_facts
from porter.gates.evidence import StaticEvidence
from porter.gates.extract import ExtractionError, check_includes
from porter.gates.result import GateResult
from porter.target.placeholder import MARKER, is_placeholder

GATE = "static"

_NOTE = re.compile(r"\b(TODO|FIXME|XXX|not\s+(yet\s+)?implemented|unimplemented|stub|placeholder)\b", re.I)
_LOGGING = {"printf", "fprintf", "puts", "fputs", "perror", "assert", "static_assert", "abort", "exit", "__trap"}
# CUDA host calls that make the device do work (besides <<<...>>> launches).
_WORK_CALL = re.compile(
    r"^(cudaMemcpy\w*|cudaMemset\w*|cudaLaunch\w*|cuLaunch\w*|cudaGraphLaunch|cublas\w*|"
    r"cub::.*|thrust::.*|cuda::.*)$"
)
_WORK_TEXT = re.compile(r"<<<|\bcudaMemcpy\w*\s*\(|\bcudaMemset\w*\s*\(|\bcudaLaunch\w*\s*\(|\bcub::|\bcublas\w*\s*\(|\bthrust::")
# `#`, or its digraph and trigraph spellings, then define/undef of a name reserved to the implementation
_RESERVED_MACRO = re.compile(r"(?:#|%:|\?\?=)[ \t]*(?:define|undef)[ \t]+(__\w*|_[A-Z]\w*)")
# what a file defines to ask the C library or headers for a feature: reserved names meant for users
FEATURE_MACROS = {"_GNU_SOURCE", "_POSIX_C_SOURCE", "_XOPEN_SOURCE", "_DEFAULT_SOURCE", "_BSD_SOURCE",
                  "_FILE_OFFSET_BITS", "_LARGEFILE64_SOURCE", "_USE_MATH_DEFINES", "__STDC_FORMAT_MACROS",
                  "__STDC_LIMIT_MACROS", "__STDC_CONSTANT_MACROS"}
_LOAD_TIME_WORD = re.compile(r"\b(constructor|destructor|init_priority|ifunc|init_array|fini_array|preinit_array|"
                             r"ctors|dtors)\b")
_NAMED_CONSTANT = re.compile(r"^(?:[A-Z][A-Z0-9_]*|cudaError\w*|cudaSuccess)$")


def _text(node: ts.Node) -> str:
    return node.text.decode("utf-8", "replace")


def _blank(m: re.Match) -> str:
    return re.sub(r"[^\n]", " ", m.group(0))


def strip_if0(src: str) -> str:
    """Blank `#if 0 ... #endif` regions (nesting-aware), keeping offsets and newlines."""
    lines = src.split("\n")
    out, depth = [], 0
    for line in lines:
        s = line.strip()
        if depth == 0:
            if re.match(r"#\s*if\s+(0|false)\s*($|//|/\*)", s):
                depth = 1
                out.append(" " * len(line))
                continue
            out.append(line)
            continue
        if re.match(r"#\s*if", s):
            depth += 1
        elif re.match(r"#\s*endif", s):
            depth -= 1
        elif depth == 1 and re.match(r"#\s*(else|elif)", s):
            depth = 0  # the #else branch is live
        out.append(" " * len(line))
    return "\n".join(out)


def strip_comments_and_strings(src: str) -> str:
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
    return pattern.sub(_blank, src)


@dataclass
class _Macros:
    values: dict[str, str] = field(default_factory=dict)  # name -> replacement text

    @classmethod
    def of(cls, root: ts.Node) -> "_Macros":
        m = cls()
        stack = [root]
        while stack:
            n = stack.pop()
            if n.type in ("preproc_def", "preproc_function_def"):
                name = n.child_by_field_name("name")
                value = n.child_by_field_name("value")
                if name is not None:
                    m.values[_text(name)] = _text(value) if value is not None else ""
                continue
            stack.extend(n.named_children)
        return m


def _find_definitions(root: ts.Node) -> list[tuple[str, ts.Node]]:
    """(name, function_definition node) for every function defined anywhere in the file."""
    out = []
    stack = [root]
    while stack:
        n = stack.pop()
        if n.type == "function_definition":
            d = n.child_by_field_name("declarator")
            while d is not None and d.type in ("pointer_declarator", "reference_declarator"):
                d = d.child_by_field_name("declarator") or next(iter(d.named_children), None)
            if d is not None and d.type == "function_declarator":
                nm = d.child_by_field_name("declarator")
                if nm is not None:
                    name = _text(nm).split("::")[-1]
                    out.append((name, n))
        stack.extend(reversed(n.named_children))
    return out


def _callee(call: ts.Node) -> str:
    f = call.child_by_field_name("function")
    if f is None:
        return ""
    if f.type == "template_function":
        f = f.child_by_field_name("name") or f
    return "".join(_text(f).split())


class _Body:
    """Classifies the top-level statements of one function body."""

    def __init__(self, macros: _Macros, unsigned_params: set[str]):
        self.macros = macros
        self.unsigned = unsigned_params
        self.notes: list[str] = []

    # -- constant folding (None: not a compile-time constant we can see) --
    def value(self, n: ts.Node, depth: int = 0) -> float | None:
        if depth > 20:
            return None
        t = n.type
        if t == "number_literal":
            s = _text(n).lower().replace("'", "")
            try:
                if s.startswith(("0x", "-0x")):
                    return float(int(s.rstrip("ul"), 16))
                s = s.rstrip("ulf")
                try:
                    return float(int(s, 0))
                except ValueError:
                    return float(s)
            except ValueError:
                return None
        if t in ("true",):
            return 1.0
        if t in ("false", "null", "nullptr"):
            return 0.0
        if t == "identifier":
            name = _text(n)
            if name in ("NULL", "nullptr"):
                return 0.0
            rep = self.macros.values.get(name)
            if rep is not None and rep.strip():
                tree = parse_cuda(f"int __porter_v = ({rep.strip()});")
                init = _first(tree.root_node, "init_declarator")
                if init is not None and init.child_by_field_name("value") is not None:
                    return self.value(init.child_by_field_name("value"), depth + 1)
            return None
        if t in ("parenthesized_expression", "condition_clause"):
            inner = [c for c in n.named_children if c.type != "comment"]
            return self.value(inner[-1], depth + 1) if inner else None
        if t == "cast_expression":
            v = n.child_by_field_name("value")
            return self.value(v, depth + 1) if v is not None else None
        if t == "sizeof_expression":
            return 1.0
        if t == "unary_expression":
            op = _text(n.child_by_field_name("operator"))
            a = self.value(n.child_by_field_name("argument"), depth + 1)
            if a is None:
                return None
            return {"!": float(not a), "-": -a, "+": a, "~": float(~int(a))}.get(op)
        if t == "binary_expression":
            op = _text(n.child_by_field_name("operator"))
            ln, rn = n.child_by_field_name("left"), n.child_by_field_name("right")
            a, b = self.value(ln, depth + 1), self.value(rn, depth + 1)
            if op == "||" and (a or b):
                return 1.0
            if op == "&&" and (a == 0 or b == 0):
                return 0.0
            # unsigned x >= 0 is always true, unsigned x < 0 always false
            if op in (">=", "<") and b == 0 and ln.type == "identifier" and _text(ln) in self.unsigned:
                return 1.0 if op == ">=" else 0.0
            if op in ("<=", ">") and a == 0 and rn.type == "identifier" and _text(rn) in self.unsigned:
                return 1.0 if op == "<=" else 0.0
            if a is None or b is None:
                return None
            try:
                return float({
                    "+": a + b, "-": a - b, "*": a * b, "==": a == b, "!=": a != b, "<": a < b,
                    ">": a > b, "<=": a <= b, ">=": a >= b, "&&": bool(a and b), "||": bool(a or b),
                    "&": int(a) & int(b), "|": int(a) | int(b), "^": int(a) ^ int(b),
                }[op])
            except KeyError:
                return None
        return None

    def constant_return(self, stmt: ts.Node) -> str | None:
        """The constant a `return X;` returns (as written), or None when X is not constant."""
        if stmt.type != "return_statement":
            return None
        exprs = [c for c in stmt.named_children if c.type != "comment"]
        if not exprs:
            return "nothing"
        e = exprs[0]
        if self.value(e) is not None:
            return _text(e)
        if e.type == "identifier" and _NAMED_CONSTANT.match(_text(e)):
            return _text(e)
        return None

    def statements(self, block: ts.Node, depth: int = 0) -> list[ts.Node]:
        """Top-level statements of a compound statement, stub macros expanded, comments noted."""
        out = []
        for c in block.named_children:
            if c.type == "comment":
                if _NOTE.search(_text(c)):
                    self.notes.append(_NOTE.search(_text(c)).group(0))
                continue
            if c.type == "compound_statement" and depth < 8:  # a bare { ... } block
                out.extend(self.statements(c, depth + 1))
                continue
            if c.type == "do_statement" and depth < 8:  # do { ... } while (0), the macro idiom
                cond = c.child_by_field_name("condition")
                body = c.child_by_field_name("body")
                if cond is not None and body is not None and self.value(cond) == 0:
                    out.extend(self.statements(body, depth + 1) if body.type == "compound_statement" else [body])
                    continue
            expanded = self.expand_macro(c, depth)
            out.extend(expanded if expanded is not None else [c])
        return out

    def expand_macro(self, stmt: ts.Node, depth: int) -> list[ts.Node] | None:
        if depth > 3 or stmt.type != "expression_statement" or not stmt.named_children:
            return None
        e = stmt.named_children[0]
        name = _text(e) if e.type == "identifier" else (_callee(e) if e.type == "call_expression" else "")
        if name not in self.macros.values:
            return None
        tree = parse_cuda("void __porter_m() {\n" + self.macros.values[name] + ";\n}")
        body = _first(tree.root_node, "compound_statement")
        return self.statements(body, depth + 1) if body is not None else None

    def trivial(self, stmt: ts.Node) -> bool:
        """Statements that do no work: `;`, `(void)x;`, logging calls."""
        if stmt.type == "expression_statement":
            kids = stmt.named_children
            if not kids:
                return True
            e = kids[0]
            if e.type == "cast_expression":
                ty = e.child_by_field_name("type")
                if ty is not None and _text(ty).strip() == "void":
                    return True
            if e.type == "call_expression" and _callee(e) in _LOGGING:
                for s in _descendants(e, "string_literal"):
                    m = _NOTE.search(_text(s))
                    if m:
                        self.notes.append(m.group(0))
                return True
            if e.type in ("string_literal", "number_literal", "identifier"):
                return True
        return False

    def constant_decl(self, stmt: ts.Node) -> bool:
        if stmt.type != "declaration":
            return False
        for d in stmt.named_children:
            if d.type == "init_declarator":
                v = d.child_by_field_name("value")
                if v is not None and self.value(v) is None:
                    return False
        return True

    def guard_return(self, stmt: ts.Node) -> tuple[str, float | None] | None:
        """For `if (cond) return CONST;` (no else): (the constant, the condition's value)."""
        if stmt.type != "if_statement" or stmt.child_by_field_name("alternative") is not None:
            return None
        cons = stmt.child_by_field_name("consequence")
        if cons is None:
            return None
        if cons.type == "compound_statement":
            inner = [s for s in self.statements(cons) if not self.trivial(s)]
            if len(inner) != 1:
                return None
            cons = inner[0]
        value = self.constant_return(cons)
        if value is None:
            return None
        cond = stmt.child_by_field_name("condition")
        if any(_callee(c) not in _LOGGING for c in _descendants(cond, "call_expression")):
            return None  # `if (do_the_work() != 0) return -1;` does work, it is no argument check
        return value, self.value(cond)

    def stub_reason(self, body: ts.Node, returns_void: bool) -> str | None:
        stmts = self.statements(body)
        checks = 0
        for s in stmts:
            if self.trivial(s) or self.constant_decl(s):
                continue
            const = self.constant_return(s)
            if const is not None:
                note = f" (with a {self.notes[0]!r} note)" if self.notes else ""
                if const == "nothing":
                    return f"stub body: it returns without doing anything{note}"
                if checks:
                    return f"stub body: returns {const} after argument checks only, no work{note}"
                return f"stub body: it only returns {const}{note}"
            guard = self.guard_return(s)
            if guard is not None:
                const, cond = guard
                cond_text = " ".join(_text(s.child_by_field_name("condition")).split())
                if cond is not None and cond != 0:
                    return f"stub body: `if {cond_text}` is always true, so it always returns {const} before any work"
                checks += 1  # an argument check; or dead when cond is constant false
                continue
            return None  # real work
        if not stmts and not self.notes:
            return "stub body: the body is empty"
        if self.notes:
            return f"stub body: only a {self.notes[0]!r} note, no work"
        return "stub body: argument checks only, no work" if checks else "stub body: the body does nothing"


def _first(node: ts.Node, type_: str) -> ts.Node | None:
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == type_:
            return n
        stack.extend(reversed(n.named_children))
    return None


def _descendants(node: ts.Node, type_: str):
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == type_:
            yield n
        stack.extend(n.named_children)


def _does_device_work(root: ts.Node, unit: str, macros: _Macros, other_ops: set[str] = frozenset()) -> bool:
    """Is a kernel launch or a device-work CUDA call reachable from `unit` through functions of this file?

    A call to another op unit of the API counts: that unit is held to this same rule."""
    defs = _find_definitions(root)
    calls: dict[str, set[str]] = {}
    work: dict[str, bool] = {}
    for name, node in defs:
        body = node.child_by_field_name("body")
        if body is None:
            continue
        names = {_callee(c) for c in _descendants(body, "call_expression")}
        names |= {_text(i) for i in _descendants(body, "identifier") if _text(i) in macros.values}
        launched = any(True for _ in _descendants(body, "kernel_call_syntax"))
        calls.setdefault(name, set()).update(names)
        work[name] = work.get(name, False) or launched or any(_WORK_CALL.match(n) for n in names) \
            or bool(names & other_ops)
    macro_work = {m for m, rep in macros.values.items() if _WORK_TEXT.search(rep)}
    seen, todo = set(), [unit]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        if work.get(f) or calls.get(f, set()) & macro_work:
            return True
        todo.extend(n for n in calls.get(f, ()) if n in calls)
    return False


def _signature_problem(fn, d) -> str | None:
    want_ret, want = fn.signature_key
    got_ret, got = d.signature_key
    norm = _normalise_type
    if norm(got_ret) != norm(want_ret):
        return f"{fn.name} returns `{got_ret}`, header has `{want_ret}`"
    if len(got) != len(want):
        return f"{fn.name} has {len(got)} parameters, header has {len(want)} ({fn.c_signature()})"
    for i, (g, w) in enumerate(zip(got, want)):
        if norm(g) != norm(w):
            hname = fn.params[i].name or f"#{i + 1}"
            return f"parameter {i + 1} (`{hname}`) of {fn.name} is `{g}`, header has `{w}`"
    return None


def _normalise_type(t: str) -> str:
    """`struct T const *` and `const T *` are the same parameter type."""
    t = re.sub(r"\b(struct|enum|union)\s+", "", t)
    t = canonical_type(t)
    m = re.match(r"^(\w+) const( .*)?$", t)
    if m:
        t = f"const {m.group(1)}{m.group(2) or ''}"
    return canonical_type(t)


def run(candidate, ctx) -> GateResult:
    """Static verdict on the candidate for its unit of ctx.target."""
    target, unit, source = ctx.target, candidate.unit, candidate.source
    fn = target.api_function(unit)
    facts = gate_facts(target, unit, GATE, candidate.sha256, {"parser": "tree-sitter-cuda"},
                       runtime_unit=unit in target.runtime_units)

    def result(ok: bool, summary: str, **more) -> GateResult:
        ev = StaticEvidence.record(dict(facts, ok=ok, summary=summary, **more))
        return GateResult(GATE, ok, summary, diagnostics=summary, evidence=ev, check=None if ok else "static")

    if is_placeholder(source):
        return result(False, f"candidate is the generated placeholder (`{MARKER}`), not a port")
    try:  # again here: a unit file edited by hand, or reverified, never went through extract
        check_includes(source, {target.conventions_header.name, target.api_header.name})
    except ExtractionError as exc:
        return result(False, str(exc))

    live = strip_if0(source)
    early = load_time_text(source)
    if early:
        return result(False, early)
    defs = [d for d in function_definitions(live) if d.name == unit]
    if not defs:
        return result(False, f"candidate does not define {unit} (outside `#if 0`)")
    if len(defs) > 1:
        return result(False, f"candidate defines {unit} {len(defs)} times")
    d = defs[0]
    others = sorted({x.name for x in function_definitions(live)} & (set(target.units) - {unit}))
    if others:
        return result(False, f"candidate also defines {', '.join(others)}: a unit file defines only its own API function")
    if not d.extern_c:
        return result(False, f'{unit} is defined without C linkage: define it inside extern "C"')
    sig = _signature_problem(fn, d)
    if sig:
        return result(False, f"signature differs from the header: {sig}")

    tree = parse_cuda(live)
    macros = _Macros.of(tree.root_node)
    node = next((n for name, n in _find_definitions(tree.root_node) if name == unit), None)
    if node is None:  # cparse found it but our walk did not: parse disagreement, let the compiler decide
        return result(True, "static checks passed (definition located by cparse only)")
    unsigned = {p.name for p in fn.params if _normalise_type(p.type).startswith(("uint", "unsigned", "size_t"))}
    analysis = _Body(macros, unsigned)
    stub = analysis.stub_reason(node.child_by_field_name("body"), fn.return_type == "void")
    if stub and unit in target.runtime_units and unit in getattr(target.spec.units, "trivial", ()):
        return result(True, f"static checks passed: C linkage, header signature; a trivial body ({stub}) "
                      "is declared correct for this runtime unit ([units] trivial)", trivial=True)
    if stub:
        return result(False, f"{unit}: {stub}")

    if unit not in target.runtime_units:
        other_ops = set(target.units) - set(target.runtime_units) - {unit}
        tree_says = _does_device_work(tree.root_node, unit, macros, other_ops)
        text_says = bool(_WORK_TEXT.search(strip_comments_and_strings(live)))
        if not tree_says and not (text_says and _has_parse_errors(tree)):
            return result(
                False,
                f"host-side shortcut: {unit} launches no kernel and calls no CUDA API that does device work "
                "(no <<<...>>>, cudaLaunchKernel, cudaMemcpy*/cudaMemset*, cub, cublas)",
            )
    return result(True, "static checks passed: C linkage, header signature, a real body"
                  + ("" if unit in target.runtime_units else ", device work reachable"))


def load_time_text(source: str) -> str | None:
    """Why the text would put code at load time or rewrite nvcc's appended code, or None.  Read on the
    text with comments and strings blanked (`#if 0` kept: a macro may be defined inside it and still
    not count, but refusing that costs an honest answer nothing)."""
    text = strip_comments_and_strings(source.replace("\\\n", ""))
    if m := next((m for m in _RESERVED_MACRO.finditer(text) if m.group(1) not in FEATURE_MACROS), None):
        return (f"defines or undefines the reserved name {m.group(1)}: names beginning with __ or _ and a "
                "capital belong to the compiler and CUDA (nvcc appends code that uses them to this file)")
    if m := _LOAD_TIME_WORD.search(text):
        return (f"load-time code ({m.group(1)}): a unit may not run code when the library is loaded; "
                "do the work when the function is called")
    return None


def _has_parse_errors(tree: ts.Tree) -> bool:
    return tree.root_node.has_error
