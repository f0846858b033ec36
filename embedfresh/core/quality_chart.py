"""Vega-Lite charts of the quality gate, built with altair and rendered to SVG by vl-convert.

One builder for both readers: the gate job writes :func:`gate_chart_spec` of its decision
beside ``gate.json`` (``reports/gate.vl.json``, :func:`embedfresh.core.layout.gate_chart`),
and the "Model quality" page renders that spec, or builds it from ``gate.json`` for
runs older than the chart file. Rendering is offline (vl-convert bundles Vega, Vega-Lite
and its fonts): the page runs in Airflow's sandboxed iframe, so it shows SVG, no script.

Rules every chart follows:

- **Improvement-signed**: y is g = d for higher-is-better metrics and g = -d for the
  others (log-loss), so above zero is better than the reference for every metric, as
  the gate itself judges ``no_regression`` (:mod:`embedfresh.ml.gate.decision`).
- **The SLA as the gate reads it**: ``no_regression`` is one-sided, drawn as a dashed
  rule at -t (improvements pass); ``parity`` is two-sided, drawn as the band (-t, +t).
- **An axis that keeps the SLA visible**: a symlog scale whose linear part is
  [-t, +t] (``constant`` = t), so the 0.1% SLA keeps a readable height when intervals
  reach +/-10%; ticks at 0, +/-t and powers of ten times t.
- **Verdict colours mean one thing**: PASS green, FAIL red, INCONCLUSIVE amber, for
  points and intervals; series (metrics in the history chart) take blues, purples and
  greys only.

Nothing here imports torch or numpy; altair and vl-convert are imported inside the
functions (the plugin module that uses this is loaded by every Airflow component).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

VERDICT_COLOURS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "INCONCLUSIVE": "#9a6700"}
#: Series colours: no green, red or amber, so a series never reads as a verdict.
SERIES_COLOURS = ("#0969da", "#8250df", "#57606a", "#bf3989", "#0a3069", "#a475f9")
#: Metrics where lower is better, for reports that predate ``higher_is_better``.
LOWER_IS_BETTER = frozenset({"log_loss"})
LABELS = {"recall_at_10": "recall@10", "log_loss": "log-loss", "auc": "AUC"}
DEFAULT_TOLERANCE = 0.001
WIDTH = 560
#: The name of the rows' data set in every spec (its top-level ``datasets``).
DATA = "rows"
HEIGHT = 260


def label(metric: Any) -> str:
    """A metric's display name (``recall_at_10`` -> ``recall@10``)."""
    return LABELS.get(str(metric), str(metric))


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def higher_is_better(row: dict[str, Any]) -> bool:
    """The metric's direction: the report's own ``higher_is_better``, else the known one."""
    flag = row.get("higher_is_better")
    return flag if isinstance(flag, bool) else str(row.get("metric")) not in LOWER_IS_BETTER


def improvement(row: dict[str, Any]) -> tuple[float, float, float] | None:
    """(g, low, high): the relative difference and its interval, improvement-signed."""
    d, lo, hi = _num(row.get("d")), _num(row.get("ci_low")), _num(row.get("ci_high"))
    if d is None or lo is None or hi is None:
        return None
    if higher_is_better(row):
        return d, lo, hi
    return -d + 0.0, -hi + 0.0, -lo + 0.0  # + 0.0: never a '-0.00%'


def tolerance(gate: dict[str, Any]) -> float:
    t = _num(gate.get("tolerance"))
    return DEFAULT_TOLERANCE if t is None or t < 0 else t


def is_two_sided(gate: dict[str, Any]) -> bool:
    """Parity is two-sided (a band); ``no_regression`` one-sided (a line at -t)."""
    return str(gate.get("mode")) == "parity"


def evaluation_points(gate: dict[str, Any]) -> list[tuple[Any, list[dict[str, Any]]]]:
    """(step, metric rows) per evaluation point: the parity job's ``points``, the gate's
    ``curve``, else the report's own ``metrics`` as the one point "final"."""
    for key in ("points", "curve"):
        points = gate.get(key)
        if isinstance(points, list) and points:
            found = [
                (p.get("step"), [m for m in p["metrics"] if isinstance(m, dict)])
                for p in points
                if isinstance(p, dict) and isinstance(p.get("metrics"), list)
            ]
            if found:
                return found
    metrics = gate.get("metrics")
    rows = [m for m in metrics if isinstance(m, dict)] if isinstance(metrics, list) else []
    return [("final", rows)]


