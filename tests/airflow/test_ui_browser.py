"""The web UI as a new user uses it, in headless chromium (Selenium) against the
session's real Airflow (api-server, scheduler, dag-processor; server.py) with real users.

The admin logs in through Airflow's login page, opens the refresh DAG, presses Trigger
and submits the form with its defaults; the run (a manual run: the newest partition of
the demo store) succeeds through the scheduler. The "Model quality" page's banner then
names the new production version, the run link leads to Airflow's page of that run, and
the chart is there. A second refresh on a bad partition (labels flipped) fails the gate:
the banner says FAIL and why, production stays. A viewer sees the page without the
override links. Screenshots (a PASS and a FAIL page) go to the test's tmp folder and to
``$EMBEDFRESH_SCREENSHOT_DIR`` when set (docs/images/ holds copies).

Chromium and chromedriver come from Debian (.ci/run installs them); without them this
test FAILS, it never skips.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from embedfresh.core.storage import ArtifactStore
from tests.airflow.server import REFRESH, AirflowServer
from tests.airflow.test_gate_failure import flip_labels
from tests.browser import chromium
from tests.conftest import DAY2

pytestmark = pytest.mark.slow

SCREENSHOTS = ("model-quality-pass.png", "model-quality-fail.png")


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium() as driver:
        yield driver


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


def keep(tmp_path: Path, name: str) -> None:
    assert (tmp_path / name).stat().st_size > 10_000
    if directory := os.environ.get("EMBEDFRESH_SCREENSHOT_DIR"):  # pytest prunes tmp
        Path(directory).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, Path(directory) / name)


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

    # 2. The page: the banner names the new production version, PASS, and why.
    browser.get(page)
    banner = wait.until(ec.presence_of_element_located((By.ID, "banner")))
    assert browser.find_element(By.ID, "banner-production").text == run_id, banner.text
    assert "Last refresh: PASS" in banner.text, banner.text
    assert browser.find_element(By.ID, "banner-reason").text, banner.text
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

    # 4. A bad partition lands (the newest day, labels flipped); the next refresh fails
    #    at the gate and the banner says so, with the numbers; production stays.
    flip_labels(store, DAY2)
    bad = server.trigger(REFRESH, "ui-bad-partition", None, {})["dag_run_id"]
    assert server.wait_for_run(REFRESH, bad, timeout=600)["state"] == "failed"
    browser.get(page)
    banner = wait.until(ec.presence_of_element_located((By.ID, "banner")))
    assert browser.find_element(By.ID, "banner-production").text == run_id, banner.text
    assert "Last refresh: FAIL" in banner.text, banner.text
    reason = browser.find_element(By.ID, "banner-reason").text
    assert "worse than production" in reason and "the SLA allows 0.1%" in reason, reason
    time.sleep(1)
    browser.save_screenshot(str(tmp_path / SCREENSHOTS[1]))
    keep(tmp_path, SCREENSHOTS[1])

    # 5. A viewer sees the page, without the override links.
    log_in(browser, server, "viewer")
    browser.get(page)
    wait.until(ec.presence_of_element_located((By.ID, "banner")))
    assert not browser.find_elements(By.ID, "overrides")
    assert not browser.find_elements(By.CSS_SELECTOR, "a.override")
