"""The web UI as a new user uses it, in headless chromium (Selenium) against the
session's real Airflow (api-server, scheduler, dag-processor; server.py) with real users.

The admin logs in through Airflow's login page, opens the refresh DAG, presses Trigger
and submits the form with its defaults; the run (a manual run: the newest partition of
the demo store) succeeds through the scheduler, its release (the model version with the
products embeddings, loaded into the embedded vector index under the artifact root and
search-checked) goes live. The "Model quality" page's banner then names the new release,
its embeddings and search check, the run link leads to Airflow's page of that run, and
the chart is there. A second refresh on a bad partition (labels flipped) fails the gate:
the banner says FAIL and why, the release stays, and the promote-anyway Params beside
its link name the refused candidate (the rollback's name a ``release``). A viewer sees
the page without the override links. Screenshots (a PASS and a FAIL page) go to the
test's tmp folder and to ``$EMBEDFRESH_SCREENSHOT_DIR`` when set (docs/images/ holds
copies).

The same server also serves a store filled by the real jobs themselves (generate data,
train, evaluate, gate, health, embed, verify, index load, search check, release; tiny
model), as a manual DAG run would: an unauthenticated request is refused, the REST API
lists our plugin with no import error, and in chromium the page inside the Airflow UI
(Browse -> Model quality) at 1440 px scrolls nowhere sideways and shows the release
history's run column whole; on its own it shows the live release with its corpus's
table and search check figures, the release history, the gate verdict, health,
embeddings and the chart (screenshots model-quality-in-airflow.png and
model-quality.png).

Chromium and chromedriver come from Debian (.ci/run installs them); without them this
test FAILS, it never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from embedfresh.core.releases import live_release
from embedfresh.core.storage import ArtifactStore
from tests.airflow.server import REFRESH, AirflowServer, task_states
from tests.airflow.test_gate_failure import flip_labels
from tests.browser import chromium
from tests.conftest import DAY2, run_job

pytestmark = pytest.mark.slow

SCREENSHOTS = ("model-quality-pass.png", "model-quality-fail.png")
#: Of the page on the store the jobs filled: inside the Airflow UI, and on its own.
JOB_SCREENSHOTS = ("model-quality-in-airflow.png", "model-quality.png")
#: The run the jobs below make: the id Airflow gives a manual DAG run.
JOBS_RUN = "manual__2026-01-01T00:00:00+00:00"
HEALTH = ("collective_sizes=[4096,65536]", "collective_iters=2", "memory_bytes=1048576")


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium() as driver:
        yield driver


def _job(root: str, name: str, *sets: str) -> dict:
    result = run_job(name, f"artifact_root={root}", f"run_id={JOBS_RUN}", "model=tiny", *sets)
    assert result.returncode == 0, f"jobs.{name}: {result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def _fill_with_jobs(root: str, data_template: Path) -> bytes:
    """``root`` made afresh from the generated data, then one release made live by the
    real jobs, as a manual DAG run would (the vector index: the embedded server under
    ``root``); the registry's bytes after it."""
    path = Path(root.removeprefix("file://"))
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(data_template, path)
    _job(root, "train", "backend=cpu", "data_interval_start=2026-01-01", "epochs=3")
    _job(root, "evaluate", "backend=cpu")
    # Against the baseline: nDCG@10 of the judged queries decides (the default metric).
    gate = _job(root, "gate")
    assert gate["verdict"] == "PASS", gate
    _job(root, "health", *HEALTH)
    _job(root, "embed", f"version={JOBS_RUN}")
    _job(root, "embed_verify", f"version={JOBS_RUN}")
    _job(root, "index_load", "corpus=products")
    check = _job(root, "search_check", "corpus=products")
    assert check["verdict"] == "PASS", check
    released = _job(root, "release", 'corpora=["products"]')
    assert released["release"] == JOBS_RUN, released
    return (path / "models/tiny/registry.json").read_bytes()


@pytest.fixture(scope="module")
def _jobs_filled(airflow_server: AirflowServer, data_template: Path) -> dict[str, bytes]:
    root = airflow_server.env["EMBEDFRESH_ARTIFACT_ROOT"]
    return {"registry": _fill_with_jobs(root, data_template)}


