"""Extraction: the one CUDA translation unit a provider's answer holds.

The model never writes files.  Its answer is text; porter takes from it
exactly one fenced code block (```cuda, ```cu, ```cpp, ```c++, ```c or a bare
fence) that *defines* the unit's function, and refuses anything ambiguous with
a one-line reason that goes back into the next prompt:

  - an answer over the size limit;
  - no fenced code block at all (prose only), or a block left unterminated;
  - no block defining the function, or two blocks defining it, or one block
    defining it twice (conflicting answers: porter will not guess);
  - an #include of anything but the conventions header, the API header and
    CUDA / C / C++ standard headers (a quoted include of another file would
    pull code from outside the unit), read as the preprocessor reads it: line
    splices joined and comments removed first, `#include_next`, `#import` and
    `#embed` refused, a computed (macro) include refused, a path with `..`, a
    leading `/` or a backslash refused; and `.incbin` / `.include` in any
    string (inline asm makes the assembler read that file).  The compiler's
    sandbox (porter/gates/compile_jail.py) is the wall behind this filter.
Blocks in other languages (```bash, ```python, ...) and code blocks that do
not define the function (usage sketches) are ignored.
"""

from __future__ import annotations

import codecs
import posixpath
import re

from porter.target.cparse import function_definitions
from porter.errors import PorterError
from porter.gates.candidate import Candidate
from porter.gates.result import GateResult

MAX_RESPONSE_BYTES = 200_000

CODE_LANGS = {"", "cuda", "cu", "cpp", "c++", "cxx", "cc", "c", "h", "hpp", "cuh"}

# System headers a unit may include: C and C++ standard library, CUDA toolkit.
_C_HEADERS = {
    "assert.h", "ctype.h", "errno.h", "float.h", "inttypes.h", "limits.h", "math.h", "stdarg.h",
    "stdbool.h", "stddef.h", "stdint.h", "stdio.h", "stdlib.h", "string.h", "time.h",
}
_CXX_HEADERS = {
    "algorithm", "array", "atomic", "cassert", "cfloat", "cinttypes", "climits", "cmath", "cstddef",
    "cstdint", "cstdio", "cstdlib", "cstring", "limits", "mutex", "new", "numeric", "type_traits",
    "utility", "vector",
}
_CUDA_HEADERS = {
    "cuda.h", "cuda_runtime.h", "cuda_runtime_api.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h",
    "device_launch_parameters.h", "cooperative_groups.h", "math_constants.h", "mma.h",
    "cuda_pipeline.h", "vector_types.h", "vector_functions.h", "sm_60_atomic_functions.h",
}
_CUDA_HEADER_DIRS = ("cub/", "cuda/", "cooperative_groups/")

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)[^\n`]*$")
# a backslash-newline is deleted before anything else is read (gcc allows blanks between the two)
_SPLICE = re.compile(r"\\[ \t]*\r?\n")
_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_DIRECTIVE = re.compile(r"^[ \t]*(?:#|%:|\?\?=)[ \t]*([A-Za-z_]\w*)[ \t]*(.*)$", re.M)  # `%:` is a digraph of `#`
_FILE_DIRECTIVES = {"include", "include_next", "import", "embed"}
_HEADER_NAME = re.compile(r'<([^<>"\n]+)>|"([^"\n]+)"')
_ASM_READS_FILE = re.compile(r"\.\s*(?:incbin|include)\b|\bincbin\b", re.I)


class ExtractionError(PorterError):
    """The answer holds no single, self-contained definition of the unit."""


class CodeBlock:
    def __init__(self, lang: str, code: str, line: int):
        self.lang = lang
        self.code = code
        self.line = line  # 1-based line of the opening fence


def code_blocks(text: str) -> list[CodeBlock]:
    """Fenced blocks in Markdown order.  An unterminated fence raises ExtractionError."""
    blocks: list[CodeBlock] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = lines[i].strip()
            if close.startswith(fence[0] * len(fence)) and close.strip(fence[0]) == "":
                break
            body.append(lines[i])
            i += 1
        else:
            raise ExtractionError(f"code block opened on line {start + 1} is never closed (answer cut off?)")
        blocks.append(CodeBlock(lang, "\n".join(body) + "\n", start + 1))
        i += 1
    return blocks


def allowed_include(name: str, quoted: bool, local_headers: set[str]) -> bool:
    if quoted:
        return name in local_headers
    return (
        name in _C_HEADERS
        or name in _CXX_HEADERS
        or name in _CUDA_HEADERS
        or name.startswith(_CUDA_HEADER_DIRS)
        or name in local_headers
    )


def preprocessor_view(code: str) -> str:
    """The code as the preprocessor reads its directives: splices joined, comments one blank each."""
    joined = _SPLICE.sub("", code)
    return _COMMENT_OR_STRING.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0), joined)


