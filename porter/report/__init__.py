"""`porter report [--out DIR]`: the reviewer's view as a static HTML site (no server, no script).

collect (what to show, read through status/audit/history) -> render (jinja2 +
Pygments) -> pages: index.html (overview), graph.html (critical-path graph),
units/<unit>.html (one per unit), style.css.
"""

from __future__ import annotations

from pathlib import Path

from porter.errors import PorterError

DEFAULT_OUT = "runs/report"


def build(workspace: Path, target: str | None = None, out: Path | None = None, source=None) -> Path:
    """Write the site; return its index.html."""
    from porter.report.collect import collect
    from porter.report.links import broken_links
    from porter.report.render import write_site

    workspace = Path(workspace).resolve()
    out = Path(out) if out is not None else workspace / DEFAULT_OUT
    if out.exists() and not out.is_dir():
        raise PorterError(f"--out {out} exists and is not a directory")
    site = collect(workspace, target, source)
    write_site(site, out)
    broken = broken_links(out)
    if broken:  # a bug of ours, not of the workspace: say where
        raise PorterError(f"the report written to {out} has {len(broken)} broken link(s), first: {broken[0]}")
    return out / "index.html"


def add_arguments(parser) -> None:
    parser.add_argument("--out", metavar="DIR",
                        help=f"where to write the site (default: <workspace>/{DEFAULT_OUT}, ignored by git)")


def run(args) -> int:
    workspace = Path(getattr(args, "workspace", None) or Path.cwd())
    out = getattr(args, "out", None)
    index = build(workspace, getattr(args, "target", None), Path(out).resolve() if out else None,
                  getattr(args, "source", None))
    print(f"report: {index} (open it in a browser; no server needed)")
    return 0
