"""The "Model quality" plugin's FastAPI app on fixture artifacts, through FastAPI's TestClient.

Authentication is real: tokens come from the api-server's auth manager (Airflow's
SimpleAuthManager), so an unauthenticated or unauthorised request is refused by the same
code path the api-server uses. The fixture store (tests/plugin_fixtures/store) holds two
real gate reports and a registry written by the jobs, plus health, compile and embedding
reports in the shapes the jobs write, and the live release: its document (written by
:func:`embedfresh.core.releases.release_doc`) with the search check and index load
reports of the run that made it. Each test gets its own copy to damage; the tests that
need more releases write them with the product's own functions (:func:`make_release`,
:func:`record_move`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from embedfresh.core.releases import CorpusRelease
from tests.conftest import ROOT

FIXTURE_STORE = Path(__file__).parent / "plugin_fixtures" / "store"
GATE_RUN = "manual__2026-01-02T00:00:00+00:00"
#: The fixture's live release (made by the run of the same id) and its products table.
RELEASE = "demo-2026-01-01"
TABLE = "emb_tiny_products_e6b6bfc54b18"


def corpus_release(
    release: str,
    version: str,
    *,
    corpus: str = "products",
    compared_with: dict | None = None,
    ndcg: float = 0.3875,
) -> CorpusRelease:
    """One corpus of a release as the release job records it, for ``version``'s set."""
    from embedfresh.core.index.base import live_view_name, table_name

    with_ = compared_with
    return CorpusRelease(
        corpus=corpus,
        manifest=f"file:///fixture/embeddings/tiny/{version}/{corpus}/_MANIFEST.json",
        manifest_sha256="ab" * 32,
        rows=600,
        hidden=32,
        settings={"max_length": 64, "pooling": "mean", "quantize": "none", "backend": "cpu"},
        index={
            "kind": "pgvector",
            "location": "embedded:/fixture/index",
            "table": table_name("tiny", release, corpus),
            "live_view": live_view_name("tiny", corpus),
            "ann": {"m": 16, "ef_construction": 64, "ef_search": 40},
        },
        search_check={
            "verdict": "PASS",
            "reason": "the index is faithful (98.75%); search is no worse than release "
            f"{(with_ or {}).get('release')}",
            "queries": 48,
            "queries_judged": 48,
            "ann_recall": 0.9875,
            "min_ann_recall": 0.95,
            "ndcg_at_10": ndcg,
            "judged_at_10": 1.0,
            "latency_ms": {"p50": 2.25, "p99": 7.5, "queries": 48},
            "dataset": "products",
            "compared_with": with_,
            "regression": {
                "verdict": "PASS" if with_ else "NOT_COMPARED",
                "reason": "d within the SLA" if with_ else "first release of this corpus",
                "mode": "enforce" if with_ else None,
            },
            "report": f"file:///fixture/runs/tiny/{release}/reports/search-{corpus}.json",
        },
    )


def make_release(
    store: Path, release: str, version: str, corpora: list[CorpusRelease], **doc: Any
) -> str:
    """Write release ``release`` of model tiny into the store copy; its URL."""
    from embedfresh.core.releases import release_doc, write_release
    from embedfresh.core.storage import ArtifactStore

    made, _ = write_release(
        ArtifactStore(f"file://{store}"),
        release_doc(
            model="tiny",
            release=release,
            version=version,
            version_url=f"file:///fixture/models/tiny/versions/{version}",
            run_id=release,
            action=doc.pop("action", "promote"),
            corpora={c.corpus: c for c in corpora},
            created_at="2026-01-03T00:00:00+00:00",
            **doc,
        ),
    )
    return str(made.url)


def record_move(
    store: Path, release: str | None, version: str, corpora: list[str], **details: Any
) -> None:
    """Move the registry's production pointer as :meth:`Registry._move` records a move
    (the store copy holds no model versions for the registry's COMMIT check)."""
    path = store / "models/tiny/registry.json"
    doc = json.loads(path.read_text())
    current = doc["production"]
    moved = {
        "action": "promote",
        "run_id": release or version,
        **details,
        "version": version,
        "release": release,
        "release_url": f"file://{store}/models/tiny/releases/{release}.json" if release else None,
        "corpora": corpora,
        "previous": current.get("version"),
        "previous_release": current.get("release"),
        "promoted_at": details.get("promoted_at", "2026-01-03T00:00:00+00:00"),
    }
    doc["production"] = moved
    doc["history"].append(moved)
    path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def auth(tmp_path_factory: pytest.TempPathFactory):
    """The api-server's auth manager, initialised with its password file in a tmp dir."""
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("airflow-home")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(home / "passwords.json"))
    mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "plugin-api-test-secret-" + "x" * 48)
    # Token validation asks the metadata database whether the token was revoked: point
    # the ORM at a throw-away SQLite file holding that one table, and back afterwards.
    mp.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{home / 'airflow.db'}")
    from airflow import settings
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.models.revoked_token import RevokedToken

    settings.dispose_orm(do_log=False)
    settings.configure_vars()
    settings.configure_orm()
    RevokedToken.__table__.create(settings.engine)
    try:
        yield init_auth_manager()
    finally:
        settings.dispose_orm(do_log=False)
        mp.undo()
        settings.configure_vars()
        settings.configure_orm()


