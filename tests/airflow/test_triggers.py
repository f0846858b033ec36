"""Every DAG triggered as a new user does, through the REST API of the real scheduler
(the session's server, server.py): ``POST .../dagRuns`` with an empty conf and no
logical date, which is what the Trigger form sends with its defaults. The runs use the
Params' defaults, so they read the server's default artifact root, filled here by
``python -m embedfresh.jobs.generate_data`` (the demo store, at the tests' small sizes).

A manual run without logical date has no data interval: the refresh trains on the
newest partition, which the jobs look up when they start. The refresh runs first (its
promotion is the production version that ``corpus_embeddings`` and
``accelerator_parity`` start from), ``fleet_health`` beside it; then the other two side
by side, and a refresh given a day the store does not hold, which fails at its first
task naming the days there are (a manual run does not wait for data). The refresh's device steps and ``fleet_health``'s check
share the accelerator pool's one slot: they never overlap.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.airflow.server import REFRESH, AirflowServer, task_states
from tests.conftest import DATA

pytestmark = pytest.mark.slow

HEALTH, CORPUS, PARITY = "fleet_health", "corpus_embeddings", "accelerator_parity"


def trigger_with_defaults(server: AirflowServer, dag_id: str, run_id: str) -> dict:
    """What the Trigger form sends with its defaults: no logical date, an empty conf."""
    created = server.trigger(dag_id, run_id, None, {})
    assert created["logical_date"] is None and created["conf"] == {}
    return created


def assert_succeeded(server: AirflowServer, dag_id: str, run_id: str) -> dict[str, str]:
    run = server.wait_for_run(dag_id, run_id, timeout=600)
    states = task_states(server.task_instances(dag_id, run_id))
    assert run["state"] == "success", server.explain(dag_id, run_id)
    # A refresh whose gate and search check decided has nothing to ask a person.
    done = {k: v for k, v in states.items() if not (k == "approve" and v == "skipped")}
    assert set(done.values()) == {"success"}, states
    return states


def test_every_dag_runs_to_success_triggered_with_its_defaults(demo_store: AirflowServer):
    server = demo_store
    root = server.env["EMBEDFRESH_ARTIFACT_ROOT"]
    store = Path(root.removeprefix("file://"))
    for dag_id in (HEALTH, CORPUS, PARITY):
        server.wait_for_dag(dag_id)

    # A bad day is refused at the door: the Param's pattern, before any run exists.
    bad = httpx.post(
        f"{server.base_url}/api/v2/dags/{REFRESH}/dagRuns",
        headers={"Authorization": f"Bearer {server.token}"},
        json={"logical_date": None, "conf": {"day": "2026-1-2"}},
        timeout=60,
    )
    assert bad.status_code == 400, bad.text

    trigger_with_defaults(server, REFRESH, "defaults-refresh")
    # Unpaused after the trigger: fleet_health's own scheduled run queues behind ours.
    trigger_with_defaults(server, HEALTH, "defaults-health")
    server.unpause(HEALTH)

    states = assert_succeeded(server, REFRESH, "defaults-refresh")
    assert [k for k in states if k.startswith("embed[")] == [
        f"embed[{i}]" for i in range(DATA["corpus_rows"] // DATA["corpus_shard_rows"])
    ]
    run_dir = store / "runs/tiny/defaults-refresh"
    # No logical date, no day: the newest partition, for the trial and the training.
    train = json.loads((run_dir / "reports/train.json").read_text())
    assert train["data_interval"] == ["2026-01-02", "2026-01-03"]
    registry = json.loads((store / "models/tiny/registry.json").read_text())
    assert registry["production"]["version"] == "defaults-refresh"

    # The two DAGs that start from the production version, side by side; the README's
    # next step (trigger the refresh again with the defaults: it retrains the newest day
    # from what is now production); and a refresh of a day the store does not hold.
    for dag_id in (CORPUS, PARITY):
        server.unpause(dag_id)
        trigger_with_defaults(server, dag_id, f"defaults-{dag_id}")
    trigger_with_defaults(server, REFRESH, "defaults-again")
    server.trigger(REFRESH, "missing-day", None, {"day": "2026-03-01"})

    assert_succeeded(server, HEALTH, "defaults-health")
    # The accelerator pool (one slot): fleet_health's check, triggered beside the
    # refresh, waited for the slot; no two device steps of the two runs overlapped.
    device = [
        ti
        for dag_id, run_id in ((REFRESH, "defaults-refresh"), (HEALTH, "defaults-health"))
        for ti in server.task_instances(dag_id, run_id)
        if ti["pool"] == "embedfresh_accelerator"
    ]
    assert sorted(ti["task_id"] for ti in device) == ["compile", "health", "health", "train"]
    spans = sorted((ti["start_date"], ti["end_date"], ti["dag_id"]) for ti in device)
    overlaps = [(a, b) for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]
    assert not overlaps, spans
    assert_succeeded(server, CORPUS, f"defaults-{CORPUS}")
    manifest = store / "embeddings/tiny/defaults-refresh/products/_MANIFEST.json"
    assert json.loads(manifest.read_text())["rows"] == DATA["corpus_rows"]
    assert_succeeded(server, PARITY, f"defaults-{PARITY}")
    gate = json.loads((store / f"runs/tiny/defaults-{PARITY}/reports/gate.json").read_text())
    assert gate["verdict"] == "PASS"

    # The same day again from production: whatever the gate decides, the run is green;
    # unless PASS, production stays; the decision is the gate's XCom and the page's (the
    # run index the page reads).
    run = server.wait_for_run(REFRESH, "defaults-again", timeout=600)
    assert run["state"] == "success", server.explain(REFRESH, "defaults-again")
    again = task_states(server.task_instances(REFRESH, "defaults-again"))
    decision = json.loads((store / "runs/tiny/defaults-again/reports/gate.json").read_text())
    registry = json.loads((store / "models/tiny/registry.json").read_text())
    if decision["verdict"] == "PASS":
        assert (
            again["release"] == "success" and registry["production"]["version"] == "defaults-again"
        )
    else:
        assert again["gate"] == "success" and again["release"] == "skipped", again
        assert registry["production"]["version"] == "defaults-refresh"
        # FAIL: nothing after the gate runs. INCONCLUSIVE: this server asks a person
        # (approvals on), so the candidate is embedded and checked, and nobody answers
        # before the timeout: Reject, the default.
        if decision["verdict"] == "FAIL":
            assert again["embed"] == "skipped", again
        else:
            assert again["approve"] == "success", again
    page = httpx.get(
        f"{server.base_url}/model-quality/api/models/tiny/decisions",
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=30,
    ).json()
    listed = {d["run_id"]: d["verdict"] for d in page["data"]}
    assert listed["defaults-again"] == decision["verdict"], page

    # A manual run of a day the store does not hold fails at its first task, at once and
    # for good (a manual run does not wait for data), naming the days the store holds.
    run = server.wait_for_run(REFRESH, "missing-day", timeout=300)
    assert run["state"] == "failed"
    tis = {ti["task_id"]: ti for ti in server.task_instances(REFRESH, "missing-day")}
    wait = tis["wait_for_partition"]
    assert (wait["state"], wait["try_number"]) == ("failed", 1)
    assert tis["health"]["state"] == tis["compile"]["state"] == "upstream_failed"
    log = server.task_log(REFRESH, "missing-day", "wait_for_partition", 1)
    assert "AirflowFailException" in log and "A manual run does not wait for data" in log
    assert f"missing training partition {root}/datasets/products/train/dt=2026-03-01" in log
    assert "it holds dt=2026-01-01, dt=2026-01-02" in log
