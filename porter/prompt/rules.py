"""The target's own rules in the system prompt, and the check that nothing in a prompt contradicts them.

A rule written once for every target is wrong for some: "never the default stream" is minimoe's rule
and the opposite of ds4's (its engine orders every op on the legacy default stream), "return non-zero
for invalid arguments" is minimoe's failure value and ds4's success value.  So the rules that depend on
the target are declared in its target.toml ([cuda.rules], porter.target.RulesSpec) and rendered from
there; what the conventions header brings in is read from the header itself.

    for_prompt(target, conventions) -> dict            what system.j2 renders
    contradictions(target, system, conventions) -> [str]
        a rule of the rendered system prompt against the declarations, or a declaration against the
        conventions header, the parity harness or [cuda] stream (tests/test_prompt_rules.py renders
        every unit's prompt of every bundled target through it)
"""

from __future__ import annotations

import re
from pathlib import Path

_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
_STREAM_FN = re.compile(r"\bcudaStream_t\s+([A-Za-z_]\w*)\s*\(")


def header_includes(conventions: str) -> list[str]:
    """The headers the conventions header includes, in its order (a unit gets them with it)."""
    return list(dict.fromkeys(_INCLUDE.findall(conventions)))


def for_prompt(target, conventions: str) -> dict:
    r = target.spec.cuda.rules
    return {
        "stream": r.stream, "stream_accessor": r.stream_accessor, "success": r.success_return,
        "failure": r.failure_return, "launch_check": r.launch_check, "tensor": r.tensor,
        "shared_state": r.shared_state, "libraries": list(r.libraries),
        "brings_in": header_includes(conventions),
    }


def _flat(text: str) -> str:
    return " ".join(text.split())


def _declarations_vs_sources(target, conventions: str) -> list[str]:
    r = target.spec.cuda.rules
    out = []
    accessors = _STREAM_FN.findall(conventions)
    says_legacy = "legacy default stream" in _flat(conventions).lower()
    if r.stream == "legacy":
        if accessors:
            out.append(f"[cuda.rules] stream = legacy, but the conventions header declares a stream accessor "
                       f"{accessors[0]}()")
        if "legacy" not in target.spec.cuda.stream.lower():
            out.append(f"[cuda.rules] stream = legacy, but [cuda] stream says {target.spec.cuda.stream!r}")
    else:
        if r.stream_accessor not in accessors:
            out.append(f"[cuda.rules] stream_accessor {r.stream_accessor}() is not declared by the conventions header")
        if says_legacy:
            out.append("the conventions header says units launch on the legacy default stream, but [cuda.rules] "
                       f"stream is {r.stream_accessor}()")
        if r.stream_accessor not in target.spec.cuda.stream:
            out.append(f"[cuda] stream {target.spec.cuda.stream!r} does not name {r.stream_accessor}()")
    from porter.gates.parity.gate import harness_names  # the names the parity child really uses

    harness = harness_names(target)
    want = "legacy" if r.stream == "legacy" else r.stream_accessor
    if harness.get("stream") != want:
        out.append(f"parity/harness.toml probes stream {harness.get('stream')!r}, but [cuda.rules] declares {want!r}")
    judged = harness.get("success")
    if judged is not None and (judged == "zero") != (r.success_return == "0"):
        out.append(f"parity/harness.toml judges success as {judged!r}, but [cuda.rules] success_return is "
                   f"{r.success_return}")
    if not re.search(rf"\bstruct\s+{re.escape(r.tensor)}\s*\{{", conventions):
        out.append(f"[cuda.rules] tensor {r.tensor} is not defined by the conventions header")
    check = re.match(r"[A-Za-z_]\w*", r.launch_check)
    if check is None or not re.search(rf"\b{check.group(0)}\b", conventions):
        out.append(f"[cuda.rules] launch_check {r.launch_check!r} is not offered by the conventions header")
    return out


def _system_vs_declarations(target, system: str, conventions: str) -> list[str]:
    r = target.spec.cuda.rules
    text = _flat(system)
    out = []
    # streams
    never_default = re.search(r"never[^.]{0,40}\bdefault stream", text, re.I)
    if r.stream == "legacy":
        if never_default:
            out.append(f"the system prompt says {never_default.group(0)!r}, but the target launches on the legacy "
                       "default stream")
        if "legacy default stream" not in text:
            out.append("the system prompt's stream rule does not name the legacy default stream")
    else:
        if f"{r.stream_accessor}()" not in text:
            out.append(f"the system prompt's stream rule does not name {r.stream_accessor}()")
        if re.search(r"on the legacy default stream", text) and not never_default:
            out.append("the system prompt tells units to launch on the legacy default stream, but the target's "
                       f"stream is {r.stream_accessor}()")
    # the failure value
    for m in re.finditer(r"return ([-\w]+(?: \(or [^)]*\))?) for invalid", text):
        said = m.group(1).split(" ")[0]
        if said != r.failure_return:
            out.append(f"the system prompt says 'return {m.group(1)} for invalid' arguments, but the target's "
                       f"failure value is {r.failure_return} (success: {r.success_return})")
    if f"return {r.failure_return} for invalid" not in text:
        out.append(f"the system prompt does not say invalid arguments return {r.failure_return}")
    # what the conventions header brings in
    brought = set(header_includes(conventions))
    m = re.search(r"it brings in ([^)]*)\)", text)
    if m:
        named = [h.strip(" `") for h in re.split(r",| and ", m.group(1)) if h.strip(" `")]
        for h in named:
            if h not in brought:
                out.append(f"the system prompt says the conventions header brings in {h}; it does not")
    # launch checks named by the prompt are the declared one
    if r.launch_check not in system:
        out.append(f"the system prompt does not show the launch check {r.launch_check}")
    return out


def contradictions(target, system: str, conventions: str) -> list[str]:
    """Every rule of `system` (a rendered system prompt) that contradicts the target's declarations, and
    every declaration the conventions header, the parity harness or [cuda] stream contradicts."""
    return _declarations_vs_sources(target, conventions) + _system_vs_declarations(target, system, conventions)


def conventions_text(target) -> str:
    path = Path(target.conventions_header)
    return path.read_text(errors="replace") if path.is_file() else ""
