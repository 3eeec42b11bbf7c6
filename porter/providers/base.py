"""The provider interface: one small request/answer shape, providers behind it.

A provider turns a PromptRequest into a Completion (text).  It never sees the
workspace, never writes files and never touches the ledger: the loop saves the
prompt and the answer, extracts the candidate and runs the gates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from porter.errors import PorterError


class ProviderError(PorterError):
    """The provider could not answer (no key, network, exhausted script...)."""


@dataclass
class PromptRequest:
    target: str  # target name
    unit: str  # API function to port
    attempt: int  # 1-based attempt number of this unit, counted across runs
    system: str
    prompt: str
    max_tokens: int | None = None
    meta: dict = field(default_factory=dict)  # how the prompt was built (builder name, sections), for the ledger


@dataclass
class Completion:
    text: str
    provider: str
    model: str
    usage: dict = field(default_factory=dict)  # input_tokens, output_tokens, cost_usd (None when unpriced)


class Provider:
    name = "?"
    model: str | None = None

    def complete(self, req: PromptRequest) -> Completion:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name} model {self.model}" if self.model else self.name
