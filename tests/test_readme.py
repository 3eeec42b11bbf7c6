"""The README a newcomer reads first, and the documents it points at.

The first screen says what porter is and gives the two commands; the sections
a newcomer needs next come in the order they need them; every link of the
README and of docs/ resolves inside the repository (a design document the
reader is pointed at must exist here, not on someone's machine)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

# The order a newcomer needs them in: try it, understand it, make it real, make it theirs, leave it
# running, review it. Other helpers add paragraphs under these headings, so they are fixed words.
NEWCOMER_SECTIONS = [
    "Try it",
    "What just happened",
    "With a GPU",
    "With a real model (Anthropic, OpenAI, a local server)",
    "Your own engine",
    "Unattended use",
    "Reviewing",
]

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _sections(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^## (.+)$", _FENCE.sub("", text), re.M)]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"[`*_]", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    text = _FENCE.sub("", md.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(md: Path) -> list[str]:
    """Every relative link of `md` whose file (or #anchor in it) does not exist."""
    bad = []
    for target in _LINK.findall(_FENCE.sub("", md.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: outside the repository
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists() or REPO not in dest.parents and dest != REPO:
            bad.append(f"{md.name}: {target} (no such file in the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{md.name}: {target} (no heading with that anchor)")
    return bad


def test_the_newcomers_sections_come_first_and_in_order():
    sections = _sections(README.read_text())
    assert sections[: len(NEWCOMER_SECTIONS)] == NEWCOMER_SECTIONS, sections


def test_the_first_screen_says_what_porter_is_and_gives_the_two_commands():
    text = README.read_text()
    first = text[: text.index("## What just happened")]
    assert "ports a Metal GPU backend to CUDA" in first
    assert "porter init" in first and "porter -C /tmp/porter-demo status" in first
    assert len(first.splitlines()) <= 60, "the commands must be on the first screen"


def _commands(text: str, starts: str) -> list[list[str]]:
    """Each command of `text` (lines, and the parts of a line joined by && or ||) that starts with `starts`."""
    out = []
    for line in text.splitlines():
        for part in re.split(r"&&|\|\|", line):
            part = part.strip()
            if part.startswith(starts):
                out.append(shlex.split(part))
    return out


def test_the_readme_test_command_is_exactly_what_ci_runs():
    """The install too: CI installs the ray extra (its executor's tests run there), and so does the README."""
    ci = (REPO / ".ci" / "run").read_text()
    text = README.read_text()
    block = text[text.index("## Try it"): text.index("## What just happened")]
    for starts in ("python3 -m pytest", "python3 -m pip install"):
        ci_cmd = _commands(ci, starts)[-1]
        assert ci_cmd in _commands(block, starts), (ci_cmd, _commands(block, starts))


def test_every_link_of_the_readme_and_docs_resolves_in_the_repository():
    docs = [README, *sorted((REPO / "docs").glob("*.md"))]
    bad = [b for md in docs for b in broken_links(md)]
    assert not bad, "\n".join(bad)


def test_the_link_check_catches_a_missing_file_and_a_missing_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# There\n\n## Exit codes\n")
    md = tmp_path / "README.md"
    md.write_text("[a](docs/there.md#exit-codes) [b](docs/gone.md) [c](docs/there.md#nowhere) "
                  "[d](https://example.org/x) ![e](docs/shot.png)\n```\n[f](in/a/fence.md)\n```\n")
    assert broken_links(md) == ["README.md: docs/gone.md (no such file in the repository)",
                                "README.md: docs/there.md#nowhere (no heading with that anchor)",
                                "README.md: docs/shot.png (no such file in the repository)"]


def test_the_readme_is_a_guide_not_a_development_log():
    """Internals, measurement history and the security claim tables live in docs/: the README links them."""
    text = README.read_text()
    # the budget is the prose's: a collapsed data table (<details>, e.g. ds4's per-op roofline shares) is not read
    prose = re.sub(r"<details>.*?</details>", "", text, flags=re.S)
    assert len(prose.splitlines()) <= 400, len(prose.splitlines())
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dated measurements belong in docs/benchmarks.md"
    for doc in ("docs/security.md", "docs/DESIGN.md", "docs/adding-a-target.md", "docs/benchmarks.md"):
        assert f"]({doc}" in text, doc
