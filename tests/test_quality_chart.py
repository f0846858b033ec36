"""The gate's Vega-Lite charts (embedfresh.core.quality_chart), checked from their specs.

Decisions come from the gate's own functions (:func:`embedfresh.ml.gate.decision.gate` on
synthetic outcomes, published by :func:`embedfresh.ml.gate.publish.publish_decision` with the
details the gate job adds) and from the real demo reports in tests/plugin_fixtures, so
the chart reads what the jobs write: the numbers, the improvement sign of log-loss, the
SLA line of the one-sided gate and the band of the two-sided one, the verdict colours,
and an SVG from vl-convert that carries the title.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedfresh.core import layout, quality_chart
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.gate.decision import gate
from embedfresh.ml.gate.publish import publish_decision
from tests.conftest import ROOT

FIXTURE_GATE = (
    Path(__file__).parent
    / "plugin_fixtures/store/runs/tiny/manual__2026-01-02T00:00:00+00:00/reports/gate.json"
)
T = 0.001
N = 4000


def outcomes(kind: str) -> tuple[dict, dict]:
    """(candidate, reference) outcomes whose gate is PASS, FAIL or INCONCLUSIVE on
    recall@10 and log-loss, a lower-is-better metric."""
    rng = np.random.default_rng(7)
    label = rng.integers(0, 2, N)
    prob = np.clip(np.where(label == 1, 0.7, 0.3) + rng.normal(0, 0.1, N), 0.01, 0.99)
    recall = rng.uniform(0.2, 1.0, N)
    ref = {"label": label, "prob": prob, "recall_at_10": recall}
    if kind == "PASS":
        return dict(ref), ref
    if kind == "FAIL":  # recall 3% lower, probabilities pulled toward 0.5: log-loss worse
        return {
            "label": label,
            "prob": 0.5 + (prob - 0.5) * 0.8,
            "recall_at_10": recall * 0.97,
        }, ref
    noisy = np.clip(recall + rng.normal(0, 0.03, N), 0, 1)  # d near 0, interval over -0.1%
    return {"label": label, "prob": prob, "recall_at_10": noisy}, ref


def published(store: ArtifactStore, kind: str, mode: str = "no_regression") -> dict:
    """A gate.json as the gate job writes it, from the gate's own decision."""
    cand, ref = outcomes(kind)
    result = gate(cand, ref, ["log_loss", "recall_at_10"], mode, T, resamples=300, seed=1)
    details = {
        "candidate": {"version": f"cand-{kind.lower()}", "metrics": {}},
        "reference": {"version": "prod-1", "source": "production", "metrics": {}},
        "production_at_decision": "prod-1",
        "n_examples": N,
        "n_queries": N,
        "curve": [{"step": "final", **result.to_dict()}],
    }
    run_id = f"run-{kind.lower()}-{mode}"
    publish_decision(store, "tiny", run_id, "<svg/>", result.to_dict(), details, 0.0)
    return store.read_json(layout.report("tiny", run_id, "gate"))


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(f"file://{tmp_path}/store")


def layers(spec: dict) -> list[dict]:
    return spec["layer"] if "layer" in spec else spec["spec"]["layer"]


def rows(spec: dict) -> dict[str, dict]:
    return {r["metric"]: r for r in spec["datasets"][quality_chart.DATA]}


@pytest.mark.parametrize("kind", ["PASS", "FAIL", "INCONCLUSIVE"])
def test_the_gates_own_verdicts(store: ArtifactStore, kind: str):
    assert published(store, kind)["verdict"] == kind


def test_values_and_log_loss_sign_from_the_spec(store: ArtifactStore):
    report = published(store, "FAIL")
    spec = quality_chart.gate_chart_spec(report)
    data = rows(spec)
    by_metric = {m["metric"]: m for m in report["metrics"]}
    recall, loss = by_metric["recall_at_10"], by_metric["log_loss"]
    # recall@10 (higher is better) as written; about -3%, a FAIL.
    assert data["recall@10"]["g"] == pytest.approx(recall["d"]) == pytest.approx(-0.03, abs=1e-3)
    assert (data["recall@10"]["low"], data["recall@10"]["high"]) == (
        pytest.approx(recall["ci_low"]),
        pytest.approx(recall["ci_high"]),
    )
    # log-loss rose (raw d > 0): improvement-signed it is negative, its interval flipped.
    assert loss["d"] > 0 and loss["higher_is_better"] is False
    assert data["log-loss"]["g"] == pytest.approx(-loss["d"])
    assert data["log-loss"]["low"] == pytest.approx(-loss["ci_high"])
    assert data["log-loss"]["high"] == pytest.approx(-loss["ci_low"])
    assert {r["verdict"] for r in data.values()} == {"FAIL"}


