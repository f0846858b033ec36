"""The operators are reusable as they are: ``tests/airflow/dags/reuse_operators.py``
imports them like any other DAG repository and chains health -> embed (all shards in one
unmapped task) -> verify for a pinned model version. ``dag.test()`` runs it to success
in a fresh interpreter against a throw-away AIRFLOW_HOME whose DAGs folder is that one;
the test then reads the embeddings it wrote back from the store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.airflow_home import DAG_TEST_HELPERS, airflow_home, run_in_airflow
from tests.conftest import DATA

pytestmark = pytest.mark.slow

DAGS = Path(__file__).resolve().parent / "dags"
VERSION = "pinned-v1"

DAG_TEST = (
    DAG_TEST_HELPERS
    + r"""
root, folder, version = sys.argv[1], sys.argv[2], sys.argv[3]
run = load_dag(folder, "reuse_operators").test(
    logical_date=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
    run_conf={"artifact_root": root, "version": version},
)
print(json.dumps(run_facts(run, xcom_tasks=("health", "embed_all", "verify"))))
"""
)


def publish_version(root: str, version: str) -> None:
    """A committed model version (random-init tiny weights): what the DAG embeds with."""
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.checkpoint import cpu_state_dict
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec

    spec = get_spec("tiny")
    weights = cpu_state_dict(versions.build_model(spec, 0))
    versions.publish(ArtifactStore(root), spec, version, weights, {})


def test_a_dag_of_our_operators_chained_its_own_way_runs_to_success(root: str, tmp_path: Path):
    publish_version(root, VERSION)
    env = airflow_home(tmp_path / "airflow-home", root)
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS)
    facts, output = run_in_airflow(DAG_TEST, env, root, str(DAGS), VERSION, timeout=300)

    assert facts["state"] == "success", output
    assert facts["tasks"] == [
        ["embed_all", -1, "success"],
        ["health", -1, "success"],
        ["verify", -1, "success"],
    ], output
    assert facts["xcom"]["health"]["verdict"] == "PASS", facts["xcom"]

    # The manifest's rows and each part's rows match the corpus, id for id.
    artifacts = Path(root.removeprefix("file://"))
    out = artifacts / "embeddings/tiny" / VERSION / "products"
    manifest = json.loads((out / "_MANIFEST.json").read_text())
    assert manifest["version"] == VERSION
    assert manifest["rows"] == DATA["corpus_rows"] == facts["xcom"]["verify"]["rows"]
    corpus_ids = sorted(
        i
        for p in (artifacts / "corpora/products").glob("part-*.parquet")
        for i in pq.read_table(p, columns=["id"]).column("id").to_pylist()
    )
    embedded = [pq.read_table(out / name) for name in sorted(manifest["parts"])]
    assert sorted(i for t in embedded for i in t.column("id").to_pylist()) == corpus_ids
    assert {v for t in embedded for v in t.column("model_version").to_pylist()} == {VERSION}
    assert facts["asset_events"] == [
        [
            "embedfresh://embeddings/tiny/products",
            {"version": VERSION, "manifest": f"file://{out / '_MANIFEST.json'}", "rows": 600},
        ]
    ], output
