"""The prompt: what a model needs to get one unit right, rendered with jinja2.

    build_prompt(target, unit, attempt, failures) -> PromptRequest

`system` holds the rules (templates/system.j2: the target's own from its [cuda.rules], porter.prompt.rules);
`prompt` (templates/unit.j2)
holds the exact signature and doc comment, the conventions header, the Metal
host dispatch and kernel slice, the block layouts of the quant types the unit
reads, committed units as style examples, and the trimmed diagnostics of
earlier failed attempts (verify-time seeds removed).

Size budget: the prompt is kept under `prompt_chars` characters ([provider]
prompt_chars in target.toml, default 60000).  When it is over, parts are cut
in this order until it fits, and the prompt lists what was cut:

  1. style examples (least similar first);
  2. older failures: first their diagnostics (summary kept), then the summaries;
  3. Metal helpers beyond the kernels themselves (largest first);
  4. the latest failure's diagnostics, shortened;
  5. the kernel slice and host dispatch, truncated at the end.

The rules, the signature and doc comment, the conventions header and the
block layouts are never cut.
"""

from __future__ import annotations

import copy
import hashlib
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from porter.diagnostics import own_by_name, trim_diagnostics
from porter.gates import registry
from porter.prompt.context import Failure, Section, UnitContext, gather
from porter.providers.base import PromptRequest

DEFAULT_PROMPT_CHARS = 60_000
DETAILED_FAILURES = 3  # the latest N failures keep their diagnostics; older ones are one line
LATEST_DIAG_CHARS = 4000
OLDER_DIAG_CHARS = 1500
TEMPLATES = Path(__file__).with_name("templates")

__all__ = ["build_prompt", "render_prompt", "RenderedPrompt", "DEFAULT_PROMPT_CHARS"]


@dataclass
class RenderedPrompt:
    request: PromptRequest
    cut: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    budget_chars: int = DEFAULT_PROMPT_CHARS
    quant_types: list[str] = field(default_factory=list)
    sections: dict = field(default_factory=dict)  # name -> count, for the ledger / --json


def _makes_library(gate: str) -> bool:
    """Whether a recorded gate is the one that compiles and links (its diagnostics quote the unit's files)."""
    g = registry.known(gate)
    return g is not None and g.role == registry.LIBRARY


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _wrap_rules(text: str, width: int = 84) -> str:
    """The system prompt's paragraphs and numbered rules refilled to `width` (a rule's text depends on the
    target's declarations, so the template cannot wrap it by hand)."""
    paras: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            paras.append("")
        elif re.match(r"\d+\. ", line) or not paras or not paras[-1]:
            paras.append(line.strip())
        else:
            paras[-1] += " " + line.strip()
    out = []
    for p in paras:
        indent = "   " if re.match(r"\d+\. ", p) else ""
        out.append(textwrap.fill(" ".join(p.split()), width, subsequent_indent=indent, break_long_words=False,
                                 break_on_hyphens=False) if p else "")
    return "\n".join(out).rstrip("\n") + "\n"


def _prompt_chars(target, override: int | None) -> int:
    if override:
        return int(override)
    try:
        from porter.providers.common import resolve_settings

        value = resolve_settings(target, {}).get("prompt_chars")
    except Exception:  # noqa: BLE001 - a bad provider table must not stop `porter prompt`
        value = None
    try:
        return int(value) if value else DEFAULT_PROMPT_CHARS
    except (TypeError, ValueError):
        return DEFAULT_PROMPT_CHARS


def _truncate(sec: Section, keep: int, why: str) -> Section:
    if len(sec.text) <= keep:
        return sec
    head = sec.text[: max(0, keep)]
    head = head[: head.rfind("\n")] if "\n" in head else head
    return Section(sec.title, f"{head}\n... ({len(sec.text) - len(head)} characters cut: {why})", sec.lang)


