"""The page's charts: Vega-Lite specs (:mod:`embedfresh.core.quality_chart`, built with
altair) rendered to SVG on the server by vl-convert, offline, so the sandboxed iframe
needs no script.

The decision chart is the file the gate job wrote beside ``gate.json``
(``reports/gate.vl.json``); runs older than that file, and parity decisions, get the
same chart built from their ``gate.json``.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from embedfresh.core import layout, quality_chart
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger(__name__)

VERDICT_COLOURS = quality_chart.VERDICT_COLOURS


#: Charts kept per api-server process, keyed by their exact input: the page shows the
#: same decisions until a new one lands, and building (altair, ~40 ms) plus rendering
#: (vl-convert, ~50 ms) is most of a page's time.
CACHED_CHARTS = 32


@functools.lru_cache(maxsize=CACHED_CHARTS)
def _svg_of(spec_json: str) -> str:
    svg = quality_chart.render_svg(json.loads(spec_json))
    # A class to find the chart by (the browser test, CSS), on vl-convert's root element.
    return svg.replace('class="marks"', 'class="marks quality-chart"', 1)


def _svg(spec: dict[str, Any]) -> str:
    return _svg_of(json.dumps(spec, sort_keys=True))


@functools.lru_cache(maxsize=CACHED_CHARTS)
def _built(kind: str, payload_json: str) -> str:
    payload = json.loads(payload_json)
    if kind == "gate":
        return _svg(quality_chart.gate_chart_spec(payload))
    return _svg(quality_chart.history_chart_spec(**payload))


def curve_chart(curve: dict[str, Any]) -> str:
    """An SVG document for :func:`embedfresh.plugins.model_quality.reports.latest_curve`'s data."""
    return _built("gate", json.dumps(curve, sort_keys=True, default=str))


def stored_spec(store: ArtifactStore, model: str, run_id: str) -> dict[str, Any] | None:
    """The run's chart spec as the gate job wrote it; None when absent or unusable."""
    try:
        raw = store.read_bytes(layout.gate_chart(model, run_id))
    except FileNotFoundError:
        return None
    try:
        spec = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        log.warning("%s is not JSON: building the chart from gate.json", model)
        return None
    return spec if isinstance(spec, dict) else None


def decision_chart(
    store: ArtifactStore, model: str, run_id: str, gate: dict[str, Any] | None
) -> tuple[str, str]:
    """(SVG, where it came from) for one decision: the stored spec, else built from gate."""
    spec = stored_spec(store, model, run_id)
    if spec is not None:
        return _svg(spec), store.url(layout.gate_chart(model, run_id))
    if gate is None:
        raise ValueError(f"no chart and no gate report for {model} run {run_id}")
    return _built("gate", json.dumps(gate, sort_keys=True, default=str)), "built from gate.json"


def history_chart(decisions: list[dict[str, Any]]) -> str:
    """Each metric's improvement-signed d per decision, for the newest decision's mode."""
    if not decisions:
        raise ValueError("no gate decision")
    newest = decisions[0]
    same_mode = [r for r in decisions if r.get("mode") == newest.get("mode")]
    payload = {
        "runs": [
            {"run_id": r.get("run_id"), "metrics": r.get("metrics") or []} for r in same_mode[::-1]
        ],
        "t": quality_chart.tolerance(newest),
        "two_sided": quality_chart.is_two_sided(newest),
    }
    return _built("history", json.dumps(payload, sort_keys=True, default=str))
