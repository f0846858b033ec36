"""``dag.test()`` of embedding_model_refresh on the embedded default: every task succeeds,
from the health check to the corpus embedding with the promoted version.

Runs in a fresh interpreter against a throw-away AIRFLOW_HOME (tests/airflow_home.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.airflow_home import DAG_TEST_HELPERS, DAGS_FOLDER, airflow_home, run_in_airflow
from tests.conftest import DATA, write_data

pytestmark = pytest.mark.slow

# A daily data interval ends at the logical date of a manual run (Airflow 3): the run of
# 2026-01-02 00:00 trains on the partition of 2026-01-01, the first generated day.
DAG_TEST = (
    DAG_TEST_HELPERS
    + r"""
root, folder = sys.argv[1], sys.argv[2]
run = load_dag(folder, "embedding_model_refresh").test(
    logical_date=dt.datetime(2026, 1, 2, tzinfo=dt.UTC), run_conf={"artifact_root": root}
)
print(json.dumps(run_facts(run, ["health", "compile", "train"])))
"""
)


def test_dag_test_runs_every_task_on_the_embedded_default(tmp_path: Path):
    artifacts = tmp_path / "artifacts"
    root = f"file://{artifacts}"
    write_data(root)

    env = airflow_home(tmp_path / "airflow-home", root)
    facts, output = run_in_airflow(DAG_TEST, env, root, str(DAGS_FOLDER), timeout=400)

    shards = DATA["corpus_rows"] // DATA["corpus_shard_rows"]
    assert facts["state"] == "success", output
    single = ["health", "compile", "train", "evaluate", "gate", "promote", "list_shards", "verify"]
    assert facts["tasks"] == sorted(
        [*([t, -1, "success"] for t in single), *(["embed", i, "success"] for i in range(shards))]
    ), output

    run_id = facts["run_id"]
    reports = artifacts / "runs" / "tiny" / run_id / "reports"
    assert json.loads((reports / "health.json").read_text())["verdict"] == "PASS"
    assert json.loads((reports / "compile.json").read_text())["backend"] == "cpu"
    assert facts["xcom"]["health"]["verdict"] == "PASS"
    train = json.loads((reports / "train.json").read_text())
    # The data interval is the logical day and epochs came from the Param default (3).
    assert train["data_interval"] == ["2026-01-01", "2026-01-02"]
    assert facts["xcom"]["train"]["steps"] == 96  # 1024 rows / batch 32 x 3 epochs
    assert facts["xcom"]["train"]["version"] == run_id
    assert json.loads((reports / "gate.json").read_text())["verdict"] == "PASS"
    # The run ended well inside its deadline: no breach recorded.
    assert not (reports / "deadline.json").exists()

    registry = json.loads((artifacts / "models" / "tiny" / "registry.json").read_text())
    assert registry["production"]["version"] == run_id
    registry_url = f"file://{artifacts}/models/tiny/registry.json"
    manifest = artifacts / "embeddings" / "tiny" / run_id / "products" / "_MANIFEST.json"
    assert manifest.exists()
    assert facts["asset_events"] == [
        [
            "embedfresh://embeddings/tiny/products",
            {"version": run_id, "manifest": f"file://{manifest}", "rows": DATA["corpus_rows"]},
        ],
        ["embedfresh://models/tiny", {"version": run_id, "registry": registry_url}],
    ]
