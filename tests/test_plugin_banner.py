"""The page's banner ("is production healthy, and why") and its plain words.

The reason sentence is built from gate reports the gate's own functions made
(tests/test_quality_chart.py publishes them as the job does) and from the demo's real
reports in tests/plugin_fixtures; the eager compile row comes from the real compile job
run with ``compile=off``. The next refresh comes from Airflow's metadata database: a
throw-away SQLite one holding the refresh DAG, and "not known" without one.

What is live comes from the live release: its embeddings, never the newest embedding run
(after a promote anyway, the banner named the previous version's); a registry written
before releases, and a release without corpora, are bare pointers and the banner says
that no verified embeddings are live.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from embedfresh.core.storage import ArtifactStore
from embedfresh.plugins.model_quality import banner, reports
from embedfresh.plugins.model_quality.page import render_page
from embedfresh.plugins.model_quality.settings import REFRESH_DAG_ID
from tests.conftest import run_job
from tests.test_plugin_api import TABLE, corpus_release, make_release, record_move
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


def _page(root: Path) -> str:
    store = ArtifactStore(f"file://{root}")
    return render_page("tiny", ["tiny"], reports.overview(store, "tiny"), store.root, store=store)


def _banner(html: str) -> str:
    return re.search(r'<section id="banner".*?</section>', html).group(0)


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """A copy of the fixture store: the demo's live release, demo-2026-01-01."""
    root = tmp_path / "store"
    shutil.copytree(FIXTURE_STORE, root)
    return root


def test_page_banner_on_the_demo_store(demo: Path):
    html = _page(demo)
    top = _banner(html)
    assert 'id="banner-production">demo-2026-01-01<' in top
    assert 'id="banner-release">demo-2026-01-01<' in top
    assert "released after the gate&#x27;s PASS" in top
    assert "INCONCLUSIVE" in top and "recall@10 is 5.17% better than production" in top
    assert (
        f'<span id="banner-embeddings">products: 600 rows in table {TABLE}, search check PASS '
        "(nDCG@10 0.3542 over 45 judged queries, ANN recall 99.17%)</span>"
    ) in top
    assert 'id="banner-bare"' not in top and 'class="verdict-inconclusive"' in top
    assert 'id="banner-next">' in top
    # The decision chart (built from gate.json: the fixture predates gate.vl.json) and
    # the history chart, both vl-convert SVG.
    assert html.count('class="marks quality-chart"') == 2
    assert "chart: built from gate.json" in html


def test_banner_for_a_registry_written_before_releases(demo: Path):
    """The registry's production entry names a version and no release (a registry from
    before releases). The version's embeddings exist, verified, in the store, but nothing
    loaded or checked them: the banner says no verified embeddings are live, and neither
    it nor the embedding runs call that set live."""
    path = demo / "models/tiny/registry.json"
    doc = json.loads(path.read_text())
    legacy = ("action", "release", "release_url", "corpora", "previous_release")
    doc["production"] = {k: v for k, v in doc["production"].items() if k not in legacy}
    doc["history"] = [{k: v for k, v in h.items() if k not in legacy} for h in doc["history"]]
    path.write_text(json.dumps(doc))
    html = _page(demo)
    top = _banner(html)
    assert 'class="verdict-inconclusive bare"' in top
    bare = re.search(r'<p class="warning" id="banner-bare">(.*?)</p>', top).group(1)
    assert bare.startswith(
        "Production is a bare pointer to model version demo-2026-01-01, from a registry "
        "written before releases: no verified embeddings are live; a search service"
    )
    assert 'id="banner-release"' not in top and 'id="banner-embeddings"' not in top
    assert 'id="banner-production">demo-2026-01-01<' in top
    assert "released after the gate&#x27;s PASS" in top  # the registry entry's verdict
    # The live release panel and the history say the same; no set is marked live.
    assert "No release: production is model version" in html
    assert 'id="release-bare"' in html and 'id="release-corpora"' not in html
    assert "bare pointer (before releases)" in html and "none: bare pointer" in html
    assert "<strong>live</strong>" not in html
    data = reports.live_release(ArtifactStore(f"file://{demo}"), "tiny").data
    assert (data["legacy"], data["bare"], data["release"], data["corpora"]) == (
        True, True, None, []
    )  # fmt: skip


def test_banner_for_a_release_without_corpora(demo: Path):
    """A release whose corpora are empty (what publish_model makes of a base version):
    a release, but no verified embeddings are live."""
    base = "base-2026-01-04"
    make_release(demo, base, base, [], gate=None)
    record_move(demo, base, base, [])
    html = _page(demo)
    top = _banner(html)
    assert 'id="banner-release">base-2026-01-04<' in top
    bare = re.search(r'<p class="warning" id="banner-bare">(.*?)</p>', top).group(1)
    assert bare.startswith(
        "Release base-2026-01-04 carries no corpus embeddings (its corpora are empty, as "
        "for a published base version): no verified embeddings are live;"
    )
    assert TABLE not in top and 'id="banner-embeddings"' not in top
    registry = re.search(r'<table id="registry">.*?</table>', html).group(0)
    assert '<span class="warning">none</span>' in registry  # the bare release's corpora
    assert "<strong>live</strong>" in registry and "kept: rollback possible" in registry


def test_banner_after_a_promote_anyway_names_the_new_release_embeddings(demo: Path):
    """The issue's case: after a promote anyway, the banner named the previous version's
    embeddings as the last embedding run. It names the live release's now, and who moved
    it and why."""
    anyway = "manual__2026-01-03T09:00:00+00:00"
    make_release(
        demo, anyway, "demo-2026-01-02", [corpus_release(anyway, "demo-2026-01-02")],
        action="promote_anyway", who="admin", why="recall fixed by hand",
    )  # fmt: skip
    record_move(
        demo, anyway, "demo-2026-01-02", ["products"], action="promote_anyway",
        who="admin", why="recall fixed by hand",
    )  # fmt: skip
    new_table = corpus_release(anyway, "demo-2026-01-02").table
    top = _banner(_page(demo))
    assert 'id="banner-production">demo-2026-01-02<' in top
    assert "promoted anyway (no gate&#x27;s PASS) by admin: recall fixed by hand" in top
    embeddings = re.search(r'<span id="banner-embeddings">(.*?)</span>', top).group(1)
    assert embeddings.startswith(f"products: 600 rows in table {new_table}, search check PASS")
    assert TABLE not in top and "demo-2026-01-01 on products" not in top


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
