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
