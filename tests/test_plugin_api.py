"""The "Model quality" plugin's FastAPI app on fixture artifacts, through FastAPI's TestClient.

Authentication is real: tokens come from the api-server's auth manager (Airflow's
SimpleAuthManager), so an unauthenticated or unauthorised request is refused by the same
code path the api-server uses. The fixture store (tests/plugin_fixtures/store) holds two
real gate reports and a registry written by the jobs, plus health, compile and embedding
reports in the shapes the jobs write; each test gets its own copy to damage.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import ROOT

FIXTURE_STORE = Path(__file__).parent / "plugin_fixtures" / "store"
GATE_RUN = "manual__2026-01-02T00:00:00+00:00"


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
    assert "INCONCLUSIVE" in html and "PASS" in html
    # The Airflow-run id links into the Airflow UI, the shell-made one does not.
    assert (
        'href="../dags/embedding_model_refresh/runs/manual__2026-01-02T00%3A00%3A00%2B00%3A00"'
        in html
    )
    assert "demo-2026-01-01 <span class='na'>(not a DAG run)</span>" in html
    # vl-convert's SVG of the Vega-Lite chart: the one-sided gate's SLA line, no band.
    assert 'class="marks quality-chart"' in html and "sla_line_marks" in html
    assert "rank1/allreduce" in html  # the newest health report failed on rank 1
    assert "1 of 2 checks passed" in html and "rank 1 sum off by 3.0" in html
    assert "k0a1b2c3" in html and "kdead" in html
    assert "verified" in html and "incomplete: no manifest yet" in html


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
    assert [h["version"] for h in data["history"]] == ["demo-2026-01-01"]


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
        "no registry yet: tiny has never been promoted",
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
    for section in ("registry", "decisions", "curve", "health", "compile-cache", "embeddings"):
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
