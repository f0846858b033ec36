"""The page's banner ("is production healthy, and why") and its plain words.

The reason sentence is built from gate reports the gate's own functions made
(tests/test_quality_chart.py publishes them as the job does) and from the demo's real
reports in tests/plugin_fixtures; the eager compile row comes from the real compile job
run with ``compile=off``. The next refresh comes from Airflow's metadata database: a
throw-away SQLite one holding the refresh DAG, and "not known" without one.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from embedfresh.core.storage import ArtifactStore
from embedfresh.plugins.model_quality import banner, reports
from embedfresh.plugins.model_quality.page import render_page
from embedfresh.plugins.model_quality.settings import REFRESH_DAG_ID
from tests.conftest import run_job
from tests.test_quality_chart import FIXTURE_GATE, published

FIXTURE_STORE = Path(__file__).parent / "plugin_fixtures" / "store"


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(f"file://{tmp_path}/store")


def test_fail_sentence_names_the_metric_its_interval_and_the_sla(store: ArtifactStore):
    report = published(store, "FAIL")
    recall = next(m for m in report["metrics"] if m["metric"] == "recall_at_10")
    sentence = banner.verdict_sentence(report)
    expected = (
        f"recall@10 is {abs(recall['d']):.2%} worse than production "
        f"[{banner.signed(recall['ci_low'])}, {banner.signed(recall['ci_high'])}]"
    )
    assert expected in sentence, sentence
    assert "log-loss is" in sentence and "worse than production" in sentence
    assert sentence.endswith("the SLA allows 0.1%")
    assert re.search(
        r"recall@10 is 3\.\d\d% worse than production \[−3\.\d\d%, −[23]\.\d\d%\]", sentence
    )


def test_inconclusive_sentence_says_what_would_decide(store: ArtifactStore):
    report = published(store, "INCONCLUSIVE")
    recall = next(m for m in report["metrics"] if m["metric"] == "recall_at_10")
    assert recall["verdict"] == "INCONCLUSIVE" and recall["n_needed"]
    sentence = banner.verdict_sentence(report)
    assert sentence.startswith("recall@10 is ")
    assert f"about {recall['n_needed']:,} examples would decide" in sentence
    assert "log-loss" not in sentence  # it passed: only the undecided metric is the reason
    assert sentence.endswith("the SLA allows 0.1%")


def test_pass_sentence_names_the_metric_closest_to_the_line(store: ArtifactStore):
    sentence = banner.verdict_sentence(published(store, "PASS"))
    assert sentence.startswith("every metric is within the SLA: the closest to the line is ")
    assert "+0.00% [+0.00%, +0.00%] against production" in sentence  # identical models
    assert sentence.endswith("the SLA allows 0.1%")


def test_parity_sentence_speaks_of_a_band(store: ArtifactStore):
    sentence = banner.verdict_sentence(published(store, "FAIL", mode="parity"))
    assert sentence.endswith("parity allows ±0.1%")


def test_demo_report_sentence():
    import json

    sentence = banner.verdict_sentence(json.loads(FIXTURE_GATE.read_text()))
    assert sentence.startswith("recall@10 is 5.17% better than production [−5.12%, +16.35%]")


def test_next_refresh_is_not_known_without_a_database(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{tmp_path}/none.db")
    from airflow import settings

    settings.configure_vars()
    settings.configure_orm()
    try:
        assert banner.next_refresh(REFRESH_DAG_ID).startswith("not known (")
    finally:
        monkeypatch.undo()
        settings.dispose_orm(do_log=False)
        settings.configure_vars()
        settings.configure_orm()


def test_next_refresh_from_airflows_database(monkeypatch, tmp_path: Path):
    import datetime as dt

    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{tmp_path}/af.db")
    from airflow import settings
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel

    settings.configure_vars()
    settings.configure_orm()
    try:
        DagBundleModel.__table__.create(settings.engine)
        DagModel.__table__.create(settings.engine)
        when = dt.datetime(2026, 12, 1, 0, 0, tzinfo=dt.UTC)
        with settings.Session() as session:
            session.add(DagBundleModel(name="dags-folder"))
            session.commit()
            session.add(
                DagModel(
                    dag_id=REFRESH_DAG_ID,
                    bundle_name="dags-folder",
                    is_paused=False,
                    next_dagrun=when - dt.timedelta(days=1),
                    next_dagrun_create_after=when,
                )
            )
            session.commit()
        assert (
            banner.next_refresh(REFRESH_DAG_ID) == f"2026-12-01T00:00:00+00:00 ({REFRESH_DAG_ID})"
        )
        assert banner.next_refresh("other").startswith("not known: other is not in")
    finally:
        monkeypatch.undo()
        settings.dispose_orm(do_log=False)
        settings.configure_vars()
        settings.configure_orm()


def test_page_banner_on_the_demo_store(tmp_path: Path):
    root = tmp_path / "store"
    shutil.copytree(FIXTURE_STORE, root)
    store = ArtifactStore(f"file://{root}")
    html = render_page("tiny", ["tiny"], reports.overview(store, "tiny"), store.root, store=store)
    top = re.search(r'<section id="banner".*?</section>', html).group(0)
    assert 'id="banner-production">demo-2026-01-01<' in top
    assert "INCONCLUSIVE" in top and "recall@10 is 5.17% better than production" in top
    assert "version demo-2026-01-01 on products: 600 rows, verified" in top
    assert 'id="banner-next">' in top
    # The decision chart (built from gate.json: the fixture predates gate.vl.json) and
    # the history chart, both vl-convert SVG.
    assert html.count('class="marks quality-chart"') == 2
    assert "chart: built from gate.json" in html


def test_page_uses_the_chart_the_gate_job_wrote(tmp_path: Path):
    import json

    from embedfresh.core import layout, quality_chart

    root = tmp_path / "store"
    shutil.copytree(FIXTURE_STORE, root)
    store = ArtifactStore(f"file://{root}")
    run = "manual__2026-01-02T00:00:00+00:00"
    spec = quality_chart.gate_chart_spec(json.loads(FIXTURE_GATE.read_text()))
    spec["title"]["text"] = "the stored chart"
    store.write_json(layout.gate_chart("tiny", run), spec)
    html = render_page("tiny", ["tiny"], reports.overview(store, "tiny"), store.root, store=store)
    assert "the stored chart" in html
    assert f"chart: {store.url(layout.gate_chart('tiny', run))}" in html


def test_eager_compile_rows_read_not_compiled(root: str):
    done = run_job("compile", f"artifact_root={root}", "run_id=e1", "compile=off")
    assert done.returncode == 0, done.stderr[-2000:]
    store = ArtifactStore(root)
    section = reports.overview(store, "tiny")["compile_cache"]
    assert section.available, section.message
    html = render_page("tiny", ["tiny"], reports.overview(store, "tiny"), store.root, store=store)
    table = re.search(r'<table id="compile-cache">.*?<tbody>(.*?)</tbody>', html).group(1)
    assert "e1: not compiled (eager)" in table
    assert "miss" not in table and "not available" not in table
