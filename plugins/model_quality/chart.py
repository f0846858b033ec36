"""The evaluation-curve chart: server-side SVG, no plotting library, nothing fetched.

x: the evaluation points of the latest gate decision (training steps, or "final");
y: the relative difference d = (m_cand - m_ref) / m_ref in percent, one series per
metric, with its bootstrap interval as an error bar; the +/- tolerance band (0.1% by
default) is shaded, so a point whose interval leaves the band is visible at a glance.
"""

from __future__ import annotations

from html import escape
from typing import Any

PALETTE = ("#0969da", "#bf3989", "#1a7f37", "#9a6700", "#8250df", "#cf222e")
VERDICT_COLOURS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "INCONCLUSIVE": "#9a6700"}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def curve_chart(curve: dict[str, Any], width: int = 760, height: int = 320) -> str:
    """An SVG document for :func:`embedfresh.plugins.model_quality.reports.latest_curve`'s data."""
    points = curve.get("points") or []
    tol = _num(curve.get("tolerance")) or 0.001
    metrics = sorted({m["metric"] for p in points for m in p["metrics"] if m.get("metric")})
    values = [
        abs(v)
        for p in points
        for m in p["metrics"]
        for v in (_num(m.get("d")), _num(m.get("ci_low")), _num(m.get("ci_high")))
        if v is not None
    ]
    limit = max([3 * tol, *values]) * 1.1
    left, right, top, bottom = 70, 170, 40, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    slot = plot_w / max(1, len(points))

    def x(i: int, k: int) -> float:
        spread = slot * 0.5
        offset = 0.0 if len(metrics) < 2 else (k / (len(metrics) - 1) - 0.5) * spread
        return left + slot * (i + 0.5) + offset

    def y(v: float) -> float:
        return top + (limit - v) / (2 * limit) * plot_h

    verdict = str(curve.get("verdict"))
    title = (
        f"{escape(verdict)} - {escape(str(curve.get('mode')))}: candidate "
        f"{escape(str(curve.get('candidate')))} vs reference "
        f"{escape(str(curve.get('reference')))}"
    )
    band_h = max(y(-tol) - y(tol), 1.5)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12" '
        f'class="quality-chart" role="img" aria-label="{title}">',
        f"<title>{title}</title>",
        f'<text x="{left}" y="20" font-weight="bold" '
        f'fill="{VERDICT_COLOURS.get(verdict, "#000")}">{title}</text>',
        f'<rect x="{left}" y="{y(tol):.1f}" width="{plot_w}" height="{band_h:.1f}" '
        f'fill="#ddf4ff" stroke="#54aeff" stroke-dasharray="4,3" class="tolerance-band">'
        f"<title>tolerance band: |d| &lt; {tol:.2%}</title></rect>",
        f'<line x1="{left}" x2="{left + plot_w}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#888"/>',
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="#888"/>',
    ]
    drawn: list[float] = []
    for v in (0.0, -limit, limit, -tol, tol):
        if any(abs(y(v) - other) < 14 for other in drawn):
            continue  # the band is thin next to wide intervals: keep labels legible
        drawn.append(y(v))
        parts.append(
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end" fill="#555">{v:+.2%}</text>'
        )
    for i, p in enumerate(points):
        parts.append(
            f'<text x="{left + slot * (i + 0.5):.1f}" y="{top + plot_h + 16}" '
            f'text-anchor="middle" fill="#555">{escape(str(p.get("step")))}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle">'
        "evaluation point</text>"
        f'<text x="14" y="{top + plot_h / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">d (candidate vs reference)</text>'
    )
    for k, name in enumerate(metrics):
        colour = PALETTE[k % len(PALETTE)]
        line = []
        for i, p in enumerate(points):
            m = next((m for m in p["metrics"] if m.get("metric") == name), None)
            d = _num(m.get("d")) if m else None
            if d is None:
                continue
            lo, hi = _num(m.get("ci_low")), _num(m.get("ci_high"))
            cx = x(i, k)
            line.append(f"{cx:.1f},{y(d):.1f}")
            if lo is not None and hi is not None:
                parts.append(
                    f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(hi):.1f}" y2="{y(lo):.1f}" '
                    f'stroke="{colour}" stroke-width="2" class="interval"/>'
                )
            interval = f" [{lo:+.3%}, {hi:+.3%}]" if lo is not None and hi is not None else ""
            parts.append(
                f'<circle cx="{cx:.1f}" cy="{y(d):.1f}" r="4" fill="{colour}" class="point">'
                f"<title>{escape(name)} at {escape(str(p.get('step')))}: d = {d:+.3%}"
                f"{interval} ({escape(str(m.get('verdict')))})</title></circle>"
            )
        if len(line) > 1:
            parts.append(
                f'<polyline points="{" ".join(line)}" fill="none" stroke="{colour}" class="curve"/>'
            )
        ly = top + 14 + 18 * k
        parts.append(
            f'<rect x="{left + plot_w + 16}" y="{ly - 9}" width="10" height="10" '
            f'fill="{colour}"/><text x="{left + plot_w + 32}" y="{ly}">{escape(name)}</text>'
        )
    ly = top + 14 + 18 * len(metrics)
    parts.append(
        f'<rect x="{left + plot_w + 16}" y="{ly - 9}" width="10" height="10" fill="#ddf4ff" '
        f'stroke="#54aeff"/><text x="{left + plot_w + 32}" y="{ly}">+/-{tol:.1%} tolerance</text>'
    )
    if not points:
        parts.append(f'<text x="{left + 10}" y="{y(0) - 8:.1f}">no evaluation points</text>')
    parts.append("</svg>")
    return "\n".join(parts)