class _State:
    """The parts of a prompt that may be cut, and the renderer."""

    def __init__(self, ctx: UnitContext, budget: int):
        self.ctx = ctx
        self.budget = budget
        self.examples = list(ctx.examples)
        self.helpers = list(ctx.helpers)
        self.kernels = list(ctx.kernels)
        self.host = list(ctx.host_dispatch)
        fails = list(ctx.failures)
        # a build's diagnostics quote only the unit's own files (porter/diagnostics.py), here too
        own = own_by_name([f"{ctx.unit}.cu", ctx.conventions_name, ctx.api_header])
        self.detailed = [
            Failure(f.attempt, f.gate, f.summary,
                    trim_diagnostics(f.diagnostics, LATEST_DIAG_CHARS if i == 0 else OLDER_DIAG_CHARS,
                                     own=own if _makes_library(f.gate) else None, max_errors=None))
            for i, f in enumerate(reversed(fails[-DETAILED_FAILURES:]))
        ][::-1]  # oldest first, latest last
        self.brief = fails[:-DETAILED_FAILURES] if len(fails) > DETAILED_FAILURES else []
        self.cut: list[str] = []
        self.env = _env()

    def render(self) -> str:
        c = self.ctx
        return self.env.get_template("unit.j2").render(
            target=c.target, unit=c.unit, attempt=c.attempt, api_header=c.api_header, doc=c.doc,
            declaration=c.declaration, signature=c.signature, conventions_name=c.conventions_name,
            conventions=c.conventions, host_dispatch=self.host, kernels=self.kernels, helpers=self.helpers,
            layouts=c.layouts, examples=self.examples, failures=self.detailed, failures_brief=self.brief,
            missing=c.missing, cut=self.cut, budget_chars=self.budget,
        )

    def system(self) -> str:
        c = self.ctx
        return _wrap_rules(self.env.get_template("system.j2").render(
            target=c.target, conventions_name=c.conventions_name, api_header=c.api_header, rules=c.rules))

    # cut steps: each removes one thing and returns False when it has nothing left
    def steps(self):
        def drop_example():
            if not self.examples:
                return False
            gone = self.examples.pop()
            self.cut.append(f"style example {gone.title.split(' ')[0]}")
            return True

        def older_failure_diagnostics():
            for f in self.detailed[:-1]:
                if f.diagnostics:
                    f.diagnostics = ""
                    self.cut.append(f"diagnostics of attempt {f.attempt} (its summary is kept)")
                    return True
            return False

        def older_failure_summary():
            if self.brief:
                gone = self.brief.pop(0)
                self.cut.append(f"summary of attempt {gone.attempt}")
                return True
            if len(self.detailed) > 1:
                gone = self.detailed.pop(0)
                self.cut.append(f"summary of attempt {gone.attempt}")
                return True
            return False

        def drop_helper():
            if not self.helpers:
                return False
            i = max(range(len(self.helpers)), key=lambda k: len(self.helpers[k].text))
            gone = self.helpers.pop(i)
            self.cut.append(f"Metal helper {gone.title}")
            return True

        def shorten_latest(limit):
            def step():
                if not self.detailed or len(self.detailed[-1].diagnostics) <= limit:
                    return False
                f = self.detailed[-1]
                shorter = trim_diagnostics(f.diagnostics, limit)
                if len(shorter) >= len(f.diagnostics):
                    return False
                f.diagnostics = shorter
                self.cut.append(f"diagnostics of attempt {f.attempt} shortened to {limit} characters")
                return True
            return step

        def truncate_largest(attr, label):
            def step():
                secs = getattr(self, attr)
                if not secs:
                    return False
                over = len(self.render()) - self.budget
                i = max(range(len(secs)), key=lambda k: len(secs[k].text))
                cur = len(secs[i].text)
                new = _truncate(secs[i], max(400, cur - over - 200), "prompt size budget")
                if len(new.text) >= cur:
                    return False
                secs[i] = new
                note = f"{label} {new.title} truncated"
                if note not in self.cut:
                    self.cut.append(note)
                return True
            return step

        return [drop_example, older_failure_diagnostics, older_failure_summary, drop_helper,
                shorten_latest(1500), shorten_latest(500),
                truncate_largest("kernels", "Metal kernel"), truncate_largest("host", "host dispatch")]


def render_prompt(target, unit: str, attempt: int, failures: list | None = None,
                  max_chars: int | None = None) -> RenderedPrompt:
    """Build the prompt and say what went into it, what is missing and what was cut."""
    ctx = gather(target, unit, attempt, copy.deepcopy(failures or []))
    budget = _prompt_chars(target, max_chars)
    st = _State(ctx, budget)
    text = st.render()
    for step in st.steps():
        while len(text) > budget and step():
            text = st.render()
        if len(text) <= budget:
            break
    if len(text) > budget:
        st.cut.append(f"still {len(text) - budget} characters over: nothing else may be cut "
                      "(rules, signature, conventions, block layouts)")
        text = st.render()
    system = st.system()
    sections = {
        "host_dispatch": len(st.host), "kernels": len(st.kernels), "helpers": len(st.helpers),
        "layouts": [s.title for s in ctx.layouts], "examples": [s.title.split(" ")[0] for s in st.examples],
        "failures": len(st.detailed) + len(st.brief),
    }
    meta = {
        "builder": "porter.prompt",
        "chars": len(text),
        "budget_chars": budget,
        "cut": list(st.cut),
        "missing": list(ctx.missing),
        "quant_types": list(ctx.quant_types),
        "sections": sections,
        "template_sha256": _templates_sha(),
    }
    req = PromptRequest(target=target.name, unit=unit, attempt=attempt, system=system, prompt=text,
                        max_tokens=None, meta=meta)
    return RenderedPrompt(req, list(st.cut), list(ctx.missing), budget, list(ctx.quant_types), sections)


def build_prompt(target, unit: str, attempt: int, failures: list | None = None) -> PromptRequest:
    """The PromptRequest for `unit`'s attempt number `attempt` (1-based).

    `failures`: earlier failures of this unit, oldest first: porter.records.history's typed records, or
    dicts shaped like ledger lines with the diagnostics text under "diagnostics_text" (or
    "diagnostics" holding either the text or the sha256 of runs/diagnostics/<sha>.txt).  max_tokens is
    left None: the provider's settings decide it.
    """
    return render_prompt(target, unit, attempt, failures).request


def _templates_sha() -> str:
    h = hashlib.sha256()
    for p in sorted(TEMPLATES.glob("*.j2")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()
