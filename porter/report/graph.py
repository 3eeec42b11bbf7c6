"""The critical-path graph as static SVG: engine entry points -> API functions -> Metal kernels.

Three columns, no layout engine: units in plan order (so the graph reads top to
bottom in the order porter ports them), kernels in the order their first unit
comes, entry points beside the units they reach. Unit boxes carry their state's
colour and link to their page; the SVG needs no script.
"""

from __future__ import annotations

from html import escape

STATE_COLOURS = {
    "verified": "#1a7f37", "built": "#d0d7de", "stale": "#d4a72c", "tampered": "#cf222e",
    "failing": "#e16f24", "exhausted": "#8250df", "unported": "#8c959f",
}
ROW = 24
BOX_H = 18
COL_X = (10, 250, 670)
COL_W = (200, 370, 330)


def _box(x: int, y: int, w: int, text: str, fill: str, href: str | None = None, title: str | None = None,
         text_fill: str = "#fff") -> str:
    label = text if len(text) * 7 <= w - 8 else text[: max(1, (w - 8) // 7 - 1)] + "…"
    inner = (f'<rect x="{x}" y="{y}" width="{w}" height="{BOX_H}" rx="4" fill="{fill}"/>'
             f'<text x="{x + 6}" y="{y + 13}" fill="{text_fill}">{escape(label)}</text>'
             + (f"<title>{escape(title)}</title>" if title else ""))
    if href:
        return f'<a href="{escape(href)}">{inner}</a>'
    return f"<g>{inner}</g>"


def _edge(x1: float, y1: float, x2: float, y2: float, colour: str) -> str:
    mx = (x1 + x2) / 2
    return (f'<path d="M{x1},{y1} C{mx},{y1} {mx},{y2} {x2},{y2}" fill="none" stroke="{colour}" '
            f'stroke-opacity="0.55" stroke-width="1.2"/>')


def critical_path_svg(units, entries: dict[str, list[str]], link=lambda unit: None) -> str:
    """units: objects with .unit, .state, .tier, .path, .kernels, in plan order; only those reached
    from an entry point (a non-empty path) or on a critical tier are drawn."""
    drawn = [u for u in units if u.path or u.tier in ("runtime", "prefill")]
    kernels: list[str] = []
    for u in drawn:
        for k in u.kernels:
            if k not in kernels:
                kernels.append(k)
    entry_names = []
    for phase in ("prefill", "decode"):
        for e in entries.get(phase, []):
            if e not in entry_names:
                entry_names.append(e)
    for u in drawn:
        if u.path and u.path[0] not in entry_names:
            entry_names.append(u.path[0])

    top = 40
    unit_y = {u.unit: top + i * ROW for i, u in enumerate(drawn)}
    kernel_y = {k: top + i * ROW for i, k in enumerate(kernels)}
    span = max(len(drawn), len(kernels), 1) * ROW
    step = span / max(len(entry_names), 1)
    entry_y = {e: top + int(step * i + step / 2 - BOX_H / 2) for i, e in enumerate(entry_names)}
    height = top + span + 20
    width = COL_X[2] + COL_W[2] + 10

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="cp-graph" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="12" role="img" '
             f'aria-label="critical-path graph">',
             f'<text x="{COL_X[0]}" y="20" font-weight="bold">engine entry points</text>',
             f'<text x="{COL_X[1]}" y="20" font-weight="bold">API functions (units), by state</text>',
             f'<text x="{COL_X[2]}" y="20" font-weight="bold">Metal kernels they dispatch</text>']
    for u in drawn:
        y = unit_y[u.unit] + BOX_H / 2
        colour = STATE_COLOURS.get(u.state, "#57606a")
        sources = [u.path[0]] if u.path else []
        for phase in getattr(u, "phases", []):  # a unit reached from decode too hangs off that entry as well
            sources += [e for e in entries.get(phase, [])[:1] if e not in sources]
        for e in sources:
            parts.append(_edge(COL_X[0] + COL_W[0], entry_y[e] + BOX_H / 2, COL_X[1], y, "#57606a"))
        for k in u.kernels:
            parts.append(_edge(COL_X[1] + COL_W[1], y, COL_X[2], kernel_y[k] + BOX_H / 2, colour))
    for e, y in entry_y.items():
        parts.append(_box(COL_X[0], y, COL_W[0], e, "#24292f"))
    for u in drawn:
        parts.append(_box(COL_X[1], unit_y[u.unit], COL_W[1], f"{u.unit} [{u.state}]",
                          STATE_COLOURS.get(u.state, "#57606a"), link(u.unit),
                          f"{u.unit}: {u.state} ({u.tier or 'unranked'})"
                          + (f"; {' -> '.join(u.path)}" if u.path else "")))
    for k, y in kernel_y.items():
        parts.append(_box(COL_X[2], y, COL_W[2], k, "#eaeef2", text_fill="#24292f"))
    parts.append("</svg>")
    return "\n".join(parts)


def legend_html() -> str:
    return " ".join(f'<span class="chip" style="background:{c}">{escape(s)}</span>' for s, c in STATE_COLOURS.items())
