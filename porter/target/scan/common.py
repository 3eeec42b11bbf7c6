"""Small helpers shared by the scanners: offset-preserving masking, names, integer folding.

Every pre-pass here keeps byte offsets and newlines, so a node found in the
masked text points at the same bytes (and lines) of the original source.
"""

from __future__ import annotations

import ast
import operator
import re

# One pass over C-family text: strings and char literals are skipped as units
# (so a "//" inside a string is not a comment), comments are reported.
_LEX = re.compile(
    rb'"(?:\\.|[^"\\\n])*"'  # string literal
    rb"|'(?:\\.|[^'\\\n])*'"  # char literal
    rb"|//[^\n]*"  # line comment
    rb"|/\*.*?\*/",  # block comment
    re.S,
)
IDENT = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")


def blank(data: bytes) -> bytes:
    """Same length, newlines kept, everything else a space."""
    return re.sub(rb"[^\n]", b" ", data)


def mask_comments(src: bytes, strings: bool = False) -> bytes:
    """Comments (and, with strings=True, the insides of string/char literals) become spaces."""
    out = bytearray(src)
    for m in _LEX.finditer(src):
        tok = m.group(0)
        if tok.startswith((b"//", b"/*")):
            out[m.start() : m.end()] = blank(tok)
        elif strings and len(tok) > 2:
            out[m.start() + 1 : m.end() - 1] = blank(tok[1:-1])
    return bytes(out)


def norm_ws(text: str) -> str:
    return " ".join(text.split())


def node_text(node, src: bytes) -> str:
    return src[node.start_byte : node.end_byte].decode("utf-8", "replace")


def line_of(src: bytes, offset: int) -> int:
    return src.count(b"\n", 0, offset) + 1


class LineIndex:
    """offset -> 1-based line, by bisection over newline offsets."""

    def __init__(self, src: bytes):
        import bisect

        self._nl = [m.start() for m in re.finditer(rb"\n", src)]
        self._bisect = bisect.bisect_left

    def line(self, offset: int) -> int:
        return self._bisect(self._nl, offset) + 1


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,
    ast.Mod: operator.mod,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
    ast.BitAnd: operator.and_,
    ast.BitXor: operator.xor,
}


def eval_int(expr: str, macros: dict[str, str] | None = None, _depth: int = 0) -> int | None:
    """Fold a C integer constant expression (macros expanded) or return None."""
    if _depth > 16:
        return None
    macros = macros or {}
    text = expr.strip()
    text = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", text)
    text = re.sub(r"\(\s*(?:u?int\d*_t|unsigned|int|short|long|size_t|uint|ushort)\s*\)", "", text)

    def expand(m: re.Match) -> str:
        name = m.group(0)
        if name in macros:
            v = eval_int(macros[name], macros, _depth + 1)
            if v is not None:
                return f"({v})"
        return name

    text = re.sub(r"[A-Za-z_]\w*", expand, text)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return None

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd, ast.Invert)):
            v = ev(n.operand)
            return -v if isinstance(n.op, ast.USub) else (~v if isinstance(n.op, ast.Invert) else v)
        if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            return _BINOPS[type(n.op)](ev(n.left), ev(n.right))
        raise ValueError(n)

    try:
        return int(ev(tree))
    except (ValueError, ZeroDivisionError, TypeError):
        return None


def decode_c_string(literal: bytes) -> str:
    """The value of one C/ObjC string literal token ("..." or @"..."), escapes decoded."""
    body = literal
    if body.startswith(b"@"):
        body = body[1:]
    # prefixes like u8"", L""
    q = body.find(b'"')
    body = body[q + 1 : body.rfind(b'"')]
    out = bytearray()
    i = 0
    simple = {b"n": b"\n", b"t": b"\t", b"r": b"\r", b"0": b"\0", b"\\": b"\\", b'"': b'"', b"'": b"'", b"a": b"\a",
              b"b": b"\b", b"f": b"\f", b"v": b"\v", b"?": b"?"}
    while i < len(body):
        c = body[i : i + 1]
        if c == b"\\" and i + 1 < len(body):
            nxt = body[i + 1 : i + 2]
            if nxt == b"x":
                m = re.match(rb"[0-9a-fA-F]{1,2}", body[i + 2 :])
                if m:
                    out.append(int(m.group(0), 16))
                    i += 2 + len(m.group(0))
                    continue
            if nxt in b"01234567" and nxt != b"" and re.match(rb"[0-7]{2,3}", body[i + 1 :]):
                m = re.match(rb"[0-7]{1,3}", body[i + 1 :])
                out.append(int(m.group(0), 8) & 0xFF)
                i += 1 + len(m.group(0))
                continue
            if nxt == b"\n":  # line continuation inside a literal
                i += 2
                continue
            out += simple.get(nxt, nxt)
            i += 2
            continue
        out += c
        i += 1
    return out.decode("utf-8", "replace")


_ATTR_MACRO = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]*(__attribute__\s*\(\(.*\)\)|__declspec\(.*\))?[ \t]*$", re.M)


def blank_attribute_macros(src: bytes) -> bytes:
    """Uses of macros defined as nothing or as __attribute__((...)) become spaces (offsets kept)."""
    names = {m.group(1) for m in _ATTR_MACRO.finditer(src)}
    if not names:
        return src
    pat = re.compile(rb"\b(" + b"|".join(re.escape(n) for n in sorted(names)) + rb")\b")
    out = bytearray(src)
    for m in pat.finditer(src):
        line_start = src.rfind(b"\n", 0, m.start()) + 1
        if re.match(rb"[ \t]*#", src[line_start : m.start()]):
            continue
        out[m.start() : m.end()] = b" " * (m.end() - m.start())
    return bytes(out)
