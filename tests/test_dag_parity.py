"""``dag.test()`` of accelerator_parity on the embedded default: cpu against cpu from the
production version, dropout 0 (the Param default), one epoch: the curves agree, PASS.

Runs in a fresh interpreter against a throw-away AIRFLOW_HOME (tests/airflow_home.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.airflow_home import (
    DAG_TEST_HELPERS,
    DAGS_FOLDER,
    airflow_home,
    promote_initial_version,
    run_in_airflow,
)
from tests.conftest import write_data

pytestmark = pytest.mark.slow

DAG_TEST = (
    DAG_TEST_HELPERS
    + r"""
root, folder = sys.argv[1], sys.argv[2]
run = load_dag(folder, "accelerator_parity").test(
    logical_date=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
    run_conf={"artifact_root": root, "backend_b": "cpu", "epochs": 1, "eval_every": 16},
)
print(json.dumps(run_facts(run, ["parity"])))
"""
)


def test_parity_dag_passes_cpu_against_cpu(tmp_path: Path):
    artifacts = tmp_path / "artifacts"
    root = f"file://{artifacts}"
    write_data(root)
    promote_initial_version(root, "v1")

    env = airflow_home(tmp_path / "airflow-home", root)
    facts, output = run_in_airflow(DAG_TEST, env, root, str(DAGS_FOLDER), timeout=400)

    assert facts["state"] == "success", output
    assert facts["tasks"] == [["parity", -1, "success"]], output
    gate = json.loads(
        (artifacts / "runs" / "tiny" / facts["run_id"] / "reports" / "gate.json").read_text()
    )
    assert gate["verdict"] == "PASS", gate
    assert facts["xcom"]["parity"]["verdict"] == "PASS"