@pytest.fixture
def jobs_store(
    airflow_server: AirflowServer, data_template: Path, _jobs_filled: dict[str, bytes]
) -> AirflowServer:
    """The session's server, its default artifact root (the one the page shows) filled
    by the real jobs: done once for the module's tests, and again should a test in
    between have replaced that root (``demo_store`` does)."""
    root = airflow_server.env["EMBEDFRESH_ARTIFACT_ROOT"]
    registry = Path(root.removeprefix("file://")) / "models/tiny/registry.json"
    if not registry.exists() or registry.read_bytes() != _jobs_filled["registry"]:
        _jobs_filled["registry"] = _fill_with_jobs(root, data_template)
    return airflow_server


def log_in(browser, server: AirflowServer, user: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.delete_all_cookies()
    wait = WebDriverWait(browser, 90)
    browser.get(f"{server.base_url}/auth/login")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "input[type=password]")))
    browser.find_element(By.CSS_SELECTOR, "input[name=username], input[type=text]").send_keys(user)
    browser.find_element(By.CSS_SELECTOR, "input[type=password]").send_keys(server.passwords[user])
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda d: "/auth/login" not in d.current_url)


def trigger_from_the_form(browser, server: AirflowServer, dag_id: str) -> None:
    """Airflow's DAG page, its Trigger button, the form's Trigger button: the defaults."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 90)
    browser.get(f"{server.base_url}/dags/{dag_id}")
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "[data-testid=trigger-dag-button]")))
    browser.find_element(By.CSS_SELECTOR, "[data-testid=trigger-dag-button]").click()

    def submit():
        buttons = browser.find_elements(By.CSS_SELECTOR, "[role=dialog] button")
        buttons = [b for b in buttons if b.text == "Trigger"]
        return buttons[-1] if buttons and buttons[-1].is_enabled() else None

    wait.until(lambda _: submit(), "the form's Trigger button stays disabled (form invalid)")
    submit().click()


def new_manual_run(server: AirflowServer, known: set[str]) -> str:
    def created() -> str | None:
        runs = server.api("GET", f"/dags/{REFRESH}/dagRuns?run_type=manual")["dag_runs"]
        new = [r["dag_run_id"] for r in runs if r["dag_run_id"] not in known]
        return new[0] if new else None

    return server.wait_for(created, 60, "the triggered run to appear")


def fits_sideways(browser) -> dict:
    """Whether the current document scrolls sideways, and every table cell whose content
    is cut (wider than the cell, or past the window's right edge)."""
    return browser.execute_script(
        """
        const de = document.documentElement;
        const cut = [...document.querySelectorAll('td, th')]
          .filter(c => c.scrollWidth > c.clientWidth + 1
                       || c.getBoundingClientRect().right > de.clientWidth + 1)
          .map(c => (c.closest('table').id || '?') + ': ' + c.textContent.slice(0, 60));
        return {width: de.clientWidth, scroll: de.scrollWidth, cut: cut};
        """
    )


def assert_no_sideways_scroll(browser, where: str) -> None:
    fit = fits_sideways(browser)
    assert fit["scroll"] <= fit["width"] and not fit["cut"], (where, fit)


def keep(tmp_path: Path, name: str) -> None:
    assert (tmp_path / name).stat().st_size > 10_000
    if directory := os.environ.get("EMBEDFRESH_SCREENSHOT_DIR"):  # pytest prunes tmp
        Path(directory).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, Path(directory) / name)


def test_unauthenticated_requests_are_refused(jobs_store: AirflowServer):
    base = jobs_store.base_url
    response = httpx.get(f"{base}/model-quality/api/models/tiny", timeout=30)
    assert response.status_code == 401, response.text
    assert response.json() == {"detail": "Not authenticated"}
    response = httpx.get(f"{base}/model-quality/", timeout=30)
    assert response.status_code == 401 and "Log in to Airflow" in response.text
    assert "manual__" not in response.text


