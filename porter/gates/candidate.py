"""What a candidate's route carries: the provider's Answer (text and Provenance), and the typed
Candidate extraction makes of it (porter.gates.driver.extract_candidate) before any unit gate runs.

A leaf of the gates layer: the answer gates build a Candidate, the driver and every gate read one,
and none of them needs the driver to do it.
"""

from __future__ import annotations

from dataclasses import dataclass

from porter.digest import sha256_file, sha256_text


@dataclass(frozen=True)
class Provenance:
    """Where an answer (and the candidate extracted from it) came from: what the attempt record says."""

    provider: str
    model: str
    prompt_sha256: str
    response_sha256: str
    attempt: int


@dataclass(frozen=True)
class Answer:
    """A provider's answer for one unit: text nobody has judged yet, and where it came from."""

    unit: str
    text: str
    provenance: Provenance | None = None

    @property
    def sha256(self) -> str:
        return sha256_text(self.text)


@dataclass(frozen=True)
class Candidate:
    """What the unit gates judge: one unit's code (or, with source "", a prebuilt library or the whole
    backend named by its hash).  `provenance`: the answer it was extracted from; None for a committed
    unit file, a library or the backend."""

    unit: str
    source: str
    sha256: str
    provenance: Provenance | None = None

    @classmethod
    def of(cls, unit: str, source: str, provenance: Provenance | None = None) -> "Candidate":
        return cls(unit, source, sha256_text(source), provenance)

    @classmethod
    def library(cls, unit: str, path) -> "Candidate":
        """A prebuilt library holding `unit` (calibration's known-good, one of its mutants): the gates
        judging output load it (GateContext.library); it has no source of its own to judge."""
        return cls(unit, "", sha256_file(path))

    @classmethod
    def backend(cls, name: str, tree: str | None) -> "Candidate":
        """The whole backend (`name`: the unit e2e evidence is about), named by the hash of the tree its
        library is linked from ("" where the tree is unknown)."""
        return cls(name, "", tree or "")
