"""The refresh triggered as a new user does, through the REST API (``/api/v2``) of the
real scheduler (the session's api-server + scheduler + dag-processor on 127.0.0.1,
server.py): ``POST .../dagRuns`` with an empty conf and no logical date, which is what
the Trigger form sends with its defaults. The run uses the Params' defaults, so it reads
the server's default artifact root, filled here by ``python -m
embedfresh.jobs.generate_data`` (the demo store, at the tests' small sizes), and every
task instance (the mapped embed tasks one by one) is read back through the API.

A manual run without logical date has no data interval: the refresh trains on the
newest partition, which the jobs look up when they start. ``fleet_health`` (one health
task) is triggered beside it: the refresh's device steps and ``fleet_health``'s check
share the accelerator pool's one slot, so they never overlap. The run's gate decision is
what the model-quality page's API lists for it. Then a refresh given a day the store does
not hold fails at its first task naming the days there are (a manual run does not wait
for data), and a malformed day is refused at the door. On the production that refresh
made, the next days cannot decide, and a person does (approvals on): approved through
the human-in-the-loop API, or left unanswered until the timeout's Reject.

The other DAGs (``corpus_embeddings``, ``accelerator_parity``, ...) run under
``dag.test()`` in tests/test_dags.py; a FAIL releases nothing and skips everything after
the gate in tests/airflow/test_gate_failure.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from tests.airflow.server import REFRESH, AirflowServer, task_states
from tests.conftest import DATA, write_demo_store

pytestmark = pytest.mark.slow

HEALTH = "fleet_health"


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


@pytest.fixture(scope="module")
def defaults_refresh(refresh_dag: AirflowServer) -> AirflowServer:
    """The server once a refresh triggered with the defaults finished, ``fleet_health``
    triggered beside it, on a demo store made afresh (what ``demo_store`` makes, for the
    module): the production both tests start from."""
    server = refresh_dag
    root = server.env["EMBEDFRESH_ARTIFACT_ROOT"]
    shutil.rmtree(Path(root.removeprefix("file://")), ignore_errors=True)
    write_demo_store(root)
    server.wait_for_dag(HEALTH)

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
    server.wait_for_run(REFRESH, "defaults-refresh", timeout=600)
    return server


def test_the_refresh_runs_to_success_triggered_with_its_defaults(
    defaults_refresh: AirflowServer,
):
    server = defaults_refresh
    root = server.env["EMBEDFRESH_ARTIFACT_ROOT"]
    store = Path(root.removeprefix("file://"))

    states = assert_succeeded(server, REFRESH, "defaults-refresh")
    # Every task of the DAG ran; embed once per corpus shard; verify, load_index and
    # search_check once per corpus (the corpora Param: products).
    dag_tasks = {t["task_id"] for t in server.api("GET", f"/dags/{REFRESH}/tasks")["tasks"]}
    assert {"train", "evaluate", "gate", "embed", "verify", "load_index", "release"} <= dag_tasks
    assert {k.split("[")[0] for k in states} == dag_tasks
    assert [k for k in states if k.startswith("embed[")] == [
        f"embed[{i}]" for i in range(DATA["corpus_rows"] // DATA["corpus_shard_rows"])
    ]
    assert [k for k in states if k.startswith("load_index")] == ["load_index[0]"]
    # The train task's XCom, read through the API: the Params' three epochs, batch 32.
    summary = xcom(server, "defaults-refresh", "train")
    assert summary["steps"] == 3 * DATA["train_rows"] // 32, summary
    assert summary["version"] == "defaults-refresh"
    run_dir = store / "runs/tiny/defaults-refresh"
    # No logical date, no day: the newest partition, for the trial and the training.
    train = json.loads((run_dir / "reports/train.json").read_text())
    assert train["data_interval"] == ["2026-01-02", "2026-01-03"]
    registry = json.loads((store / "models/tiny/registry.json").read_text())
    assert registry["production"]["version"] == registry["production"]["release"]
    assert registry["production"]["release"] == "defaults-refresh"
    manifest = store / "embeddings/tiny/defaults-refresh/products/_MANIFEST.json"
    assert json.loads(manifest.read_text())["rows"] == DATA["corpus_rows"]

    # A refresh of a day the store does not hold (the DAG's one active run: after ours).
    server.trigger(REFRESH, "missing-day", None, {"day": "2026-03-01"})

    # The decision is the gate's report and the page's (the run index the page reads).
    decision = json.loads((run_dir / "reports/gate.json").read_text())
    page = httpx.get(
        f"{server.base_url}/model-quality/api/models/tiny/decisions",
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=30,
    ).json()
    listed = {d["run_id"]: d["verdict"] for d in page["data"]}
    assert listed["defaults-refresh"] == decision["verdict"], page

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


def test_an_undecided_day_approved_through_the_api_goes_live(defaults_refresh: AirflowServer):
    """Approvals on (the session's server: EMBEDFRESH_APPROVAL_TIMEOUT_MINUTES=0.5), after
    a release made production. An INCONCLUSIVE gate goes on to embed, load and check the
    candidate; ``approve`` asks. Approved through the human-in-the-loop REST API with a
    reason: the candidate goes live, the release and the registry's history record who
    and why."""
    server = defaults_refresh
    artifacts = Path(server.env["EMBEDFRESH_ARTIFACT_ROOT"].removeprefix("file://"))

    # A logical date whose interval the store does not hold: a manual run trains on the
    # conf's day, never on its data interval.
    undecided_day(server, "approve-yes", "2026-01-05T00:00:00Z")
    # Answered at once: the session's approvals time out after 30 s, which a loaded box
    # spent on the reads below when they came first (the timeout's Reject won, once).
    detail = f"/dags/{REFRESH}/dagRuns/approve-yes/taskInstances/approve/-1/hitlDetails"
    reason = "judged on 10 queries only: fine for this test"
    server.api(
        "PATCH", detail, json={"chosen_options": ["Approve"], "params_input": {"reason": reason}}
    )
    asked = server.api("GET", detail)
    assert asked["options"] == ["Approve", "Reject"] and asked["defaults"] == ["Reject"]
    assert "Gate: INCONCLUSIVE" in asked["body"] and "/model-quality/?model=tiny" in asked["body"]
    train = json.loads((artifacts / "runs/tiny/approve-yes/reports/train.json").read_text())
    assert train["data_interval"] == ["2026-01-02", "2026-01-03"]
    assert xcom(server, "approve-yes", "gate")["verdict"] == "INCONCLUSIVE"
    assert server.wait_for_run(REFRESH, "approve-yes")["state"] == "success"
    release = json.loads((artifacts / "models/tiny/releases/approve-yes.json").read_text())
    assert release["action"] == "promote_anyway" and release["who"] == "admin"
    assert release["why"] == f"approved in run approve-yes: {reason}"
    assert release["gate"]["verdict"] == "INCONCLUSIVE"
    registry = json.loads((artifacts / "models/tiny/registry.json").read_text())
    assert registry["production"]["release"] == "approve-yes"
    assert registry["history"][-1]["who"] == "admin" and reason in registry["history"][-1]["why"]


def test_an_undecided_day_nobody_answers_releases_nothing(defaults_refresh: AirflowServer):
    """Unanswered before the timeout, ``approve`` takes its default, Reject: nothing after
    it runs and production stays what it was."""
    server = defaults_refresh
    artifacts = Path(server.env["EMBEDFRESH_ARTIFACT_ROOT"].removeprefix("file://"))
    before = json.loads((artifacts / "models/tiny/registry.json").read_text())["production"]

    undecided_day(server, "approve-none", None)
    assert server.wait_for_run(REFRESH, "approve-none", timeout=240)["state"] == "success"
    states = task_states(server.task_instances(REFRESH, "approve-none"))
    assert states["approve"] == "success" and states["release"] == "skipped", states
    # The timeout's default answered (no XCom is left by a timed-out HITL task): Reject,
    # which skips what follows.
    log = server.task_log(REFRESH, "approve-none", "approve", 1)
    assert "Skipping downstream tasks" in log and "Approved." not in log, log[-2000:]
    assert not (artifacts / "models/tiny/releases/approve-none.json").exists()
    after = json.loads((artifacts / "models/tiny/registry.json").read_text())
    assert after["production"] == before


def undecided_day(server: AirflowServer, run_id: str, logical_date: str | None) -> None:
    """A refresh that cannot decide: the newest day again, from the production that
    trained on it, judged on 10 queries (the judged_queries Param), fewer than the gate's
    min_queries (300) a PASS rests on, however the interval falls (one more epoch improves
    the tiny model clearly). The run parks at ``approve`` (awaiting_input), holding no
    worker."""
    conf = {"epochs": 1, "day": "2026-01-02", "judged_queries": 10}
    server.trigger(REFRESH, run_id, logical_date, conf)

    def parked() -> bool:
        states = task_states(server.task_instances(REFRESH, run_id))
        finished = server.dag_run(REFRESH, run_id)["state"] in ("success", "failed")
        assert not finished and "failed" not in states.values(), (
            f"{server.explain(REFRESH, run_id)}\ngate: {xcom(server, run_id, 'gate')}"
        )
        return states.get("approve") == "awaiting_input"

    server.wait_for(parked, 300, f"run {run_id} to ask for an approval", every=2)


def xcom(server: AirflowServer, run_id: str, task_id: str) -> dict:
    """A refresh task's return value, read through the REST API."""
    path = f"/dags/{REFRESH}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
    value = server.api("GET", path)["value"]
    return value if isinstance(value, dict) else json.loads(value)
