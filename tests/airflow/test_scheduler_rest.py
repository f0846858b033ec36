"""A real scheduler run of ``embedding_model_refresh``: triggered through the REST API
(``/api/v2``) of a real api-server + scheduler + dag-processor on 127.0.0.1 (server.py),
polled to success, and every task instance (the mapped embed tasks one by one) read back
through the API.

Tiny model and the conftest data set (1,024 training rows, a 600-row corpus in 3 shards),
so the run takes tens of seconds on 2 cores. Three epochs, the Param default: with one
or two, the first candidate's AUC against the random-init baseline is INCONCLUSIVE on
768 eval rows and the gate (rightly) stops the run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.airflow.server import REFRESH, AirflowServer, task_states
from tests.conftest import DATA

pytestmark = pytest.mark.slow


def test_triggered_refresh_runs_to_success_through_the_rest_api(
    refresh_dag: AirflowServer, root: str
):
    server = refresh_dag
    assert server.api("GET", f"/dags/{REFRESH}")["is_paused"] is False
    run_id = "rest-trigger"
    # A manual run never trains on its data interval: the conf's day names the partition,
    # 2026-01-01, the first generated day (not the newest, 2026-01-02).
    created = server.trigger(
        REFRESH,
        run_id,
        "2026-01-02T00:00:00Z",
        {"artifact_root": root, "epochs": 3, "day": "2026-01-01"},
    )
    assert created["dag_run_id"] == run_id and created["conf"]["epochs"] == 3

    run = server.wait_for_run(REFRESH, run_id)
    states = task_states(server.task_instances(REFRESH, run_id))
    assert run["state"] == "success", server.explain(REFRESH, run_id)

    # Every task of the DAG ran and succeeded; embed once per corpus shard.
    dag_tasks = {t["task_id"] for t in server.api("GET", f"/dags/{REFRESH}/tasks")["tasks"]}
    assert {"train", "evaluate", "gate", "embed", "verify", "load_index", "release"} <= dag_tasks
    shards = DATA["corpus_rows"] // DATA["corpus_shard_rows"]
    assert {k.split("[")[0] for k in states} == dag_tasks
    assert [k for k in states if k.startswith("embed[")] == [f"embed[{i}]" for i in range(shards)]
    # verify, load_index and search_check: once per corpus (the corpora Param: products).
    assert [k for k in states if k.startswith("load_index")] == ["load_index[0]"]
    # The approval had nothing to ask (the gate and the search check decided): skipped.
    assert states.pop("approve") == "skipped"
    assert set(states.values()) == {"success"}, states

    # The train task's XCom, read through the API: three epochs over 1,024 rows, batch 32.
    xcom = server.api(
        "GET", f"/dags/{REFRESH}/dagRuns/{run_id}/taskInstances/train/xcomEntries/return_value"
    )
    summary = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert summary["steps"] == 3 * DATA["train_rows"] // 32 and summary["version"] == run_id

    # What the run left in the artifact store.
    artifacts = Path(root.removeprefix("file://"))
    train = json.loads((artifacts / "runs/tiny" / run_id / "reports/train.json").read_text())
    assert train["data_interval"] == ["2026-01-01", "2026-01-02"]
    registry = json.loads((artifacts / "models/tiny/registry.json").read_text())
    assert registry["production"]["version"] == registry["production"]["release"] == run_id
    manifest = artifacts / "embeddings/tiny" / run_id / "products/_MANIFEST.json"
    assert manifest.exists()

    # The next days, on this production: when nothing decides, a person does.
    undecided_days_ask_a_person(server, root)


def _undecided_day(server: AirflowServer, root: str, run_id: str) -> None:
    """A refresh that cannot decide: day 1 again, from the production that trained on it,
    judged on 10 queries (the judged_queries Param), fewer than the gate's min_queries
    (300) a PASS rests on, however the interval falls (one more epoch improves the tiny
    model clearly). The run parks at ``approve`` (awaiting_input), holding no worker."""
    conf = {"artifact_root": root, "epochs": 1, "day": "2026-01-01", "judged_queries": 10}
    server.trigger(REFRESH, run_id, None, conf)

    def parked() -> bool:
        states = task_states(server.task_instances(REFRESH, run_id))
        finished = server.dag_run(REFRESH, run_id)["state"] in ("success", "failed")
        assert not finished and "failed" not in states.values(), (
            f"{server.explain(REFRESH, run_id)}\ngate: {_xcom(server, run_id, 'gate')}"
        )
        return states.get("approve") == "awaiting_input"

    server.wait_for(parked, 300, f"run {run_id} to ask for an approval", every=2)


def _xcom(server: AirflowServer, run_id: str, task_id: str) -> dict:
    path = f"/dags/{REFRESH}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
    value = server.api("GET", path)["value"]
    return value if isinstance(value, dict) else json.loads(value)


def undecided_days_ask_a_person(server: AirflowServer, root: str) -> None:
    """Approvals on (the session's server: EMBEDFRESH_APPROVAL_TIMEOUT_MINUTES=0.5), after a
    release made production. An INCONCLUSIVE gate goes on to embed, load and check the
    candidate; ``approve`` asks. Approved through the human-in-the-loop REST API with a
    reason: the candidate goes live, the release and the registry's history record who
    and why. Unanswered: the timeout's default is Reject, nothing is released."""
    artifacts = Path(root.removeprefix("file://"))

    _undecided_day(server, root, "approve-yes")
    assert _xcom(server, "approve-yes", "gate")["verdict"] == "INCONCLUSIVE"
    detail = f"/dags/{REFRESH}/dagRuns/approve-yes/taskInstances/approve/-1/hitlDetails"
    asked = server.api("GET", detail)
    assert asked["options"] == ["Approve", "Reject"] and asked["defaults"] == ["Reject"]
    assert "Gate: INCONCLUSIVE" in asked["body"] and "/model-quality/?model=tiny" in asked["body"]
    reason = "judged on 10 queries only: fine for this test"
    server.api(
        "PATCH", detail, json={"chosen_options": ["Approve"], "params_input": {"reason": reason}}
    )
    assert server.wait_for_run(REFRESH, "approve-yes")["state"] == "success"
    release = json.loads((artifacts / "models/tiny/releases/approve-yes.json").read_text())
    assert release["action"] == "promote_anyway" and release["who"] == "admin"
    assert release["why"] == f"approved in run approve-yes: {reason}"
    assert release["gate"]["verdict"] == "INCONCLUSIVE"
    registry = json.loads((artifacts / "models/tiny/registry.json").read_text())
    assert registry["production"]["release"] == "approve-yes"
    assert registry["history"][-1]["who"] == "admin" and reason in registry["history"][-1]["why"]

    _undecided_day(server, root, "approve-none")
    assert server.wait_for_run(REFRESH, "approve-none", timeout=240)["state"] == "success"
    states = task_states(server.task_instances(REFRESH, "approve-none"))
    assert states["approve"] == "success" and states["release"] == "skipped", states
    # The timeout's default answered (no XCom is left by a timed-out HITL task): Reject,
    # which skips what follows.
    log = server.task_log(REFRESH, "approve-none", "approve", 1)
    assert "Skipping downstream tasks" in log and "Approved." not in log, log[-2000:]
    assert not (artifacts / "models/tiny/releases/approve-none.json").exists()
    after = json.loads((artifacts / "models/tiny/registry.json").read_text())
    assert after["production"]["release"] == "approve-yes"