def test_json_api_with_a_token_from_the_api_server(jobs_store: AirflowServer):
    server = jobs_store
    response = httpx.post(
        f"{server.base_url}/auth/token",
        json={"username": "admin", "password": server.passwords["admin"]},
        timeout=30,
    )
    assert response.status_code in (200, 201), response.text
    access = response.json()["access_token"]

    def get(path: str) -> dict:
        response = httpx.get(
            f"{server.base_url}{path}", headers={"Authorization": f"Bearer {access}"}, timeout=30
        )
        assert response.status_code == 200, f"{path}: {response.status_code} {response.text}"
        return response.json()

    # The api-server loaded our plugin, and nothing else from the folder failed.
    plugins = {p["name"]: p for p in get("/api/v2/plugins")["plugins"]}
    ours = plugins["model_quality"]
    assert [a["url_prefix"] for a in ours["fastapi_apps"]] == ["/model-quality"]
    assert [v["url_route"] for v in ours["external_views"]] == ["model-quality"]
    assert get("/api/v2/plugins/importErrors")["total_entries"] == 0
    decisions = get("/model-quality/api/models/tiny/decisions")
    assert [d["run_id"] for d in decisions["data"]] == [JOBS_RUN]
    assert decisions["data"][0]["verdict"] == "PASS"


