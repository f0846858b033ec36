"""``dag.test()`` of embedding_model_refresh on the embedded default: every task succeeds,
including the corpus embedding with the promoted version.

Runs in a fresh interpreter against a throw-away AIRFLOW_HOME and SQLite database, so
nothing leaks between this test and the rest of the suite (or a developer's Airflow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DATA, ROOT, job_env, write_data

pytestmark = pytest.mark.slow

AIRFLOW = str(Path(sys.executable).with_name("airflow"))

# Runs in the child interpreter: one dag.test(), then the facts read back from the DB.
DAG_TEST = r"""
import datetime as dt, json, sys
from sqlalchemy import select
from airflow.dag_processing.dagbag import DagBag
from airflow.models import DagRun, TaskInstance
from airflow.models.asset import AssetEvent, AssetModel
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

root, dags_folder = sys.argv[1], sys.argv[2]
bag = DagBag(dag_folder=dags_folder)
assert not bag.import_errors, bag.import_errors
dag = bag.dags["embedding_model_refresh"]
# A daily data interval ends at the logical date of a manual run (Airflow 3): the run of
# 2026-01-02 00:00 trains on the partition of 2026-01-01, the first generated day.
run = dag.test(
    logical_date=dt.datetime(2026, 1, 2, tzinfo=dt.UTC), run_conf={"artifact_root": root}
)
with create_session() as session:
    dr = session.scalars(select(DagRun).where(DagRun.run_id == run.run_id)).one()
    tis = session.scalars(select(TaskInstance).where(TaskInstance.run_id == dr.run_id)).all()
    xcom = session.scalars(
        select(XComModel).where(
            XComModel.run_id == dr.run_id,
            XComModel.task_id == "train",
            XComModel.key == "return_value",
        )
    ).one()
    events = session.execute(
        select(AssetModel.uri, AssetEvent.extra).join(
            AssetModel, AssetModel.id == AssetEvent.asset_id
        )
    ).all()
    print(json.dumps({
        "run_id": dr.run_id,
        "state": str(dr.state),
        "tasks": {ti.task_id: str(ti.state) for ti in tis},
        "mapped_embed_tasks": sum(1 for ti in tis if ti.task_id == "embed"),
        "train_summary": XComModel.deserialize_value(xcom),
        "asset_events": [[uri, extra] for uri, extra in events],
    }))
"""


def test_dag_test_runs_every_task_on_the_embedded_default(tmp_path: Path):
    started = time.monotonic()
    artifacts = tmp_path / "artifacts"
    root = f"file://{artifacts}"
    write_data(root)

    home = tmp_path / "airflow-home"
    env = job_env(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "EMBEDFRESH_ARTIFACT_ROOT": root,
        }
    )
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    home.mkdir()
    migrate = subprocess.run(
        [AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True, timeout=180
    )
    assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-3000:]

    proc = subprocess.run(
        [sys.executable, "-c", DAG_TEST, root, str(ROOT / "dags")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, output
    facts = json.loads(proc.stdout.strip().splitlines()[-1])

    assert facts["state"] == "success", output
    assert facts["tasks"] == {
        "train": "success",
        "evaluate": "success",
        "gate": "success",
        "promote": "success",
        "list_shards": "success",
        "embed": "success",
        "verify": "success",
    }, output
    assert facts["mapped_embed_tasks"] == DATA["corpus_rows"] // DATA["corpus_shard_rows"]

    run_id = facts["run_id"]
    reports = artifacts / "runs" / "tiny" / run_id / "reports"
    train = json.loads((reports / "train.json").read_text())
    # The data interval is the logical day and epochs came from the Param default (3).
    assert train["data_interval"] == ["2026-01-01", "2026-01-02"]
    assert facts["train_summary"]["steps"] == 96  # 1024 rows / batch 32 x 3 epochs
    assert facts["train_summary"]["version"] == run_id
    assert json.loads((reports / "gate.json").read_text())["verdict"] == "PASS"

    registry = json.loads((artifacts / "models" / "tiny" / "registry.json").read_text())
    assert registry["production"]["version"] == run_id
    registry_url = f"file://{artifacts}/models/tiny/registry.json"
    manifest = artifacts / "embeddings" / "tiny" / run_id / "products" / "_MANIFEST.json"
    assert manifest.exists()
    assert sorted(facts["asset_events"]) == [
        [
            "embedfresh://embeddings/tiny/products",
            {"version": run_id, "manifest": f"file://{manifest}", "rows": DATA["corpus_rows"]},
        ],
        ["embedfresh://models/tiny", {"version": run_id, "registry": registry_url}],
    ]
    assert time.monotonic() - started < 240