def _refused(what: str, why: str, local_headers: set[str]) -> ExtractionError:
    return ExtractionError(f"{what} is refused: includes outside the unit ({why}; allowed: #include of "
                           f"{', '.join(sorted(local_headers))}, CUDA and C/C++ standard headers)")


def check_includes(code: str, local_headers: set[str]) -> None:
    """ExtractionError unless every file the preprocessor or the assembler would read is an allowed header."""
    view = preprocessor_view(code)
    for m in _DIRECTIVE.finditer(view):
        directive, operand = m.group(1), m.group(2).strip()
        if directive not in _FILE_DIRECTIVES:
            continue
        shown = f"#{directive} {operand[:80]}"
        if directive != "include":
            raise _refused(shown, f"#{directive} reads a file", local_headers)
        name = _HEADER_NAME.fullmatch(operand)
        if name is None:
            raise _refused(shown, "a computed include (a macro) names a file nobody can check", local_headers)
        quoted, path = name.group(2) is not None, (name.group(1) or name.group(2)).strip()
        if path.startswith("/") or "\\" in path or ".." in path.split("/") or posixpath.normpath(path) != path:
            raise _refused(shown, "a path outside the include folders", local_headers)
        if not allowed_include(path, quoted, local_headers):
            raise _refused(shown, "not one of the allowed headers", local_headers)
    strings = [_decoded(t) for t in _COMMENT_OR_STRING.findall(view) if t[0] == '"']
    for text in (*strings, "".join(strings), _COMMENT_OR_STRING.sub(" ", view)):
        found = _ASM_READS_FILE.search(text)
        if found:
            raise _refused(f"`{found.group(0)}`", "the assembler reads the file it names", local_headers)


def _decoded(literal: str) -> str:
    """A string literal's text with its escapes read (`"\\x2eincbin"` is `.incbin` to the assembler)."""
    try:
        return codecs.decode(literal[1:-1], "unicode_escape")
    except (UnicodeDecodeError, ValueError):
        return literal


def extract_unit_source(text: str, unit: str, target) -> str:
    """The code of the one fenced block of `text` that defines `unit`; ExtractionError otherwise."""
    size = len(text.encode("utf-8", "replace"))
    if size > MAX_RESPONSE_BYTES:
        raise ExtractionError(f"answer is {size // 1000} KB, over the {MAX_RESPONSE_BYTES // 1000} KB limit")
    blocks = code_blocks(text)
    if not blocks:
        raise ExtractionError(f"no fenced code block in the answer (prose only); put {unit} in one ```cuda block")
    code = [b for b in blocks if b.lang in CODE_LANGS]
    if not code:
        langs = ", ".join(sorted({b.lang for b in blocks}))
        raise ExtractionError(f"no CUDA/C++ code block in the answer (only: {langs}); put {unit} in one ```cuda block")
    defining = []
    for b in code:
        n = sum(1 for d in function_definitions(b.code) if d.name == unit)
        if n:
            defining.append((b, n))
    if not defining:
        raise ExtractionError(f"no code block defines {unit} ({len(code)} code block(s) seen)")
    if len(defining) > 1:
        where = ", ".join(f"line {b.line}" for b, _ in defining)
        raise ExtractionError(f"{len(defining)} code blocks define {unit} ({where}): conflicting answers, send exactly one")
    block, n = defining[0]
    if n > 1:
        raise ExtractionError(f"the code block defines {unit} {n} times: conflicting definitions, keep exactly one")
    local = {target.conventions_header.name, target.api_header.name}
    check_includes(block.code, local)
    return block.code


def run(answer, ctx) -> tuple[GateResult, Candidate | None]:
    """The extract gate (porter.gates.registry), a gate judging the answer: its verdict on the
    provider's answer, and the typed Candidate the unit it finds becomes (None when it refuses), what
    every gate after it judges (porter.gates.driver.extract_candidate)."""
    facts = {"response_sha256": answer.sha256, "toolchain": {"extractor": "porter.gates.extract"}}
    try:
        source = extract_unit_source(answer.text, answer.unit, ctx.target)
    except ExtractionError as exc:
        return GateResult("extract", False, str(exc), diagnostics=str(exc), check="extract",
                          evidence={"candidate_sha256": None, **facts}), None
    candidate = Candidate.of(answer.unit, source, answer.provenance)
    return GateResult("extract", True, f"one code block defines {answer.unit} ({len(source.splitlines())} lines)",
                      evidence={"candidate_sha256": candidate.sha256, **facts}), candidate