def test_login_and_the_page_on_a_store_the_jobs_filled(jobs_store, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    server = jobs_store
    base = server.base_url
    wait = WebDriverWait(browser, 90)
    log_in(browser, server, "admin")
    assert any(c["name"] == "_token" for c in browser.get_cookies()), browser.get_cookies()

    # Inside the Airflow UI: the external view embeds the page in an iframe. At 1440 px
    # (the window's width) neither the UI nor the page scrolls sideways, and the release
    # history's run column is whole: its link inside the frame's width.
    assert browser.get_window_size()["width"] == 1440
    browser.get(f"{base}/plugin/model-quality")
    frame = wait.until(ec.presence_of_element_located((By.TAG_NAME, "iframe")))
    browser.switch_to.frame(frame)
    wait.until(ec.presence_of_element_located((By.ID, "decisions")))
    wait.until(ec.presence_of_element_located((By.ID, "release-corpora")))
    assert_no_sideways_scroll(browser, "the page in Airflow's frame")
    run_link = browser.find_element(By.CSS_SELECTOR, "#registry tbody tr td a")
    assert run_link.text.replace("\n", "") == JOBS_RUN
    right = browser.execute_script("return arguments[0].getBoundingClientRect().right", run_link)
    assert right <= browser.execute_script("return document.documentElement.clientWidth")
    browser.switch_to.default_content()
    assert_no_sideways_scroll(browser, "the Airflow UI around the page")
    time.sleep(1)  # let the UI finish painting its navigation
    browser.save_screenshot(str(tmp_path / JOB_SCREENSHOTS[0]))

    # The page itself: registry row, gate verdict, health, embeddings, chart.
    browser.get(f"{base}/model-quality/?model=tiny")
    decisions = wait.until(ec.presence_of_element_located((By.ID, "decisions")))
    row = decisions.find_element(By.CSS_SELECTOR, "tbody tr")
    verdict = row.find_elements(By.CSS_SELECTOR, "td")[1].text
    assert verdict in {"PASS", "FAIL", "INCONCLUSIVE"}, row.text
    assert JOBS_RUN in row.text
    # The first run's reference is the baseline: search decides (the default metric).
    assert "ndcg_at_10" in row.text and "PASS on ndcg_at_10" in row.text, row.text
    link = row.find_element(By.TAG_NAME, "a").get_attribute("href")
    assert link.startswith(f"{base}/dags/{REFRESH}/runs/manual__2026-01-01"), link
    production = browser.find_element(By.ID, "production-version").text
    registry_rows = browser.find_elements(By.CSS_SELECTOR, "#registry tbody tr")
    assert verdict == "PASS" and production == JOBS_RUN
    assert browser.find_element(By.ID, "release-id").text == JOBS_RUN
    assert len(registry_rows) == 1 and JOBS_RUN in registry_rows[0].text
    assert "PASS" in registry_rows[0].text and "live" in registry_rows[0].text
    # The live release: the products set, the table it was loaded into, the search check.
    store = ArtifactStore(server.env["EMBEDFRESH_ARTIFACT_ROOT"])
    live = live_release(store, "tiny")
    products = live.corpus("products")
    row = browser.find_element(By.ID, "release-corpus-products").text
    assert row.startswith("products") and "600 rows" in row, row
    assert products.table in row.replace("\n", "") and "PASS" in row, row
    check = products.search_check
    assert f"ANN recall {check['ann_recall']:.2%}" in row, row
    assert f"nDCG@10 {check['ndcg_at_10']:.6g}" in row, row
    # Production's age: trained through the day after day 1, nothing newer trained on.
    age = browser.find_element(By.ID, "production-age").text
    assert age.startswith("Production's age: ") and "trained through 2026-01-02" in age, age
    searched = browser.find_element(By.CSS_SELECTOR, "#search-checks tbody tr").text
    assert JOBS_RUN in searched.replace("\n", "") and "PASS" in searched, searched
    assert browser.find_element(By.ID, "health-verdict").text.startswith("Latest verdict PASS")
    health = browser.find_element(By.ID, "health-ranks").text
    assert socket.gethostname() in health and "checks passed" in health
    embeddings = browser.find_element(By.CSS_SELECTOR, "#embeddings tbody tr").text
    assert "products" in embeddings and "verified" in embeddings and " 600 " in f" {embeddings} "
    assert "live" in embeddings, embeddings
    chart = browser.find_element(By.CSS_SELECTOR, "#chart svg.quality-chart")
    assert chart.size["width"] > 300 and chart.size["height"] > 200
    # The chart the gate job wrote (reports/gate.vl.json), rendered by vl-convert.
    assert len(chart.find_elements(By.CSS_SELECTOR, "g.point_marks path")) == 1  # nDCG@10
    assert chart.find_elements(By.CSS_SELECTOR, "g.sla_line_marks")
    assert "gate.vl.json" in browser.find_element(By.ID, "chart").text
    banner = browser.find_element(By.ID, "banner").text
    assert browser.find_element(By.ID, "banner-production").text == JOBS_RUN, banner
    assert browser.find_element(By.ID, "banner-release").text == JOBS_RUN, banner
    assert "Last refresh: PASS" in banner and not browser.find_elements(By.ID, "banner-bare")
    live_words = browser.find_element(By.ID, "banner-embeddings").text
    assert live_words.startswith("products: 600 rows in table "), live_words
    assert browser.find_element(By.ID, "banner-search").text == (
        f"search check PASS on products; release {JOBS_RUN} is live"
    )
    assert_no_sideways_scroll(browser, "the page on its own")
    browser.save_screenshot(str(tmp_path / JOB_SCREENSHOTS[1]))
    for name in JOB_SCREENSHOTS:
        keep(tmp_path, name)


def test_trigger_with_defaults_then_the_page_says_why(demo_store, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    server = demo_store
    store = ArtifactStore(server.env["EMBEDFRESH_ARTIFACT_ROOT"])
    page = f"{server.base_url}/model-quality/?model=tiny"
    wait = WebDriverWait(browser, 90)
    known = {r["dag_run_id"] for r in server.api("GET", f"/dags/{REFRESH}/dagRuns")["dag_runs"]}

    # 1. The admin triggers the refresh from its form, with the defaults.
    log_in(browser, server, "admin")
    trigger_from_the_form(browser, server, REFRESH)
    run_id = new_manual_run(server, known)
    run = server.wait_for_run(REFRESH, run_id, timeout=600)
    assert run["state"] == "success", server.explain(REFRESH, run_id)
    assert run["triggering_user_name"] == "admin"

    # 2. The page: the banner names the new release, its embeddings, PASS, and why.
    browser.get(page)
    banner = wait.until(ec.presence_of_element_located((By.ID, "banner")))
    assert browser.find_element(By.ID, "banner-production").text == run_id, banner.text
    assert browser.find_element(By.ID, "banner-release").text == run_id, banner.text
    assert "Last refresh: PASS" in banner.text, banner.text
    assert browser.find_element(By.ID, "banner-reason").text, banner.text
    table = live_release(store, "tiny").corpus("products").table
    assert table in browser.find_element(By.ID, "banner-embeddings").text, banner.text
    assert browser.find_element(By.ID, "banner-search").text.endswith(
        f"release {run_id} is live"
    ), banner.text
    assert browser.find_element(By.ID, "release-corpus-products")
    assert_no_sideways_scroll(browser, "the page after the PASS")
    chart = browser.find_element(By.CSS_SELECTOR, "#chart svg")
    assert chart.size["width"] > 300 and chart.size["height"] > 150
    assert browser.find_elements(By.ID, "override-promote_anyway")
    assert browser.find_elements(By.ID, "override-rollback")
    browser.save_screenshot(str(tmp_path / SCREENSHOTS[0]))
    keep(tmp_path, SCREENSHOTS[0])

    # 3. The run link leads to Airflow's own page of that run.
    link = browser.find_element(By.CSS_SELECTOR, f"#decisions a[href$='{quote(run_id, safe='')}']")
    link.click()
    wait.until(lambda d: f"/dags/{REFRESH}/runs/" in d.current_url)
    assert browser.current_url.endswith(f"/dags/{REFRESH}/runs/{quote(run_id, safe='')}"), (
        browser.current_url
    )

    # 4. A bad partition lands (the newest day, labels flipped); the next refresh's gate
    #    says FAIL: a decision, so the run is green with the release skipped, and the
    #    banner says so, with the numbers; production stays.
    flip_labels(store, DAY2)
    bad = server.trigger(REFRESH, "ui-bad-partition", None, {})["dag_run_id"]
    assert server.wait_for_run(REFRESH, bad, timeout=600)["state"] == "success"
    assert task_states(server.task_instances(REFRESH, bad))["release"] == "skipped"
    # The search check refuses the same candidate on its own (no gate to lean on): its
    # vectors, loaded and searched through the index, lose nDCG@10 against production's.
    root = server.env["EMBEDFRESH_ARTIFACT_ROOT"]
    for job in ("embed", "embed_verify", "index_load"):
        done = run_job(job, f"artifact_root={root}", f"run_id={bad}", f"version={bad}")
        assert done.returncode == 0, done.stderr[-2000:]
    refused = run_job("search_check", f"artifact_root={root}", f"run_id={bad}", f"version={bad}")
    assert refused.returncode == 3, refused.stderr[-2000:]
    check = json.loads(
        (
            Path(root.removeprefix("file://")) / f"runs/tiny/{bad}/reports/search-products.json"
        ).read_text()
    )
    assert check["verdict"] == "FAIL" and check["regression"]["with"]["release"] == run_id, check
    assert check["ndcg_at_10"] < check["regression"]["with"]["ndcg_at_10"]
    browser.get(page)
    banner = wait.until(ec.presence_of_element_located((By.ID, "banner")))
    assert browser.find_element(By.ID, "banner-production").text == run_id, banner.text
    assert browser.find_element(By.ID, "banner-release").text == run_id, banner.text
    assert "Last refresh: FAIL" in banner.text, banner.text
    reason = browser.find_element(By.ID, "banner-reason").text
    assert "worse than production" in reason and "the SLA allows 0.1%" in reason, reason
    # The overrides' Params: promote anyway the refused candidate with the live release's
    # corpora; a rollback takes a release (none kept before this first one yet).
    confs = {
        action: json.loads(browser.find_element(By.ID, f"override-conf-{action}").text)
        for action in ("promote_anyway", "rollback")
    }
    assert confs["promote_anyway"] == {
        "model": "tiny", "version": bad, "corpora": ["products"], "reason": ""
    }  # fmt: skip
    assert confs["rollback"] == {"model": "tiny", "release": "", "reason": ""}
    time.sleep(1)
    browser.save_screenshot(str(tmp_path / SCREENSHOTS[1]))
    keep(tmp_path, SCREENSHOTS[1])

    # 5. A viewer sees the page, without the override links.
    log_in(browser, server, "viewer")
    browser.get(page)
    wait.until(ec.presence_of_element_located((By.ID, "banner")))
    assert not browser.find_elements(By.ID, "overrides")
    assert not browser.find_elements(By.CSS_SELECTOR, "a.override")