def token(auth, role: str | None) -> str:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return auth.generate_jwt(SimpleAuthManagerUser(username=f"user-{role}", role=role))


@pytest.fixture
def store(tmp_path: Path) -> Path:
    dest = tmp_path / "store"
    shutil.copytree(FIXTURE_STORE, dest)
    return dest


@pytest.fixture
def client(auth, store: Path) -> TestClient:
    from embedfresh.plugins.model_quality import create_app

    c = TestClient(create_app(f"file://{store}"), raise_server_exceptions=False)
    c.headers["Authorization"] = f"Bearer {token(auth, 'viewer')}"
    return c


# -- authentication ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/api/models", "/api/models/tiny", "/chart.svg?model=tiny"])
def test_unauthenticated_requests_are_refused(auth, store: Path, path: str):
    from embedfresh.plugins.model_quality import create_app

    anonymous = TestClient(create_app(f"file://{store}"), raise_server_exceptions=False)
    r = anonymous.get(path)
    assert r.status_code == 401, r.text
    for leak in ("demo-2026-01-01", "INCONCLUSIVE", "k0a1b2c3", "<svg"):
        assert leak not in r.text  # nothing from the store
    assert "Traceback" not in r.text
    if not path.startswith("/api"):
        assert "Log in to Airflow" in r.text  # the page offers the way in


def test_forged_token_and_unauthorised_user_are_refused(auth, store: Path):
    from embedfresh.plugins.model_quality import create_app

    c = TestClient(create_app(f"file://{store}"), raise_server_exceptions=False)
    good = token(auth, "viewer")
    forged = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    assert c.get("/api/models", headers={"Authorization": f"Bearer {forged}"}).status_code == 403
    no_role = token(auth, None)
    r = c.get("/api/models", headers={"Authorization": f"Bearer {no_role}"})
    assert r.status_code == 403, r.text


def test_the_login_cookie_authenticates(auth, store: Path):
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    from embedfresh.plugins.model_quality import create_app

    c = TestClient(create_app(f"file://{store}"), raise_server_exceptions=False)
    c.cookies.set(COOKIE_NAME_JWT_TOKEN, token(auth, "viewer"))
    r = c.get("/api/models")
    assert r.status_code == 200, r.text
    assert r.json()["models"] == ["tiny"]


# -- content -------------------------------------------------------------------------


def test_page_shows_registry_decisions_chart_health_cache_and_embeddings(client: TestClient):
    r = client.get("/?model=tiny")
    assert r.status_code == 200, r.text
    html = r.text
    assert 'id="production-version">demo-2026-01-01<' in html
    assert 'id="release-id">demo-2026-01-01<' in html
    assert "INCONCLUSIVE" in html and "PASS" in html
    # The Airflow-run id links into the Airflow UI, the shell-made one does not.
    assert (
        'href="../dags/embedding_model_refresh/runs/manual__2026-01-02T00%3A00%3A00%2B00%3A00"'
        in html
    )
    assert (
        "<span class=\"id\">demo-2026-01-01</span> <span class='na'>(not a DAG run)</span>" in html
    )
    # vl-convert's SVG of the Vega-Lite chart: the one-sided gate's SLA line, no band.
    assert 'class="marks quality-chart"' in html and "sla_line_marks" in html
    assert "rank1/allreduce" in html  # the newest health report failed on rank 1
    assert "1 of 2 checks passed" in html and "rank 1 sum off by 3.0" in html
    assert "k0a1b2c3" in html and "kdead" in html
    assert "verified" in html and "incomplete: no manifest yet" in html
    # The embedding set the live release carries is marked live; the other one is not.
    rows = re.findall(r"<tr>(.*?)</tr>", _table(html, "embeddings"))
    live = [r for r in rows if "<strong>live</strong>" in r]
    assert len(rows) == 2 and len(live) == 1 and "<td>products</td>" in live[0]


def _table(html: str, css_id: str) -> str:
    """The body of the page's table ``css_id``."""
    found = re.search(rf'<table id="{css_id}">.*?<tbody>(.*?)</tbody></table>', html, re.S)
    assert found, f"no table {css_id}"
    return found.group(1)


