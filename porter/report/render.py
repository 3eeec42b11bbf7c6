"""Pages from SiteData: jinja2 templates, Pygments for source and diffs, one stylesheet."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name

from porter.report.collect import SiteData, UnitPage, unit_page_name
from porter.gates import registry
from porter.gates.evidence import ParityEvidence, PerfEvidence, evidence_of
from porter.gates.perf import speed, speed_line
from porter.report.graph import critical_path_svg, legend_html
from porter.report.speed_chart import throughput_svg
from porter.commands.status import CRITICAL_TIERS, STATES, counts_line, speedups_line, state_label

TEMPLATES = Path(__file__).parent / "templates"
_FORMATTER = HtmlFormatter(linenos="table", cssclass="code", wrapcode=True)
# Metal Shading Language is C++14 with attributes; Pygments has no Metal lexer, C++ reads it well.
LEXERS = {"host": "objective-c", "kernels": "cpp", "cuda": "cuda", "diff": "diff"}


def code_html(text: str | None, lexer: str) -> Markup | None:
    if not text:
        return None
    return Markup(highlight(text, get_lexer_by_name(lexer), _FORMATTER))


def fmt_metrics(metrics) -> str:
    if not isinstance(metrics, dict):
        return str(metrics)
    out = []
    for k, v in metrics.items():
        if isinstance(v, float):
            v = f"{v:.3g}"
        elif isinstance(v, dict):
            v = "{" + fmt_metrics(v) + "}"
        out.append(f"{k}={v}")
    return ", ".join(out)


def case_metrics(case: dict) -> str:
    """One parity case's metrics, per pass and output: 'seed 1: out nmse=1e-9 max_abs=...'."""
    parts = []
    for i, p in enumerate(case.get("passes") or [], 1):
        ms = p.get("metrics") if isinstance(p, dict) else None
        if isinstance(ms, dict) and ms:
            parts.append(f"pass {i}: " + "; ".join(f"{name} {fmt_metrics(m)}" for name, m in ms.items()))
    return " | ".join(parts) or fmt_metrics({k: v for k, v in case.items() if k not in ("label", "passes", "timing")})


def perf_of(u: UnitPage) -> dict | None:
    """The latest step's timing (parity evidence) and its comparison with the known-good (perf evidence)."""
    output = registry.names(registry.UNIT, role=registry.OUTPUT)  # parity: it times the calls it checks
    timed = registry.names(registry.UNIT, role=registry.SPEED)  # perf
    perf: dict = {}
    readable = [evidence_of(e["data"]) for e in u.evidence if not e["problem"]]  # collect checked each
    for d in readable:
        if d.gate in output and isinstance(d, ParityEvidence) and d.timing is not None:
            perf.update(d.timing.dump())
        if d.gate in timed and isinstance(d, PerfEvidence):
            perf.update({"ratio": d.ratio, "baseline_ms": d.baseline.median_ms if d.baseline else None,
                         "max_slowdown": d.limit or d.max_slowdown, "limit_basis": d.limit_basis})
    s = speed(readable)
    if s:
        perf.update(regime=s.get("regime"), pct_roofline=s.get("pct_roofline"), below_half=s.get("below_half"))
    if perf and not perf.get("ratio"):
        gates = [g for a in u.audit["attempts"] for g in a["gates"] if g.get("gate") in timed]
        if gates:
            perf["perf_summary"] = gates[-1].get("summary")
    return perf or None


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["j2", "html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.globals.update(counts_line=counts_line, label=state_label, states=STATES, critical_tiers=CRITICAL_TIERS,
                       fmt_metrics=fmt_metrics, case_metrics=case_metrics, speed_line=speed_line,
                       speedups_line=speedups_line)
    return env


def stylesheet() -> str:
    return (TEMPLATES / "style.css").read_text() + "\n/* Pygments */\n" + _FORMATTER.get_style_defs(".code")


def write_site(site: SiteData, out: Path) -> list[Path]:
    """Write index.html, graph.html, units/<unit>.html and style.css under `out`; return the pages."""
    out = Path(out)
    (out / "units").mkdir(parents=True, exist_ok=True)
    env = _env()
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    common = {"site": site, "generated": generated}
    pages: list[Path] = []

    def put(rel: str, template: str, **kw) -> None:
        root = "../" * rel.count("/")
        path = out / rel
        path.write_text(env.get_template(template).render(root=root, **common, **kw))
        pages.append(path)

    (out / "style.css").write_text(stylesheet())
    put("index.html", "index.html.j2", speed_chart=Markup(throughput_svg(site.status.throughput)))
    svg = critical_path_svg(site.units, site.entries, link=unit_page_name)
    put("graph.html", "graph.html.j2", svg=Markup(svg), legend=Markup(legend_html()))
    for u in site.units:
        a = u.audit
        code = {"host": code_html(a["metal"]["host"]["text"], LEXERS["host"]),
                "kernels": code_html(a["metal"]["kernels"]["text"], LEXERS["kernels"]),
                "cuda": code_html(a["cuda"]["text"], LEXERS["cuda"]),
                "diff": code_html((a["commit"] or {}).get("diff"), LEXERS["diff"])}
        put(unit_page_name(u.unit), "unit.html.j2", u=u, code=code, perf=perf_of(u))
    return pages
