"""The reference provider: answers a unit with upstream's own CUDA code for it.

A full dry run of the port on real code: the unit's API function, the kernels
it launches and the helpers, device functions, constants and types they reach
are sliced (porter.target.scan.cuda_slice) from the target's existing CUDA backend in
the user's checkout, named by target.toml:

    [reference]
    source = "ds4_cuda.cu"              # relative to the checkout
    rules = "reference_rules.toml"      # relative to the target folder

The rules adapt the slice to porter's conventions mechanically, never by hand
per unit: `provided` names the conventions header defines under the same
name, `[rename]` maps upstream names to the conventions' (shared state,
glue helpers), `per_unit` names mutable globals a unit may own a private copy
of, `[inline_includes]` maps a quoted include to the storage its declarations
get when inlined (e.g. "static" for __constant__ tables every unit needs its
own copy of).  Every rename target and provided name must appear in the
conventions header, so a rule cannot point at nothing.  With
`append_missing_params = true`, an upstream definition whose parameters are
the header's minus trailing ones gets those appended, unused (upstream's own
behaviour: it never reads or writes them); any other mismatch is left for the
static gate to report.

With flaws (`--flaws`, options["flaws"], $PORTER_REFERENCE_FLAWS=1 or
[provider] flaws = true), the first answers for a unit are its mutants from
targets/<t>/mutants.toml (each applied to the source, then sliced), in file
order, and then the real slice: the retry loop runs on the real target.

Nothing of the checkout is written into the repository: the slice is the
answer text, which the loop saves under runs/ and, when it passes, commits in
the user's workspace.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from porter.gates.mutants import rule_mutants
from porter.errors import PorterError
from porter.providers.base import Completion, PromptRequest, Provider, ProviderError
from porter.target.scan.cuda_slice import CudaFile, SliceError, SliceRules, slice_unit
from porter.tomlfile import read_toml

RULE_KEYS = {"provided", "rename", "per_unit", "inline_includes", "append_missing_params"}


def _truthy(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def reference_source(target) -> Path:
    spec = getattr(target.spec, "reference", None)
    if spec is None or not spec.source:
        raise ProviderError(f"target {target.name} names no reference backend: add [reference] source = \"...\" "
                            f"to targets/{target.name}/target.toml")
    path = Path(target.checkout) / spec.source
    if not path.is_file():
        raise ProviderError(f"reference source {path} does not exist in the checkout {target.checkout}")
    return path


def load_rules(target) -> SliceRules:
    """The target's slicing rules, checked against its conventions header."""
    spec = getattr(target.spec, "reference", None)
    rel = spec.rules if spec is not None and spec.rules else None
    raw: dict = {}
    if rel:
        path = Path(target.dir) / rel
        raw = read_toml(path, error=ProviderError, why_needed="the target's [reference] rules name it")
        unknown = set(raw) - RULE_KEYS
        if unknown:
            raise ProviderError(f"malformed {path}: unknown key(s) {', '.join(sorted(unknown))} "
                                f"(known: {', '.join(sorted(RULE_KEYS))})")
    for key in ("rename", "inline_includes"):
        table = raw.get(key, {})
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise ProviderError(f"malformed reference rules of {target.name}: [{key}] maps names to strings")
    for key in ("provided", "per_unit"):
        if not isinstance(raw.get(key, []), list) or not all(isinstance(v, str) for v in raw.get(key, [])):
            raise ProviderError(f"malformed reference rules of {target.name}: {key} is a list of names")
    if "append_missing_params" in raw and not isinstance(raw["append_missing_params"], bool):
        raise ProviderError(f"malformed reference rules of {target.name}: append_missing_params must be true or false")
    rules = SliceRules(
        provided=frozenset(raw.get("provided", [])),
        rename=dict(raw.get("rename", {})),
        per_unit=frozenset(raw.get("per_unit", [])),
        inline_includes=dict(raw.get("inline_includes", {})),
        api=frozenset(f.name for f in target.api),
        append_missing_params=bool(raw.get("append_missing_params", False)),
    )
    header = Path(target.conventions_header)
    if header.is_file():
        declared = set(re.findall(r"[A-Za-z_]\w*", header.read_text()))
        missing = sorted((set(rules.rename.values()) | rules.provided) - declared)
        if missing:
            raise ProviderError(f"reference rules of {target.name} name {', '.join(missing)}, which "
                                f"{header.name} does not declare")
    return rules


def unit_mutants(target, unit: str, source_name: str) -> list:
    """The unit's mutants of the reference source, in mutants.toml order."""
    return [m for m in rule_mutants(target) if m.unit == unit and m.file == source_name]