def test_the_live_release_panel_shows_each_corpus_with_its_search_check(client: TestClient):
    """The fixture's release document's figures, each where a person looks for it: the
    embedding set (rows, dimensions, settings, manifest and its sha256), the index table
    (table, live view, where, HNSW settings) and the search check (verdict and reason,
    queries, ANN recall against its floor, nDCG@10, latency, the report)."""
    store_doc = json.loads((FIXTURE_STORE / f"models/tiny/releases/{RELEASE}.json").read_text())
    products = store_doc["corpora"]["products"]
    check = products["search_check"]
    html = client.get("/?model=tiny").text
    row = re.search(r'<tr id="release-corpus-products">(.*?)</tr>', html).group(1)
    cells = re.findall(r"<td>(.*?)</td>", row)
    assert cells[0] == "products"
    embedding, index, verdict, figures = cells[1:]
    assert embedding.startswith("600 rows of 32 dimensions<br>")
    assert "max_length 64" in embedding and "pooling mean" in embedding
    assert products["embeddings"]["manifest"] in embedding
    assert products["embeddings"]["manifest_sha256"][:16] in embedding
    assert f'<code class="id">{TABLE}</code>' in index
    assert products["index"]["live_view"] in index and "embedded:/fixture/index" in index
    assert "HNSW m 16, ef_construction 64, ef_search 40" in index
    assert "PASS" in verdict and "first release of this corpus" in verdict
    assert "queries 48, nDCG@10 on 45 judged" in figures
    assert "ANN recall 99.17% (at least 95.00%)" in figures
    assert f"nDCG@10 {check['ndcg_at_10']}" in figures
    assert (
        'not compared: <span class="text">first release of this corpus (no live release)'
    ) in figures
    assert "latency p50 1.91 ms, p99 4.38 ms" in figures
    assert check["report"] in figures
    # The JSON says the same: the release document's corpora, whole.
    data = client.get("/api/models/tiny/release").json()
    assert data["available"], data
    live = data["data"]
    assert (live["release"], live["version"], live["action"]) == (RELEASE, RELEASE, "promote")
    assert live["legacy"] is False and live["bare"] is False
    assert live["gate"]["verdict"] == "PASS"
    [corpus] = live["corpora"]
    assert corpus == {"corpus": "products", **products}


def test_release_history_marks_what_retention_keeps(auth, store: Path, monkeypatch):
    """Four moves over three releases, two kept: the live one and the one before it (a
    promote anyway, which a rollback could reach again; its Params named for a user who
    may roll back), the oldest past retention. Each run links to the DAG that made it."""
    monkeypatch.setenv("EMBEDFRESH_KEEP_RELEASES", "2")
    later, anyway = "manual__2026-01-02T00:00:00+00:00", "manual__2026-01-03T09:00:00+00:00"
    make_release(store, later, "demo-2026-01-02", [corpus_release(later, "demo-2026-01-02")])
    make_release(
        store, anyway, "demo-2026-01-03", [corpus_release(anyway, "demo-2026-01-03")],
        action="promote_anyway", who="admin", why="recall fixed by hand",
    )  # fmt: skip
    record_move(store, later, "demo-2026-01-02", ["products"], verdict="PASS")
    record_move(
        store, anyway, "demo-2026-01-03", ["products"], action="promote_anyway",
        who="admin", why="recall fixed by hand",
    )  # fmt: skip
    record_move(
        store, later, "demo-2026-01-02", ["products"], action="rollback", who="admin",
        why="the override was a mistake", run_id="manual__2026-01-03T10:00:00+00:00",
    )  # fmt: skip
    from embedfresh.plugins.model_quality import create_app

    c = TestClient(create_app(f"file://{store}"), raise_server_exceptions=False)
    c.headers["Authorization"] = f"Bearer {token(auth, 'user')}"
    data = c.get("/api/models/tiny/registry").json()["data"]
    assert data["keep"] == 2 and data["kept"] == [later, anyway]
    assert [h["action"] for h in data["history"]] == [
        "rollback", "promote_anyway", "promote", "promote"
    ]  # fmt: skip
    html = c.get("/?model=tiny").text
    rows = re.findall(r"<tr>(.*?)</tr>", _table(html, "registry"))
    assert len(rows) == 4
    retention = [re.findall(r"<td>(.*?)</td>", r)[-1] for r in rows]
    assert retention[0] == "<strong>live</strong>"  # the rollback made `later` live again
    assert retention[1].startswith("kept: rollback possible")
    assert f'<code class="id">release={anyway}</code>' in retention[1]
    assert retention[2] == "<strong>live</strong>"  # `later`'s first move: the same release
    assert "past retention (keeps 2)" in retention[3]
    # Each move's run links to the DAG that made it.
    assert (
        f"../dags/embedfresh_rollback/runs/{quote('manual__2026-01-03T10:00:00+00:00', safe='')}"
        in rows[0]
    )
    assert f"../dags/embedfresh_promote_anyway/runs/{quote(anyway, safe='')}" in rows[1]
    assert f"../dags/embedding_model_refresh/runs/{quote(later, safe='')}" in rows[2]
    who = '<span class="id">admin</span>: <span class="text">'
    assert f"{who}recall fixed by hand</span>" in rows[1]
    assert f"{who}the override was a mistake</span>" in rows[0]
    # The rollback's Params: the newest release kept before the live one.
    conf = re.search(r'id="override-conf-rollback">(.*?)</code>', html).group(1)
    assert json.loads(conf.replace("&quot;", '"')) == {
        "model": "tiny", "release": anyway, "reason": ""
    }  # fmt: skip
    # The live release panel: the rolled-back-to release, and how it went live.
    assert 'id="release-id">manual__2026-01-02T00:00:00+00:00<' in html
    assert (
        "rolled back from manual__2026-01-03T09:00:00+00:00 by admin: the override was a mistake"
        in html
    )


