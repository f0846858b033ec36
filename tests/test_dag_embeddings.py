"""``dag.test()`` of corpus_embeddings on the embedded default: the version resolved from
the registry, one mapped embed task per corpus shard, the manifest and the Asset event.

Runs in a fresh interpreter against a throw-away AIRFLOW_HOME (tests/airflow_home.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.airflow_home import (
    DAG_TEST_HELPERS,
    DAGS_FOLDER,
    airflow_home,
    promote_initial_version,
    run_in_airflow,
)
from tests.conftest import DATA, write_data

pytestmark = pytest.mark.slow

DAG_TEST = (
    DAG_TEST_HELPERS
    + r"""
root, folder = sys.argv[1], sys.argv[2]
run = load_dag(folder, "corpus_embeddings").test(run_conf={"artifact_root": root})
print(json.dumps(run_facts(run)))
"""
)


def test_corpus_embeddings_embeds_every_shard_with_the_production_version(tmp_path: Path):
    artifacts = tmp_path / "artifacts"
    root = f"file://{artifacts}"
    write_data(root)
    promote_initial_version(root, "v1")

    env = airflow_home(tmp_path / "airflow-home", root)
    facts, output = run_in_airflow(DAG_TEST, env, root, str(DAGS_FOLDER), timeout=240)

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
