"""``dag.test()`` of corpus_embeddings on the embedded default: the version resolved from
the registry, one mapped embed task per corpus shard, the manifest and the Asset event.

Runs in a fresh interpreter against a throw-away AIRFLOW_HOME and SQLite database, like
tests/test_dag_run.py.
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

DAG_TEST = r"""
import json, sys
from sqlalchemy import select
from airflow.dag_processing.dagbag import DagBag
from airflow.models import DagRun, TaskInstance
from airflow.models.asset import AssetEvent, AssetModel
from airflow.utils.session import create_session

root, dags_folder = sys.argv[1], sys.argv[2]
bag = DagBag(dag_folder=dags_folder)
assert not bag.import_errors, bag.import_errors
run = bag.dags["corpus_embeddings"].test(run_conf={"artifact_root": root})
with create_session() as session:
    dr = session.scalars(select(DagRun).where(DagRun.run_id == run.run_id)).one()
    tis = session.scalars(select(TaskInstance).where(TaskInstance.run_id == dr.run_id)).all()
    events = session.execute(
        select(AssetModel.uri, AssetEvent.extra).join(
            AssetModel, AssetModel.id == AssetEvent.asset_id
        )
    ).all()
    print(json.dumps({
        "run_id": dr.run_id,
        "state": str(dr.state),
        "tasks": sorted([ti.task_id, ti.map_index, str(ti.state)] for ti in tis),
        "asset_events": [[uri, extra] for uri, extra in events],
    }))
"""


def _publish_and_promote(root: str, version: str) -> None:
    from jobs.checkpoint import cpu_state_dict
    from jobs.model import versions
    from jobs.model.presets import get_spec
    from jobs.registry import Registry
    from jobs.storage import ArtifactStore

    store = ArtifactStore(root)
    spec = get_spec("tiny")
    versions.publish(store, spec, version, cpu_state_dict(versions.build_model(spec, 0)), {})
    Registry(store, "tiny").promote(version, None, {"verdict": "PASS", "test": True})


def test_corpus_embeddings_embeds_every_shard_with_the_production_version(tmp_path: Path):
    started = time.monotonic()
    artifacts = tmp_path / "artifacts"
    root = f"file://{artifacts}"
    write_data(root)
    _publish_and_promote(root, "v1")

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
        timeout=240,
    )
    output = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, output
    facts = json.loads(proc.stdout.strip().splitlines()[-1])

    shards = DATA["corpus_rows"] // DATA["corpus_shard_rows"]
    assert facts["state"] == "success", output
    assert facts["tasks"] == sorted(
        [
            ["resolve_version", -1, "success"],
            ["list_shards", -1, "success"],
            ["verify", -1, "success"],
            *(["embed", i, "success"] for i in range(shards)),
        ]
    ), output

    manifest_path = artifacts / "embeddings" / "tiny" / "v1" / "products" / "_MANIFEST.json"
    assert manifest_path.exists()
    manifest_url = f"file://{manifest_path}"
    assert facts["asset_events"] == [
        [
            "embedfresh://embeddings/tiny/products",
            {"version": "v1", "manifest": manifest_url, "rows": DATA["corpus_rows"]},
        ]
    ], output
    assert time.monotonic() - started < 150