def test_one_sided_gate_draws_the_sla_line_and_no_band(store: ArtifactStore):
    spec = quality_chart.gate_chart_spec(published(store, "INCONCLUSIVE"))
    marks = layers(spec)
    rules = [m for m in marks if m["mark"]["type"] == "rule" and "strokeDash" in m["mark"]]
    assert [r["encoding"]["y"]["datum"] for r in rules] == [-T]
    assert not [m for m in marks if m["mark"]["type"] == "rect"]
    assert "SLA line at −0.1%" in json.dumps(spec["title"], ensure_ascii=False)


def test_parity_gate_draws_the_band(store: ArtifactStore):
    spec = quality_chart.gate_chart_spec(published(store, "PASS", mode="parity"))
    marks = layers(spec)
    (band,) = [m for m in marks if m["mark"]["type"] == "rect"]
    assert (band["encoding"]["y"]["datum"], band["encoding"]["y2"]["datum"]) == (-T, T)
    assert not [m for m in marks if m["mark"]["type"] == "rule" and "strokeDash" in m["mark"]]


def test_the_axis_keeps_the_sla_visible_when_values_are_wide():
    """The demo's recall@10 interval spans -5% to +16%: the scale stays symlog with its
    linear part at +/-t, and +/-t are ticks."""
    spec = quality_chart.gate_chart_spec(json.loads(FIXTURE_GATE.read_text()))
    ys = [m["encoding"]["y"] for m in layers(spec) if "field" in m["encoding"].get("y", {})]
    for y in ys:
        assert y["scale"]["type"] == "symlog" and y["scale"]["constant"] == T
        low, high = y["scale"]["domain"]
        assert low < -0.16 and high > 0.16  # every interval inside
        assert -T in y["axis"]["values"] and T in y["axis"]["values"]
    data = rows(spec)
    assert data["recall@10"]["verdict"] == "INCONCLUSIVE"
    assert data["log-loss"]["g"] > 0  # the demo's log-loss fell: an improvement


def test_verdict_colours_are_fixed_and_series_never_reuse_them():
    spec = quality_chart.gate_chart_spec(json.loads(FIXTURE_GATE.read_text()))
    colour = next(m["encoding"]["color"] for m in layers(spec) if "color" in m["encoding"])
    assert dict(zip(colour["scale"]["domain"], colour["scale"]["range"], strict=True)) == {
        "PASS": "#1a7f37",
        "FAIL": "#cf222e",
        "INCONCLUSIVE": "#9a6700",
    }
    assert not set(quality_chart.SERIES_COLOURS) & set(quality_chart.VERDICT_COLOURS.values())
    gate = json.loads(FIXTURE_GATE.read_text())
    history = quality_chart.history_chart_spec([gate, gate])
    (line,) = [m for m in history["layer"] if m["mark"]["type"] == "line"]
    assert not set(line["encoding"]["color"]["scale"]["range"]) & set(
        quality_chart.VERDICT_COLOURS.values()
    )
    assert len(history["datasets"][quality_chart.DATA]) == 8  # 2 decisions x 4 metrics


def test_vl_convert_renders_the_title(store: ArtifactStore):
    svg = quality_chart.render_svg(quality_chart.gate_chart_spec(published(store, "FAIL")))
    assert svg.startswith("<svg") and "Gate FAIL: no regression" in svg
    assert "candidate cand-fail vs production prod-1" in svg
    assert "recall@10" in svg and "log-loss" in svg


def test_specs_are_valid_vega_lite(store: ArtifactStore):
    """The builder skips altair's validation at run time: every shape is checked here."""
    import altair as alt
    from altair.utils.schemapi import validate_jsonschema

    schema = alt.vegalite.v6.schema.core.load_schema()
    fixture = json.loads(FIXTURE_GATE.read_text())
    curve = {**fixture, "mode": "parity"}
    curve["curve"] = [{**fixture["curve"][0], "step": step} for step in (25, 50, 75)]
    specs = [
        quality_chart.gate_chart_spec(published(store, "FAIL")),
        quality_chart.gate_chart_spec(published(store, "PASS", mode="parity")),
        quality_chart.gate_chart_spec(curve),
        quality_chart.history_chart_spec([fixture] * 3),
        quality_chart.history_chart_spec([fixture] * 61, two_sided=True),
    ]
    assert "facet" in specs[2] and len(specs[2]["datasets"]["rows"]) == 12
    for spec in specs:
        validate_jsonschema(spec, schema)


def test_chart_builder_imports_no_torch():
    code = (
        "import json, sys\n"
        "from embedfresh.core import quality_chart\n"
        "import embedfresh.plugins.model_quality.page\n"
        f"spec = quality_chart.gate_chart_spec(json.load(open({str(FIXTURE_GATE)!r})))\n"
        "quality_chart.render_svg(spec)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