def test_the_panel_shows_what_the_search_check_compared_with(client: TestClient, store: Path):
    later = "manual__2026-01-02T00:00:00+00:00"
    with_ = {"release": RELEASE, "version": RELEASE, "table": TABLE, "ndcg_at_10": 0.354167}
    make_release(
        store, later, "demo-2026-01-02",
        [corpus_release(later, "demo-2026-01-02", compared_with=with_, ndcg=0.3875)],
    )  # fmt: skip
    record_move(store, later, "demo-2026-01-02", ["products"], verdict="PASS")
    html = client.get("/?model=tiny").text
    figures = re.findall(r"<td>(.*?)</td>", re.search(
        r'<tr id="release-corpus-products">(.*?)</tr>', html).group(1))[-1]  # fmt: skip
    assert "nDCG@10 0.3875" in figures
    assert (
        f'against release <span class="id">{RELEASE}</span> (version <span class="id">{RELEASE}'
        f'</span>, table <code class="id">{TABLE}</code>): nDCG@10 0.354167; '
    ) in figures
    assert "(enforce)" in figures and "latency p50 2.25 ms, p99 7.5 ms" in figures
    top = re.search(r'<section id="banner".*?</section>', html).group(0)
    assert "nDCG@10 0.3875 over 48 judged queries, ANN recall 98.75%; release " \
        "demo-2026-01-01 had nDCG@10 0.3542" in top  # fmt: skip


def test_a_check_that_could_not_judge_search_says_so(client: TestClient, store: Path):
    """Nothing judged the corpus: the check measured the index's faithfulness and nDCG@10
    on no query (INCONCLUSIVE; released by a person's promote-anyway, whose check only
    reports): the page says "not measured", never 0 or a number."""
    import dataclasses

    later = "manual__2026-01-02T00:00:00+00:00"
    base = corpus_release(later, "demo-2026-01-02")
    unjudged = {
        **base.search_check,
        "ndcg_at_10": None,
        "judged_at_10": None,
        "queries": 96,
        "queries_judged": 0,
        "regression": {"verdict": "INCONCLUSIVE", "reason": "cannot be judged", "mode": "report"},
    }
    make_release(
        store, later, "demo-2026-01-02", [dataclasses.replace(base, search_check=unjudged)]
    )
    record_move(store, later, "demo-2026-01-02", ["products"], verdict="PASS")
    report = store / f"runs/tiny/{later}/reports/search-products.json"
    report.write_text(json.dumps({"corpus": "products", "verdict": "PASS", **unjudged}))
    html = client.get("/?model=tiny").text
    row = re.search(r'<tr id="release-corpus-products">(.*?)</tr>', html).group(1)
    assert "queries 96, nDCG@10 on 0 judged" in row
    assert "nDCG@10 not measured" in row
    top = re.search(r'<section id="banner".*?</section>', html).group(0)
    assert "search check PASS (nDCG@10 not measured, ANN recall 98.75%)" in top
    checks = _table(html, "search-checks")
    assert "not measured" in checks and "nDCG@10 on 0 judged" in checks


