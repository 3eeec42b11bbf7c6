"""Every href and src in a written site must name a file of the site (and an id in it, for #anchors).

`porter report` runs this on what it wrote, so a template that links a page it
never writes is caught where it is made, not by a reviewer's 404.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("href", "src") and v is not None:
                self.refs.append(v)
            elif k == "id" and v:
                self.ids.add(v)


def _parse(path: Path) -> _Refs:
    p = _Refs()
    p.feed(path.read_text(errors="replace"))
    return p


def broken_links(site: Path) -> list[str]:
    """'page: ref (why)' for every local link that does not resolve; external URLs are not allowed either."""
    site = Path(site).resolve()
    parsed = {page: _parse(page) for page in site.rglob("*.html")}
    out = []
    for page, p in sorted(parsed.items()):
        rel_page = page.relative_to(site).as_posix()
        for ref in p.refs:
            u = urlsplit(ref)
            if u.scheme or u.netloc:
                out.append(f"{rel_page}: {ref} (the report must open offline: no external link)")
                continue
            target = (page.parent / unquote(u.path)).resolve() if u.path else page
            if not target.is_relative_to(site) or not target.is_file():
                out.append(f"{rel_page}: {ref} (no such file in the site)")
            elif u.fragment and u.fragment not in parsed.get(target, _Refs()).ids:
                out.append(f"{rel_page}: {ref} (no id {u.fragment!r} in {target.relative_to(site).as_posix()})")
    return out
