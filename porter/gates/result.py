"""What every gate returns; the ledger stores `evidence` content-addressed."""

from __future__ import annotations

from dataclasses import dataclass, field

from porter.gates import registry


@dataclass
class GateResult:
    gate: str  # a gate of porter.gates.registry
    ok: bool
    summary: str  # one line, for status/audit and the next prompt
    diagnostics: str = ""  # longer text (compiler output, mismatch table), trimmed for prompts
    metrics: dict = field(default_factory=dict)  # numbers worth keeping (errors, timings, GB/s)
    evidence: dict = field(default_factory=dict)  # the facts the verdict rests on (toolchain, sha256s, seeds, shapes)
    skipped: bool = False  # the gate could not run here (e.g. no GPU): never counts as ok
    check: str | None = None  # the check that refused it (parity: compare.CHECK_ORDER; build: its stage)

    def __post_init__(self) -> None:
        if self.gate not in registry.names():
            raise ValueError(f"unknown gate {self.gate!r}")
        if self.skipped and self.ok:
            raise ValueError("a skipped gate cannot be ok")

    @property
    def word(self) -> str:
        """The verdict as one word: 'pass', 'skipped', or the check that refused it."""
        return "skipped" if self.skipped else "pass" if self.ok else (self.check or "fail")