def test_search_checks_of_the_newest_runs_say_why_no_release(client: TestClient, store: Path):
    """The newest decision's run passed its gate but its search check failed: the banner
    says so beside the gate's verdict (no release was made), the section lists it with its
    figures; the live release's own check is marked live."""
    fixture = json.loads((store / f"runs/tiny/{RELEASE}/reports/search-products.json").read_text())
    failed = {
        **fixture,
        "verdict": "FAIL",
        "release": GATE_RUN,
        "version": "demo-2026-01-02",
        "ann_recall": 0.81,
        "reason": "the index is not faithful: its top 10 holds 81.00% of the exact top 10, "
        "below 95% (raise ef_search or hnsw_m / hnsw_ef_construction)",
    }
    (store / f"runs/tiny/{GATE_RUN}/reports/search-products.json").write_text(json.dumps(failed))
    (store / f"runs/tiny/{GATE_RUN}/reports/search-news.json").write_text("{broken")
    data = client.get("/api/models/tiny/search-checks").json()
    assert data["available"], data
    rows = data["data"]
    assert [(r["run_id"], r["verdict"]) for r in rows] == [(GATE_RUN, "FAIL"), (RELEASE, "PASS")]
    assert rows[0]["ann_recall"] == 0.81 and rows[1]["ndcg_at_10"] == fixture["ndcg_at_10"]
    assert rows[1]["latency_ms"] == {"p50": 1.912, "p99": 4.377, "queries": 48}
    assert any("search-news.json is not valid JSON" in p for p in data["problems"])
    html = client.get("/?model=tiny").text
    banner = re.search(r'<span id="banner-search">(.*?)</span>', html).group(1)
    assert banner.startswith("search check FAIL on products (the index is not faithful")
    assert banner.endswith("; no release was made")
    table = _table(html, "search-checks")
    assert "81.00% (at least 95.00%)" in table and "<strong>(live)</strong>" in table
    assert "search-news.json is not valid JSON" in html  # named, the rest still shows


def test_decisions_newest_first_with_interval_and_n(client: TestClient):
    data = client.get("/api/models/tiny/decisions").json()
    assert data["available"], data
    rows = data["data"]
    assert [r["run_id"] for r in rows] == [GATE_RUN, "demo-2026-01-01"]
    newest = rows[0]
    assert newest["verdict"] == "INCONCLUSIVE" and newest["mode"] == "no_regression"
    assert newest["reference"] == "demo-2026-01-01" and newest["n"] == 40000
    acc = next(m for m in newest["metrics"] if m["metric"] == "accuracy")
    assert acc["ci_low"] < acc["d"] < acc["ci_high"]


def test_registry_history_and_production(client: TestClient):
    data = client.get("/api/models/tiny/registry").json()["data"]
    assert data["production"]["version"] == "demo-2026-01-01"
    assert data["production"]["release"] == RELEASE
    assert [h["version"] for h in data["history"]] == ["demo-2026-01-01"]
    assert data["keep"] == 3 and data["kept"] == [RELEASE]


def test_a_release_the_registry_names_but_the_store_lacks_is_a_message(
    client: TestClient, store: Path
):
    (store / f"models/tiny/releases/{RELEASE}.json").unlink()
    page = client.get("/?model=tiny")
    assert page.status_code == 200 and "Traceback" not in page.text
    assert f"live release not available: model tiny has no release {RELEASE}" in page.text
    assert 'id="registry"' in page.text  # the history still shows
    data = client.get("/api/models/tiny/release").json()
    assert data["available"] is False and f"releases/{RELEASE}.json" in data["message"]


def test_health_keeps_the_newest_result_per_host_and_rank(client: TestClient, store: Path):
    # An older report from another host must still show for that host.
    older = json.loads((store / "runs/tiny/health-a/reports/health.json").read_text())
    older["ranks"][0]["host"] = "node-b"
    (store / "runs/tiny/health-a/reports/health.json").write_text(json.dumps(older))
    data = client.get("/api/models/tiny/health").json()["data"]
    assert data["verdict"] == "FAIL" and data["run_id"] == "health-b"
    by_key = {(r["host"], r["rank"]): r for r in data["ranks"]}
    assert (
        by_key[("node-a", 1)]["passed"] is False and by_key[("node-a", 1)]["run_id"] == "health-b"
    )
    assert by_key[("node-b", 0)]["run_id"] == "health-a"
    assert [c["size_bytes"] for c in data["collectives"]] == [1024, 1048576]


def test_compile_cache_sizes_from_markers_and_hit_history(client: TestClient):
    entries = {e["key"]: e for e in client.get("/api/models/tiny/compile-cache").json()["data"]}
    committed = entries["k0a1b2c3"]
    assert committed["committed"] and committed["size_bytes"] == 4096 + 1000
    assert [h["cache_hit"] for h in committed["history"]] == [True, False]  # newest first
    assert entries["kdead"]["committed"] is False


def test_chart_draws_every_metric_and_the_band(client: TestClient):
    r = client.get("/chart.svg?model=tiny")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    svg = r.text
    points = re.search(r'<g class="mark-symbol role-mark point_marks"[^>]*>(.*?)</g>', svg)
    assert points.group(1).count("<path") == 4  # four metrics at the one "final" point
    assert "SLA line at −0.1%" in svg and "sla_line_marks" in svg  # no_regression: one-sided


# -- missing and corrupted reports ---------------------------------------------------


def test_empty_store_says_so(client: TestClient, store: Path):
    shutil.rmtree(store)
    store.mkdir()
    r = client.get("/")
    assert r.status_code == 200
    assert "no model in the artifact store" in r.text


