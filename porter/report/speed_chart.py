"""The report's throughput chart: per phase, upstream's tokens/s and the port's as two bars on one scale,
with upstream's own run-to-run margin drawn around its bar's end, so "0.95x, within the margin" is seen,
not read.  Plain SVG, no script (the report is static files)."""

from __future__ import annotations

from html import escape

BAR_W, BAR_H, LABEL_W, ROW_GAP = 360, 16, 150, 10
OK, SLOW, UPSTREAM = "#1a7f37", "#cf222e", "#8c959f"


def throughput_svg(state: dict | None) -> str:
    """An SVG of status's throughput state (porter.gates.e2e.throughput_state.throughput_state); "" when
    nothing was measured (the summary line already says why)."""
    if not state or state.get("state") == "unmeasured" or not state.get("phases"):
        return ""
    phases = state["phases"]
    top = max(max(p["upstream_tps"], p["tps"]) * (1 + (p.get("margin") or 0)) for p in phases.values()) or 1.0
    scale = BAR_W / top
    rows, y = [], 4
    for phase, p in phases.items():
        up_w, port_w = p["upstream_tps"] * scale, p["tps"] * scale
        lo = p["upstream_tps"] * (1 - (p.get("margin") or 0)) * scale
        hi = p["upstream_tps"] * (1 + (p.get("margin") or 0)) * scale
        colour = OK if p["ok"] else SLOW
        rows.append(
            f'<text x="0" y="{y + BAR_H - 3}">{escape(phase)} upstream</text>'
            f'<rect x="{LABEL_W}" y="{y}" width="{up_w:.1f}" height="{BAR_H}" fill="{UPSTREAM}">'
            f'<title>upstream {p["upstream_tps"]:.1f} t/s</title></rect>'
            f'<rect x="{LABEL_W + lo:.1f}" y="{y - 2}" width="{max(hi - lo, 1):.1f}" height="{2 * BAR_H + 6}" '
            f'fill="{UPSTREAM}" fill-opacity="0.18"><title>A/A margin {p.get("margin") or 0:.1%}</title></rect>'
            f'<text x="{LABEL_W + up_w + 4:.1f}" y="{y + BAR_H - 3}">{p["upstream_tps"]:.1f} t/s</text>')
        y += BAR_H + 2
        rows.append(
            f'<text x="0" y="{y + BAR_H - 3}">{escape(phase)} port</text>'
            f'<rect x="{LABEL_W}" y="{y}" width="{port_w:.1f}" height="{BAR_H}" fill="{colour}">'
            f'<title>port {p["tps"]:.1f} t/s, {p["ratio"]:.2f}x upstream, p={p.get("p_value") or 0:.3f}</title></rect>'
            f'<text x="{LABEL_W + port_w + 4:.1f}" y="{y + BAR_H - 3}">{p["tps"]:.1f} t/s ({p["ratio"]:.2f}x, '
            f'{"fast" if p["ok"] else "SLOW"})</text>')
        y += BAR_H + ROW_GAP
    width = LABEL_W + BAR_W + 170
    return (f'<svg class="throughput" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" '
            f'font-family="sans-serif" font-size="12" role="img" aria-label="tokens per second, port against '
            f'upstream">{"".join(rows)}</svg>')
