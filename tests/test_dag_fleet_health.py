"""``dag.test()`` of fleet_health on the embedded default: the health job on cpu passes
and its report lands under the run; thresholds from the Params reach the job.

Runs in a fresh interpreter against a throw-away AIRFLOW_HOME (tests/airflow_home.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.airflow_home import DAG_TEST_HELPERS, DAGS_FOLDER, airflow_home, run_in_airflow

pytestmark = pytest.mark.slow

DAG_TEST = (
    DAG_TEST_HELPERS
    + r"""
root, folder, conf = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
run = load_dag(folder, "fleet_health").test(run_conf={"artifact_root": root, **conf})
print(json.dumps(run_facts(run, ["health"])))
"""
)


def _run(tmp_path: Path, conf: dict) -> tuple[dict, str, Path]:
    artifacts = tmp_path / "artifacts"
    root = f"file://{artifacts}"
    env = airflow_home(tmp_path / "airflow-home", root)
    facts, output = run_in_airflow(
        DAG_TEST, env, root, str(DAGS_FOLDER), json.dumps(conf), timeout=240
    )
    return facts, output, artifacts / "runs" / "tiny" / facts["run_id"] / "reports"


def test_fleet_health_passes_on_cpu_with_the_defaults(tmp_path: Path):
    facts, output, reports = _run(tmp_path, {})
    assert facts["state"] == "success", output
    assert facts["tasks"] == [["health", -1, "success"]], output
    report = json.loads((reports / "health.json").read_text())
    assert report["verdict"] == "PASS" and report["backend"] == "cpu"
    assert facts["xcom"]["health"]["verdict"] == "PASS"


def test_an_impossible_threshold_fails_the_task_without_retry(tmp_path: Path):
    # No single CPU shows 10 devices: the Param reaches the job, which exits 4.
    facts, output, reports = _run(tmp_path, {"expected_devices": 10})
    assert facts["state"] == "failed", output
    assert facts["tasks"] == [["health", -1, "failed"]], output
    report = json.loads((reports / "health.json").read_text())
    assert report["verdict"] == "FAIL" and report["failed"], report
    assert "exit code 4" in output