def test_missing_reports_render_not_available(client: TestClient, store: Path):
    for sub in ("models", "compile-cache", "embeddings"):
        shutil.rmtree(store / sub)
    for run in store.glob("runs/tiny/*"):
        if run.name != GATE_RUN:
            shutil.rmtree(run)
    (store / "runs/tiny" / GATE_RUN / "reports/gate.json").unlink()
    (store / "runs/tiny/other/reports").mkdir(parents=True)
    r = client.get("/?model=tiny")
    assert r.status_code == 200, r.text
    for message in (
        "no registry yet: tiny has never been released",
        "no live release yet: tiny has never been released",
        "no gate decision for tiny yet",
        "no health report for tiny yet",
        "no compile cache entries yet",
        "no embedding runs for tiny yet",
    ):
        assert message in r.text
    assert client.get("/chart.svg?model=tiny").status_code == 404


@pytest.mark.parametrize(
    "content", [b"{not json", b"\xff\xfe\x00", b"[1, 2]", b'{"mode": "parity"}'], ids=str
)
def test_corrupted_gate_report_is_named_and_the_rest_still_shows(
    client: TestClient, store: Path, content: bytes
):
    bad = store / "runs/tiny" / GATE_RUN / "reports/gate.json"
    bad.write_bytes(content)
    page = client.get("/?model=tiny")
    assert page.status_code == 200
    assert f"{bad}" in page.text  # the problem names the file
    assert 'id="production-version">demo-2026-01-01<' in page.text
    rows = client.get("/api/models/tiny/decisions").json()
    assert [r["run_id"] for r in rows["data"]] == ["demo-2026-01-01"]
    assert any(str(bad) in p for p in rows["problems"])
    whole = client.get(f"/api/models/tiny/runs/{GATE_RUN}/gate")
    assert whole.status_code == 422 and str(bad) in whole.json()["detail"]


@pytest.mark.parametrize("content", [b"{truncated", b'{"model": "tiny", "history": 5}', b"null"])
def test_corrupted_registry_is_a_message(client: TestClient, store: Path, content: bytes):
    (store / "models/tiny/registry.json").write_bytes(content)
    page = client.get("/?model=tiny")
    assert page.status_code == 200
    assert "registry not available:" in page.text and "Traceback" not in page.text
    data = client.get("/api/models/tiny/registry").json()
    assert data["available"] is False and "registry.json" in data["message"]


def test_corrupted_manifest_and_compile_report(client: TestClient, store: Path):
    (store / "embeddings/tiny/demo-2026-01-01/products/_MANIFEST.json").write_text("{oops")
    (store / "runs/tiny/compile-2/reports/compile.json").write_text('{"backend": "cpu"}')
    emb = client.get("/api/models/tiny/embeddings").json()
    assert {r["corpus"]: r["status"] for r in emb["data"]}["products"] == "manifest unreadable"
    cache = client.get("/api/models/tiny/compile-cache").json()
    assert any("lacks key" in p for p in cache["problems"])


def test_unreachable_store_is_a_message_not_a_stack_trace(auth):
    from embedfresh.plugins.model_quality import create_app

    c = TestClient(create_app("s3://"), raise_server_exceptions=False)
    c.headers["Authorization"] = f"Bearer {token(auth, 'viewer')}"
    r = c.get("/")
    assert r.status_code == 400 and "names no bucket" in r.text and "Traceback" not in r.text


# -- ids in URLs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/?model=..",
        "/?model=../../etc",
        "/?model=tiny%2F..%2F..",
        "/chart.svg?model=..%2Fmodels",
        "/api/models/..%2e/registry",
        "/api/models/tiny/runs/.../gate",
        "/api/models/tiny/runs/%2e%2e/gate",
        "/api/models/tiny/runs/..%2F..%2Fmodels%2Ftiny/gate",
        "/api/models/%2Fetc/registry",
        "/api/models/tiny%00/registry",
    ],
)
def test_traversal_attempts_are_rejected(client: TestClient, store: Path, path: str):
    secret = store.parent / "secret.json"
    secret.write_text('{"verdict": "PASS", "password": "hunter2"}')
    r = client.get(path)
    assert r.status_code in (400, 404), (path, r.status_code, r.text)
    assert "hunter2" not in r.text and "Traceback" not in r.text


def test_unknown_section_is_404_with_the_list(client: TestClient):
    r = client.get("/api/models/tiny/bogus")
    assert r.status_code == 404 and "registry" in r.json()["detail"]


# -- import weight -------------------------------------------------------------------


