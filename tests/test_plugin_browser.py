"""The "Model quality" page in a real browser, served by a real ``airflow api-server``.

Real jobs (generate data, train, evaluate, gate, promote, health, embed, verify; tiny
model) fill an artifact store; the api-server starts on 127.0.0.1 with the repository's plugins folder and that
store; headless Debian chromium, driven by Selenium and chromedriver, logs in through the
Airflow login page, opens "Model quality" from the Airflow UI and checks the registry
row, the gate verdict and the chart. An unauthenticated request is refused. The
screenshots go to the test's tmp folder (copy one to docs/images/model-quality.png).

Chromium and chromedriver come from Debian (``apt-get install chromium
chromium-driver``, done by .ci/run); without them this test FAILS, it never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.airflow_home import AIRFLOW, airflow_home
from tests.browser import chromium
from tests.conftest import run_job

pytestmark = pytest.mark.slow

RUN_ID = "manual__2026-01-01T00:00:00+00:00"  # the id Airflow gives a manual DAG run
USER, PASSWORD = "admin", "model-quality-test-password"
HEALTH = ("collective_sizes=[4096,65536]", "collective_iters=2", "memory_bytes=1048576")
SCREENSHOTS = ("model-quality-in-airflow.png", "model-quality.png")


def _job(root: str, name: str, *sets: str) -> dict:
    result = run_job(name, f"artifact_root={root}", f"run_id={RUN_ID}", "model=tiny", *sets)
    assert result.returncode == 0, f"jobs.{name}: {result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def store(data_template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One promoted model, made by the real jobs as a manual DAG run would."""
    dest = tmp_path_factory.mktemp("browser") / "artifacts"
    shutil.copytree(data_template, dest)
    root = f"file://{dest}"
    _job(root, "train", "backend=cpu", "data_interval_start=2026-01-01", "epochs=3")
    _job(root, "evaluate", "backend=cpu")
    # Against the untrained baseline on the 768-row eval set, accuracy and AUC decide;
    # recall@10 on so few queries is INCONCLUSIVE (the gate asks for more data).
    gate = _job(root, "gate", 'metrics=["accuracy", "auc"]')
    assert gate["verdict"] == "PASS", gate
    _job(root, "promote")
    _job(root, "health", *HEALTH)
    _job(root, "embed", f"version={RUN_ID}")
    _job(root, "embed_verify", f"version={RUN_ID}")
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def server(store: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``airflow api-server`` on 127.0.0.1 with our plugins; stopped with its process group."""
    home = tmp_path_factory.mktemp("airflow-home")
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD}))
    port = _free_port()
    env = airflow_home(home, store)  # migrated SQLite, our DAGs and plugins folder
    env.update(
        {
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__API_AUTH__JWT_SECRET": "model-quality-browser-test-" + "s" * 40,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        }
    )
    log = (home / "api-server.log").open("w")
    proc = subprocess.Popen(
        [AIRFLOW, "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, ended as a whole below
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert proc.poll() is None, (home / "api-server.log").read_text()[-3000:]
            try:
                if _get(f"{base}/api/v2/monitor/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(1)
        else:
            pytest.fail(
                "api-server did not answer in 240 s:\n"
                + (home / "api-server.log").read_text()[-3000:]
            )
        yield base
    finally:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as driver:
        yield driver


def test_unauthenticated_requests_are_refused(server: str):
    status, body = _get(f"{server}/model-quality/api/models/tiny")
    assert status == 401, body
    assert json.loads(body) == {"detail": "Not authenticated"}
    status, body = _get(f"{server}/model-quality/")
    assert status == 401 and "Log in to Airflow" in body
    assert "manual__" not in body


def test_json_api_with_a_token_from_the_api_server(server: str):
    request = urllib.request.Request(
        f"{server}/auth/token",
        data=json.dumps({"username": USER, "password": PASSWORD}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        access = json.loads(r.read())["access_token"]

    def get(path: str) -> dict:
        request = urllib.request.Request(
            f"{server}{path}", headers={"Authorization": f"Bearer {access}"}
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())

    # The api-server loaded our plugin, and nothing else from the folder failed.
    plugins = {p["name"]: p for p in get("/api/v2/plugins")["plugins"]}
    ours = plugins["model_quality"]
    assert [a["url_prefix"] for a in ours["fastapi_apps"]] == ["/model-quality"]
    assert [v["url_route"] for v in ours["external_views"]] == ["model-quality"]
    assert get("/api/v2/plugins/importErrors")["total_entries"] == 0
    decisions = get("/model-quality/api/models/tiny/decisions")
    assert [d["run_id"] for d in decisions["data"]] == [RUN_ID]
    assert decisions["data"][0]["verdict"] == "PASS"


def test_login_and_model_quality_page_in_chromium(server: str, browser, tmp_path: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 90)
    browser.get(f"{server}/auth/login")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "input[type=password]")))
    browser.find_element(By.CSS_SELECTOR, "input[name=username], input[type=text]").send_keys(USER)
    browser.find_element(By.CSS_SELECTOR, "input[type=password]").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda d: "/auth/login" not in d.current_url)
    assert any(c["name"] == "_token" for c in browser.get_cookies()), browser.get_cookies()

    # Inside the Airflow UI: the external view embeds the page in an iframe.
    browser.get(f"{server}/plugin/model-quality")
    frame = wait.until(ec.presence_of_element_located((By.TAG_NAME, "iframe")))
    browser.switch_to.frame(frame)
    wait.until(ec.presence_of_element_located((By.ID, "decisions")))
    browser.switch_to.default_content()
    time.sleep(1)  # let the UI finish painting its navigation
    browser.save_screenshot(str(tmp_path / SCREENSHOTS[0]))

    # The page itself: registry row, gate verdict, chart.
    browser.get(f"{server}/model-quality/?model=tiny")
    decisions = wait.until(ec.presence_of_element_located((By.ID, "decisions")))
    row = decisions.find_element(By.CSS_SELECTOR, "tbody tr")
    verdict = row.find_elements(By.CSS_SELECTOR, "td")[1].text
    assert verdict in {"PASS", "FAIL", "INCONCLUSIVE"}, row.text
    assert RUN_ID in row.text
    link = row.find_element(By.TAG_NAME, "a").get_attribute("href")
    assert link.startswith(f"{server}/dags/embedding_model_refresh/runs/manual__2026-01-01"), link
    production = browser.find_element(By.ID, "production-version").text
    registry_rows = browser.find_elements(By.CSS_SELECTOR, "#registry tbody tr")
    assert verdict == "PASS" and production == RUN_ID
    assert len(registry_rows) == 1 and RUN_ID in registry_rows[0].text
    assert "PASS" in registry_rows[0].text
    assert browser.find_element(By.ID, "health-verdict").text.startswith("Latest verdict PASS")
    health = browser.find_element(By.ID, "health-ranks").text
    assert socket.gethostname() in health and "checks passed" in health
    embeddings = browser.find_element(By.CSS_SELECTOR, "#embeddings tbody tr").text
    assert "products" in embeddings and "verified" in embeddings and " 600 " in f" {embeddings} "
    chart = browser.find_element(By.CSS_SELECTOR, "#chart svg.quality-chart")
    assert chart.size["width"] > 300 and chart.size["height"] > 200
    # The chart the gate job wrote (reports/gate.vl.json), rendered by vl-convert.
    assert len(chart.find_elements(By.CSS_SELECTOR, "g.point_marks path")) == 2  # accuracy, auc
    assert chart.find_elements(By.CSS_SELECTOR, "g.sla_line_marks")
    assert "gate.vl.json" in browser.find_element(By.ID, "chart").text
    banner = browser.find_element(By.ID, "banner").text
    assert f"Production: {RUN_ID}" in banner and "Last refresh: PASS" in banner
    browser.save_screenshot(str(tmp_path / SCREENSHOTS[1]))
    keep = os.environ.get("EMBEDFRESH_SCREENSHOT_DIR")  # pytest prunes old tmp folders
    for name in SCREENSHOTS:
        assert (tmp_path / name).stat().st_size > 10_000
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(tmp_path / name, Path(keep) / name)