def append_missing_params(text: str, fn) -> tuple[str, list[str]]:
    """`text` with fn's definition given the header's trailing parameters it lacks (unused), and their names.

    Only when the definition's parameters are exactly the header's first ones; otherwise unchanged."""
    from porter.target.cparse import _params, _declarator_chain, canonical_type, parse_cuda

    tree = parse_cuda(text)
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            fd, _ = _declarator_chain(node.child_by_field_name("declarator"))
            name = fd.child_by_field_name("declarator") if fd is not None else None
            if name is not None and name.text.decode() == fn.name:
                have = _params(fd)
                want = fn.params
                if len(have) >= len(want) or [canonical_type(p.type) for p in have] != \
                        [canonical_type(p.type) for p in want[:len(have)]]:
                    return text, []
                missing = want[len(have):]
                plist = fd.child_by_field_name("parameters")
                body = node.child_by_field_name("body")
                close = plist.end_byte - 1  # the ')'
                sep = ", " if have else ""
                added = sep + ", ".join(f"{p.type} {p.name}".replace("* ", "*") for p in missing)
                unused = "".join(f"\n    (void){p.name};  /* porter: in the header, not upstream */" for p in missing)
                data = text.encode()
                out = data[:close] + added.encode() + data[close:body.start_byte + 1] + unused.encode() \
                    + data[body.start_byte + 1:]
                return out.decode(), [p.name for p in missing]
            continue
        stack.extend(node.children)
    return text, []


class ReferenceProvider(Provider):
    name = "reference"

    def __init__(self, target, options: dict | None = None):
        options = dict(options or {})
        self.target = target
        self.source = reference_source(target)
        self.rules = load_rules(target)
        toml = dict(getattr(target.spec, "provider", None) or {})
        self.flaws = any(_truthy(v) for v in (options.get("flaws"), os.environ.get("PORTER_REFERENCE_FLAWS"),
                                              toml.get("flaws")) if v is not None)
        self.model = f"upstream:{self.source.name}"
        self._parsed: dict[str, CudaFile] = {}

    def _file(self, text: str) -> CudaFile:
        key = hashlib.sha256(text.encode()).hexdigest()
        if key not in self._parsed:
            try:
                self._parsed[key] = CudaFile.parse(self.source, self.rules, text=text)
            except SliceError as exc:
                raise ProviderError(str(exc)) from None
        return self._parsed[key]

    def answer(self, unit: str, attempt: int) -> tuple[str, str]:
        """(answer text, what it is: 'upstream' or 'mutant NAME') for the attempt-th try of unit."""
        text = self.source.read_text()
        what = "upstream"
        if self.flaws:
            mutants = unit_mutants(self.target, unit, self.source.name)
            if 1 <= attempt <= len(mutants):
                m = mutants[attempt - 1]
                try:
                    text = m.apply(text)
                except PorterError as exc:
                    raise ProviderError(str(exc)) from None
                what = f"mutant {m.name}"
        return self.answer_from(unit, text, what), what

    def answer_from(self, unit: str, text: str, what: str = "upstream") -> str:
        """The answer text for `unit` sliced from `text`, a version of the reference source (upstream's
        own, or a mutant of it: `what` names which, and a mutant that leaves the slice unchanged is refused)."""
        sha = hashlib.sha256(text.encode()).hexdigest()[:12]
        banner = (f"{unit}: sliced by porter's reference provider from {self.source.name} ({what}, sha256 {sha}),\n"
                  f"adapted by targets/{self.target.name}/{self.target.spec.reference.rules or '(no rules)'}.")
        try:
            s = slice_unit(self._file(text), unit, self.rules, Path(self.target.conventions_header).name, banner)
        except SliceError as exc:
            raise ProviderError(str(exc)) from None
        if what != "upstream":
            header = Path(self.target.conventions_header).name
            real = slice_unit(self._file(self.source.read_text()), unit, self.rules, header)
            if real.text == slice_unit(self._file(text), unit, self.rules, header).text:
                # a mutant whose rule lands outside this unit's slice would be an unmutated answer
                raise ProviderError(f"{what} changes nothing in {unit}'s slice of {self.source.name}: "
                                    f"its rule edits code the unit does not reach")
        adapted = ""
        if self.rules.append_missing_params:
            code, added = append_missing_params(s.text, self.target.api_function(unit))
            if added:
                s.text = code
                adapted = f" Appended header parameter(s) upstream lacks, unused: {', '.join(added)}."
        calls = f" It calls {', '.join(s.api_calls)} through the API (linked, not copied)." if s.api_calls else ""
        prose = (f"Reference answer for {unit}: {what} code from {self.source.name}, "
                 f"{len(s.decls)} declarations.{calls}{adapted}\n\n")
        return prose + "```cuda\n" + s.text + "```\n"

    def complete(self, req: PromptRequest) -> Completion:
        text, what = self.answer(req.unit, req.attempt)
        usage = {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "calls": 0}
        model = self.model + ("" if what == "upstream" else f":{what.split()[-1]}")
        return Completion(text=text, provider=self.name, model=model, usage=usage)


def make(target, options: dict | None = None) -> ReferenceProvider:
    return ReferenceProvider(target, options)