def test_plugin_and_storage_do_not_import_torch():
    code = (
        "import sys\n"
        "import embedfresh.plugins.model_quality_plugin, embedfresh.plugins.model_quality.reports, embedfresh.core.storage\n"
        "heavy = [m for m in ('torch', 'torch_xla', 'transformers', 'boto3') if m in sys.modules]\n"
        "print(heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


# -- curves and S3 -------------------------------------------------------------------


def test_parity_curve_draws_one_line_per_metric_over_the_steps(client: TestClient, store: Path):
    path = store / "runs/tiny" / GATE_RUN / "reports/gate.json"
    gate = json.loads(path.read_text())
    final = gate["curve"][0]
    gate["mode"] = "parity"
    gate["curve"] = [{**final, "step": step} for step in (25, 50, 75)]
    gate["curve"][1]["metrics"][0]["d"] = 0.0042  # accuracy at step 50 leaves the band
    path.write_text(json.dumps(gate))
    svg = client.get("/chart.svg?model=tiny").text
    # One panel per step, four metrics each, inside the two-sided band.
    assert svg.count("point_marks") == 3 and svg.count("tolerance_band_marks") == 3
    assert "parity band ±0.1%" in svg and "sla_line_marks" not in svg
    points = client.get("/api/models/tiny/curve").json()["data"]["points"]
    assert [p["step"] for p in points] == [25, 50, 75]


def test_the_parity_job_s_own_report_is_drawn_from_its_points(client: TestClient, store: Path):
    """The parity job writes each step's metrics under ``points`` and a per-step summary
    (|d| only) under ``curve``: the curve shown is the points'."""
    path = store / "runs/tiny" / GATE_RUN / "reports/gate.json"
    gate = json.loads(path.read_text())
    final = gate["curve"][0]
    gate["mode"] = "parity"
    gate["points"] = [{**final, "step": step} for step in (2, 4)]
    gate["curve"] = [{"step": s, "verdict": "PASS", "max_abs_d": 0.0, "d": {}} for s in (2, 4)]
    path.write_text(json.dumps(gate))
    points = client.get("/api/models/tiny/curve").json()["data"]["points"]
    assert [p["step"] for p in points] == [2, 4]
    assert [len(p["metrics"]) for p in points] == [len(final["metrics"])] * 2 != [0, 0]


def test_reads_an_s3_store_like_a_local_one(auth, s3_endpoint: str):
    import boto3

    from embedfresh.core.storage import ArtifactStore
    from embedfresh.plugins.model_quality import create_app

    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="model-quality")
    root = "s3://model-quality/prod"
    s3 = ArtifactStore(root)
    for path in FIXTURE_STORE.rglob("*"):
        if path.is_file():
            s3.write_bytes(path.relative_to(FIXTURE_STORE).as_posix(), path.read_bytes())
    c = TestClient(create_app(root), raise_server_exceptions=False)
    c.headers["Authorization"] = f"Bearer {token(auth, 'viewer')}"
    local = TestClient(create_app(f"file://{FIXTURE_STORE}"), raise_server_exceptions=False)
    local.headers["Authorization"] = c.headers["Authorization"]
    for section in (
        "registry", "release", "decisions", "curve", "health", "compile-cache", "embeddings",
        "search-checks",
    ):  # fmt: skip
        remote = c.get(f"/api/models/tiny/{section}").json()
        assert remote["available"], (section, remote)
        here = local.get(f"/api/models/tiny/{section}").json()["data"]
        # Identical but for the root in the URLs each entry carries.
        assert json.dumps(remote["data"]).replace(root, "ROOT") == json.dumps(here).replace(
            f"file://{FIXTURE_STORE}", "ROOT"
        ), section
    entries = {e["key"]: e for e in c.get("/api/models/tiny/compile-cache").json()["data"]}
    assert entries["k0a1b2c3"]["size_bytes"] == 5096
    assert entries["k0a1b2c3"]["url"] == "s3://model-quality/prod/compile-cache/cpu/k0a1b2c3"
    page = c.get("/?model=tiny")
    assert page.status_code == 200 and "s3://model-quality/prod" in page.text
    assert 'id="production-version">demo-2026-01-01<' in page.text
    assert c.get("/api/models/tiny/runs/..%2F..%2Fother/gate").status_code == 404


# -- the two overrides: offered only to users who may trigger their DAGs ---------------