def gate_rows(gate: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's data: one row per evaluation point and metric with an interval."""
    rows = []
    for step, metrics in evaluation_points(gate):
        for m in metrics:
            signed = improvement(m)
            if signed is None:
                continue
            g, lo, hi = signed
            rows.append(
                {
                    "metric": label(m.get("metric")),
                    "step": str(step),
                    "g": g,
                    "low": lo,
                    "high": hi,
                    "verdict": str(m.get("verdict")),
                }
            )
    return rows


def axis(t: float, values: Iterable[float]) -> dict[str, Any]:
    """The y scale and ticks: symlog, linear within +/-t, symmetric, SLA always in view."""
    unit = t if t > 0 else DEFAULT_TOLERANCE
    limit = max([3 * unit, *(abs(v) for v in values)]) * 1.15
    ticks = [0.0]
    step = unit
    while step <= limit:
        ticks += [step, -step]
        step *= 10
    return {
        "scale": {"type": "symlog", "constant": unit, "domain": [-limit, limit], "nice": False},
        "ticks": sorted(ticks),
    }


def _sla_layers(alt: Any, t: float, two_sided: bool) -> list[Any]:
    zero = alt.Chart().mark_rule(color="#8c959f").encode(y=alt.datum(0))
    if two_sided:
        band = (
            alt.Chart()
            .mark_rect(color="#ddf4ff", stroke="#54aeff", strokeDash=[4, 3])
            .encode(y=alt.datum(-t), y2=alt.datum(t))
            .properties(name="tolerance_band")
        )
        return [band, zero]
    line = (
        alt.Chart()
        .mark_rule(color="#1f2328", strokeDash=[6, 4], strokeWidth=1.5)
        .encode(y=alt.datum(-t))
        .properties(name="sla_line")
    )
    return [zero, line]


def _y(alt: Any, field: str, t: float, values: list[float], title: str) -> Any:
    ax = axis(t, values)
    return alt.Y(
        field,
        type="quantitative",
        title=title,
        scale=alt.Scale(**ax["scale"]),
        axis=alt.Axis(values=ax["ticks"], format="+.2~%", grid=True),
    )


def plain_pct(value: float) -> str:
    """0.001 -> '0.1%': a tolerance as people write it."""
    return f"{value * 100:.4g}%"


def _sla_text(t: float, two_sided: bool) -> str:
    return f"parity band ±{plain_pct(t)}" if two_sided else f"SLA line at −{plain_pct(t)}"


def gate_chart_spec(gate: dict[str, Any]) -> dict[str, Any]:
    """The Vega-Lite spec of one gate decision: each metric's improvement-signed d with its
    interval, coloured by its verdict, against the SLA line (one-sided) or band (parity).

    ``gate`` is a ``gate.json`` (or the job's decision with the same keys). Several
    evaluation points (a parity curve) become one column per step.
    """
    import altair as alt

    t, two_sided = tolerance(gate), is_two_sided(gate)
    rows = gate_rows(gate)
    steps = list(dict.fromkeys(r["step"] for r in rows))
    values = [v for r in rows for v in (r["g"], r["low"], r["high"])]
    y_title = "d vs reference, improvement-signed"
    colour = alt.Color(
        "verdict:N",
        title="verdict",
        scale=alt.Scale(domain=list(VERDICT_COLOURS), range=list(VERDICT_COLOURS.values())),
    )
    x = alt.X("metric:N", title=None, sort=None, axis=alt.Axis(labelAngle=0))
    intervals = (
        alt.Chart()
        .mark_rule(strokeWidth=3)
        .encode(x=x, y=_y(alt, "low", t, values, y_title), y2="high:Q", color=colour)
        .properties(name="interval")
    )
    points = (
        alt.Chart()
        .mark_point(filled=True, size=80, opacity=1)
        .encode(x=x, y=_y(alt, "g", t, values, y_title), color=colour)
        .properties(name="point")
    )
    reference = gate.get("reference")
    ref = reference.get("version") if isinstance(reference, dict) else reference
    source = reference.get("source") if isinstance(reference, dict) else None
    candidate = gate.get("candidate")
    cand = candidate.get("version") if isinstance(candidate, dict) else candidate
    confidence = _num(gate.get("confidence"))
    title = alt.Title(
        f"Gate {gate.get('verdict')}: {'parity' if two_sided else 'no regression'}",
        subtitle=[
            f"candidate {cand} vs {source + ' ' if source else ''}{ref}",
            _sla_text(t, two_sided)
            + (f", {confidence:.0%} intervals" if confidence else "")
            + "; above 0 is better",
        ],
        anchor="start",
        color=VERDICT_COLOURS.get(str(gate.get("verdict")), "#1f2328"),
        subtitleColor="#57606a",
    )
    layers = [*_sla_layers(alt, t, two_sided), intervals, points]
    width = max(240, min(WIDTH, 110 * len({r["metric"] for r in rows}) + 40))
    data = alt.NamedData(DATA)
    if len(steps) > 1:  # a curve: one panel per evaluation step
        chart = alt.layer(*layers).properties(width=max(160, width // 2), height=HEIGHT)
        chart = chart.facet(
            facet=alt.Facet("step:N", sort=steps, title="evaluation step"),
            columns=3,
            data=data,
            title=title,
        )
    else:
        chart = alt.layer(*layers, data=data).properties(width=width, height=HEIGHT, title=title)
    return _with_rows(chart.configure_view(stroke=None), rows)


def history_chart_spec(
    runs: list[dict[str, Any]], t: float = DEFAULT_TOLERANCE, two_sided: bool = False
) -> dict[str, Any]:
    """Each metric's improvement-signed d per gate decision, oldest to newest.

    ``runs`` are decisions oldest first, as the page lists them (``run_id``, ``metrics``
    with ``metric``, ``d``, ``ci_low``, ``ci_high``, ``verdict``); x counts them from 1.
    """
    import altair as alt

    rows = []
    for order, run in enumerate(runs):
        for m in run.get("metrics") or []:
            signed = improvement(m)
            if signed is None:
                continue
            rows.append(
                {
                    "run": order + 1,
                    "run_id": str(run.get("run_id")),
                    "metric": label(m.get("metric")),
                    "g": signed[0],
                    "verdict": str(m.get("verdict")),
                }
            )
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    y = _y(alt, "g", t, [r["g"] for r in rows], "improvement vs reference")
    colour = alt.Color(
        "metric:N",
        title="metric",
        scale=alt.Scale(domain=metrics, range=list(SERIES_COLOURS[: max(1, len(metrics))])),
    )
    x = alt.X(
        "run:Q",
        title="gate decision, oldest to newest",
        scale=alt.Scale(domain=[0.5, max(1, len(runs)) + 0.5], nice=False),
        axis=alt.Axis(format="d", tickMinStep=1, grid=False),
    )
    # Points while they can be told apart; a year of daily runs is lines only.
    lines = (
        alt.Chart()
        .mark_line(point=len(runs) <= 60)
        .encode(x=x, y=y, color=colour)
        .properties(name="history")
    )
    title = alt.Title(
        "Gate history: d per metric",
        subtitle=f"{_sla_text(t, two_sided)}; above 0 is better",
        anchor="start",
        subtitleColor="#57606a",
    )
    chart = alt.layer(*_sla_layers(alt, t, two_sided), lines, data=alt.NamedData(DATA))
    chart = chart.properties(width=WIDTH, height=220, title=title)
    return _with_rows(chart.configure_view(stroke=None), rows)


def _with_rows(chart: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The spec with the rows as its named data set.

    Not validated here: altair's JSON-schema check cost 25 ms a chart on every page
    and the structure is this module's, fixed; tests/test_quality_chart.py validates
    every shape of spec against the Vega-Lite schema instead.
    """
    spec = chart.to_dict(validate=False)
    spec["datasets"] = {DATA: rows}
    return spec


def render_svg(spec: dict[str, Any]) -> str:
    """The spec as a standalone SVG document, rendered offline by vl-convert."""
    import vl_convert

    return vl_convert.vegalite_to_svg(spec)
