"""The scripted provider: replays recorded answers, so the whole loop runs without a model.

targets/<t>/scripted/manifest.toml lists `[[answer]]` tables (unit, file,
expect, why).  The n-th scripted attempt of a unit, counted across runs from
the ledger's "attempt" records of that unit (attempts a crash abandoned, as
named by "reconcile" records, do not count, so they are replayed), gets the
unit's n-th answer in file order (porter.records.history counts them).  When none is
left: ProviderError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from porter.gates import registry
from porter.records.history import History
from porter.providers.base import Completion, PromptRequest, Provider, ProviderError
from porter.tomlfile import read_toml



@dataclass(frozen=True)
class Answer:
    unit: str
    file: str
    expect: str
    why: str
    index: int  # position among this unit's answers


def load_manifest(target) -> list[Answer]:
    path = Path(target.scripted_dir) / "manifest.toml"
    raw = read_toml(path, error=ProviderError, why_needed=f"no scripted answers for target {target.name}")
    entries = raw.get("answer", [])
    if not isinstance(entries, list):
        raise ProviderError(f"malformed {path}: `answer` must be an array of tables ([[answer]])")
    known = set(target.units)
    out: list[Answer] = []
    counts: dict[str, int] = {}
    for i, e in enumerate(entries, 1):
        where = f"{path} answer #{i}"
        if not isinstance(e, dict) or not isinstance(e.get("unit"), str) or not isinstance(e.get("file"), str):
            raise ProviderError(f"malformed {where}: needs unit = \"...\" and file = \"...\"")
        if e["unit"] not in known:
            raise ProviderError(f"malformed {where}: unknown unit {e['unit']!r}")
        expect = e.get("expect", "pass")
        expects = ("pass", *registry.names(registry.ANSWER, registry.UNIT))  # passes, or the gate refusing it
        if expect not in expects:
            raise ProviderError(f"malformed {where}: expect must be one of {', '.join(expects)}, not {expect!r}")
        if not (path.parent / e["file"]).is_file():
            raise ProviderError(f"malformed {where}: {e['file']} does not exist")
        n = counts.get(e["unit"], 0)
        counts[e["unit"]] = n + 1
        out.append(Answer(e["unit"], e["file"], expect, str(e.get("why", "")), n))
    return out


class ScriptedProvider(Provider):
    name = "scripted"
    model = "manifest"

    def __init__(self, target, options: dict | None = None):
        self.target = target
        self.answers = load_manifest(target)

    def answers_for(self, unit: str) -> list[Answer]:
        return [a for a in self.answers if a.unit == unit]

    def next_answer(self, unit: str) -> Answer:
        mine = self.answers_for(unit)
        if not mine:
            raise ProviderError(f"no scripted answers for {unit} in {self.target.scripted_dir / 'manifest.toml'}")
        used = History.read(self.target.workspace, self.target.name).unit(unit).answers_used(self.name)
        if used >= len(mine):
            raise ProviderError(f"scripted answers for {unit} exhausted ({len(mine)} answer(s), all used)")
        return mine[used]

    def complete(self, req: PromptRequest) -> Completion:
        a = self.next_answer(req.unit)
        text = (Path(self.target.scripted_dir) / a.file).read_text()
        usage = {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "calls": 0}
        return Completion(text=text, provider=self.name, model=f"scripted:{a.file}", usage=usage)


def make(target, options: dict | None = None) -> ScriptedProvider:
    return ScriptedProvider(target, options)