@pytest.mark.parametrize(
    ("role", "offered"),
    [
        ("viewer", []),
        ("user", ["promote_anyway", "rollback"]),
        ("admin", ["promote_anyway", "rollback"]),
    ],
)
def test_override_links_only_for_users_who_may_trigger_them(auth, store: Path, role, offered):
    """Asked of Airflow's own auth manager: a viewer may not trigger a DAG (no link), a
    user or an admin may (links to the override DAGs in the Airflow UI, opened in the top
    window). The page posts nothing: the links are plain GETs of Airflow's DAG pages."""
    from embedfresh.plugins.model_quality import create_app
    from embedfresh.plugins.model_quality.settings import OVERRIDE_DAG_IDS

    c = TestClient(create_app(f"file://{store}"), raise_server_exceptions=False)
    c.headers["Authorization"] = f"Bearer {token(auth, role)}"
    page = c.get("/?model=tiny")
    assert page.status_code == 200, page.text
    found = re.findall(
        r'<a class="override" id="override-([a-z_]+)" target="_top" href="([^"]+)"', page.text
    )
    assert [action for action, _ in found] == offered
    for action, href in found:
        assert href == f"../dags/{OVERRIDE_DAG_IDS[action]}"
    assert ('id="overrides"' in page.text) == bool(offered)
    assert "<form" not in page.text and 'method="post"' not in page.text.lower()
    # Beside each link, the Params its Trigger form asks for (Airflow's UI cannot take
    # them from the link): rollback takes a release, promote anyway a version and corpora.
    confs = {
        action: json.loads(conf.replace("&quot;", '"'))
        for action, conf in re.findall(r'id="override-conf-([a-z_]+)">(.*?)</code>', page.text)
    }
    assert sorted(confs) == sorted(offered)
    if offered:
        # Nothing kept before the live release yet: the release is the person's to give.
        assert confs["rollback"] == {"model": "tiny", "release": "", "reason": ""}
        # The newest candidate (INCONCLUSIVE, not live) with the live release's corpora.
        assert confs["promote_anyway"] == {
            "model": "tiny", "version": "demo-2026-01-02", "corpora": ["products"], "reason": ""
        }  # fmt: skip


def test_decision_table_signs_every_metric_as_improvement(client, store: Path):
    """log-loss is lower-is-better: its row shows -d with the interval flipped, as the
    charts and the banner do, so a worse model reads negative for every metric."""
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.plugins.model_quality import reports

    gate = json.loads((store / "runs/tiny/demo-2026-01-01/reports/gate.json").read_text())
    (log_loss,) = [m for m in gate["metrics"] if m["metric"] == "log_loss"]
    page = client.get("/?model=tiny").text
    expected = (
        f"log-loss: {-log_loss['d']:+.3%} [{-log_loss['ci_high']:+.3%}, {-log_loss['ci_low']:+.3%}]"
    )
    assert expected in page, expected
    assert f"log-loss: {log_loss['d']:+.3%}" not in page
    # and the values under the chart, of the newest decision's final evaluation
    newest = reports.latest_curve(ArtifactStore(f"file://{store}"), "tiny").data
    (final,) = [m for m in newest["points"][-1]["metrics"] if m["metric"] == "log_loss"]
    assert f"<td>{-final['d']:+.3%}</td>" in page
    assert f"<td>{final['d']:+.3%}</td>" not in page


def test_costs_add_up_every_attempt_of_the_newest_runs(client: TestClient, store: Path):
    """Two executions of the newest run: a local train, and an embed array on Batch whose
    child lost its host once; both count, the failed attempt too."""
    from embedfresh.core.cost import cost_record
    from embedfresh.operators.runners.aws_batch import batch_cost

    folder = store / f"runs/tiny/{GATE_RUN}/reports/cost"
    train = cost_record(
        [{"attempt": 1, "seconds": 120.0, "exit_code": 0}], instance_type="cpu", runner="local"
    )
    t0 = 1_764_000_000_000
    children = [
        {"jobId": f"p:{i}", "arrayProperties": {"index": i}, "attempts": attempts}
        for i, attempts in enumerate(
            [
                [{"startedAt": t0, "stoppedAt": t0 + 30_000, "container": {"exitCode": 0}}],
                [
                    {"startedAt": t0, "stoppedAt": t0 + 4_000, "container": {}},  # host lost
                    {
                        "startedAt": t0 + 9_000,
                        "stoppedAt": t0 + 40_000,
                        "container": {"exitCode": 0},
                    },
                ],
            ]
        )
    ]
    embed = batch_cost({"jobId": "p"}, children, instance_type="trn1.32xlarge")
    for task, record in (("refresh:train", train), ("refresh:embed", embed)):
        (folder / task).mkdir(parents=True)
        (folder / task / "a1.json").write_text(json.dumps({"task": task, **record}))

    data = client.get("/api/models/tiny/costs").json()
    assert data["available"], data
    [row] = data["data"]  # the other runs have no cost records
    assert row["run_id"] == GATE_RUN
    assert row["executions"] == 2 and row["attempts"] == 4 and row["failed_attempts"] == 1
    assert row["seconds"] == 120 + 30 + 4 + 31
    assert row["estimated_cost_usd"] == pytest.approx(
        120 / 3600 * 0.4032 + 65 / 3600 * 21.50, abs=1e-5
    )
    assert row["costliest"] == "refresh:embed"
    html = client.get("/?model=tiny").text
    assert 'id="costs"' in html and "refresh:embed" in html and "trn1.32xlarge" in html
