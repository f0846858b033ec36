"""A self-contained SVG of the gate's intervals against the tolerance band.

Rendered server-side with no plotting library: one row per metric, the relative
difference d (in %) with its bootstrap interval, the +/- tolerance band shaded.
"""

from __future__ import annotations

from html import escape

from embedfresh.ml.gate.decision import CurveResult, GateResult

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


def curve_svg(curve: CurveResult, width: int = 640, height: int = 260) -> str:
    """Parity along a training curve: max |d| over the metrics at each evaluation step,
    coloured by that step's verdict, against the tolerance band [0, t]."""
    left, right, top, bottom = 70, 20, 36, 40
    t = curve.tolerance
    rows = []
    for p in curve.points:
        ds = [abs(m.bootstrap.d) for m in p.result.metrics if m.bootstrap is not None]
        rows.append((p.step, max(ds) if ds else None, str(p.result.verdict)))
    top_v = max([2 * t, *(v for _, v, _ in rows if v is not None)]) * 1.1 or 0.01
    steps = [s for s, _, _ in rows]
    lo, hi = min(steps), max(steps)
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(step: int) -> float:
        return left + (0.5 if hi == lo else (step - lo) / (hi - lo)) * plot_w

    def y(v: float) -> float:
        return top + plot_h - v / top_v * plot_h

    verdict = escape(str(curve.verdict))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f"<title>Parity gate: {verdict}</title>",
        f'<text x="{left}" y="18" font-weight="bold">{verdict} - parity, max |d| per '
        f"evaluation step, tolerance {t:.2%}</text>",
        f'<rect x="{left}" y="{y(t):.1f}" width="{plot_w}" height="{y(0) - y(t):.1f}" '
        f'fill="#ddf4ff" class="tolerance-band"/>',
        f'<line x1="{left}" x2="{left + plot_w}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
        f'stroke="#0969da" stroke-dasharray="4,3"/>',
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{y(0):.1f}" stroke="#888"/>',
        f'<line x1="{left}" x2="{left + plot_w}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#888"/>',
    ]
    drawn = [(s, v) for s, v, _ in rows if v is not None]
    if len(drawn) > 1:
        path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in drawn)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#555" class="curve"/>')
    for s, v, verdict_at in rows:
        colour = _COLOURS.get(verdict_at, "#000")
        if v is None:
            parts.append(f'<text x="{x(s):.1f}" y="{y(0) - 4:.1f}" fill="{colour}">?</text>')
            continue
        parts.append(
            f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="4" fill="{colour}" class="point">'
            f"<title>step {s}: max |d| = {v:.4%} ({escape(verdict_at)})</title></circle>"
        )
    for v in (0.0, t, top_v):
        parts.append(
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end" fill="#555">{v:.2%}</text>'
        )
    for s in sorted(set(steps)):
        parts.append(
            f'<text x="{x(s):.1f}" y="{y(0) + 16:.1f}" text-anchor="middle" fill="#555">{s}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle">step</text>'
    )
    parts.append("</svg>")
    return "\n".join(parts)
