"""A self-contained SVG of the gate's intervals against the tolerance band.

Rendered server-side with no plotting library: one row per metric, the relative
difference d (in %) with its bootstrap interval, the +/- tolerance band shaded.
"""

from __future__ import annotations

from html import escape

from jobs.gate.decision import GateResult

_COLOURS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "INCONCLUSIVE": "#9a6700"}


def intervals_svg(result: GateResult, width: int = 640) -> str:
    rows = [m for m in result.metrics]
    row_h, top, left, right = 34, 40, 130, 20
    height = top + row_h * max(1, len(rows)) + 30
    t = result.tolerance
    spans = [abs(v) for m in rows if m.bootstrap for v in (m.bootstrap.ci_low, m.bootstrap.ci_high)]
    limit = max([3 * t, *spans]) * 1.1 or 0.01
    plot_w = width - left - right

    def x(v: float) -> float:
        return left + (v + limit) / (2 * limit) * plot_w

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f"<title>Quality gate: {escape(str(result.verdict))} ({escape(str(result.mode))})</title>",
        f'<text x="{left}" y="18" font-weight="bold">{escape(str(result.verdict))} - '
        f"{escape(str(result.mode))}, tolerance {t:.2%}, {result.confidence:.0%} intervals</text>",
        f'<rect x="{x(-t):.1f}" y="{top - 8}" width="{x(t) - x(-t):.1f}" '
        f'height="{row_h * max(1, len(rows))}" fill="#ddf4ff" class="tolerance-band"/>',
        f'<line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="{top - 8}" '
        f'y2="{top - 8 + row_h * max(1, len(rows))}" stroke="#888" stroke-dasharray="3,3"/>',
    ]
    for i, m in enumerate(rows):
        y = top + i * row_h + 8
        colour = _COLOURS.get(str(m.verdict), "#000")
        parts.append(f'<text x="8" y="{y + 4}">{escape(m.metric)}</text>')
        if m.bootstrap is None:
            parts.append(f'<text x="{left}" y="{y + 4}" fill="{colour}">missing</text>')
            continue
        b = m.bootstrap
        parts.append(
            f'<line x1="{x(b.ci_low):.1f}" x2="{x(b.ci_high):.1f}" y1="{y}" y2="{y}" '
            f'stroke="{colour}" stroke-width="3" class="interval"/>'
            f'<circle cx="{x(b.d):.1f}" cy="{y}" r="4" fill="{colour}"/>'
            f'<text x="{width - right}" y="{y - 6}" text-anchor="end" fill="{colour}">'
            f"d={b.d:+.3%} [{b.ci_low:+.3%}, {b.ci_high:+.3%}] {escape(str(m.verdict))}</text>"
        )
    axis_y = top + row_h * max(1, len(rows))
    for v in (-limit, -t, 0.0, t, limit):
        parts.append(
            f'<text x="{x(v):.1f}" y="{axis_y + 14}" text-anchor="middle" fill="#555">'
            f"{v:+.2%}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)
