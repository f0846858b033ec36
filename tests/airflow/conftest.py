"""One real Airflow server per test session, shared by the scheduler tests, with the
refresh DAG parsed and unpaused through the REST API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.airflow.server import REFRESH, AirflowServer


@pytest.fixture(scope="session")
def airflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    """Airflow (api-server, scheduler, dag-processor) on 127.0.0.1 in a throw-away
    AIRFLOW_HOME; its process group is ended at the end of the session, also when a test
    failed."""
    home = tmp_path_factory.mktemp("airflow-server")
    # The Params' default root: only the scheduler's own runs use it (tests pass theirs).
    server = AirflowServer(home, f"file://{tmp_path_factory.mktemp('default-artifacts')}")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def refresh_dag(airflow_server: AirflowServer) -> AirflowServer:
    """The server, once ``embedding_model_refresh`` is parsed and unpaused.

    Unpausing a daily DAG with catchup off makes the scheduler start a run for yesterday
    at once; it would hold the DAG's only active-run slot (and has no data in the default
    root), so it is marked failed through the API: the tests trigger their own runs.
    """
    airflow_server.wait_for_dag(REFRESH)
    assert airflow_server.unpause(REFRESH)["is_paused"] is False

    def scheduled_runs() -> list[dict]:
        runs = airflow_server.api("GET", f"/dags/{REFRESH}/dagRuns")["dag_runs"]
        return [r for r in runs if r["run_type"] == "scheduled"]

    for run in airflow_server.wait_for(scheduled_runs, 60, "the scheduler's run of yesterday"):
        path = f"/dags/{REFRESH}/dagRuns/{run['dag_run_id']}"
        airflow_server.api("PATCH", path, json={"state": "failed"})
    return airflow_server
