"""One real Airflow server per test session, shared by the scheduler tests, with the
refresh DAG parsed and unpaused through the REST API."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedfresh.operators.approval import APPROVAL_ENV
from tests.airflow.server import REFRESH, AirflowServer
from tests.conftest import write_demo_store
from tests.mailbox import Mailbox


@pytest.fixture(scope="session")
def airflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    """Airflow (api-server, scheduler, dag-processor) on 127.0.0.1 in a throw-away
    AIRFLOW_HOME; its process group is ended at the end of the session, also when a test
    failed."""
    home = tmp_path_factory.mktemp("airflow-server")
    # People are told, as a deployment configures it: e-mail to a real SMTP server of
    # the session's (server.mailbox), through an Airflow connection.
    mailbox = Mailbox().start()
    # The Params' default root, which the web UI shows too: runs triggered with the
    # defaults use it (fixture demo_store fills it); other tests pass their own root.
    # Approvals on, as a team that wants a person to decide an undecided day (off by
    # default): its refreshes ask when nothing decides, and time out after 30 s.
    server = AirflowServer(
        home,
        f"file://{tmp_path_factory.mktemp('default-artifacts')}",
        extra_env={**mailbox.env(), APPROVAL_ENV: "0.5"},
    )
    server.mailbox = mailbox
    try:
        yield server.start()
    finally:
        server.stop()
        mailbox.stop()


@pytest.fixture(scope="session")
def refresh_dag(airflow_server: AirflowServer) -> AirflowServer:
    """The server, once ``embedding_model_refresh`` is parsed and unpaused.

    Unpausing a daily DAG with catchup off makes the scheduler start a run for yesterday
    at once; it waits for yesterday's partition (checked: its log names the partition and
    what the store holds), which the default root never gets, holding the DAG's only
    active-run slot, so it is marked failed through the API: the tests trigger their own
    runs.
    """
    airflow_server.wait_for_dag(REFRESH)
    root = airflow_server.env["EMBEDFRESH_ARTIFACT_ROOT"]
    assert airflow_server.unpause(REFRESH)["is_paused"] is False

    def scheduled_runs() -> list[dict]:
        runs = airflow_server.api("GET", f"/dags/{REFRESH}/dagRuns")["dag_runs"]
        return [r for r in runs if r["run_type"] == "scheduled"]

    for run in airflow_server.wait_for(scheduled_runs, 60, "the scheduler's run of yesterday"):
        path = f"/dags/{REFRESH}/dagRuns/{run['dag_run_id']}"
        # What a user who unpauses sees: the run waits for its day's data, saying which
        # partition and what the store holds, rather than failing.
        waiting = airflow_server.wait_for(
            lambda path=path: _waiting_log(airflow_server, path),
            120,
            "the scheduled run's wait for its partition",
        )
        yesterday = run["data_interval_start"][:10]
        assert f"waiting for training partition {root}/datasets/products/train/dt={yesterday}" in (
            waiting
        ), waiting
        assert ": it holds " in waiting, waiting  # what the store holds
        airflow_server.api("PATCH", path, json={"state": "failed"})
    return airflow_server


def _waiting_log(server: AirflowServer, path: str) -> str | None:
    """The log of the run's ``wait_for_partition`` once it waits (rescheduled or
    deferred), else None."""
    ti = server.request("GET", f"{path}/taskInstances/wait_for_partition").json()
    if ti.get("state") not in ("up_for_reschedule", "deferred"):
        return None
    dag_id, run_id = path.split("/")[2], path.split("/")[4]
    return server.task_log(dag_id, run_id, "wait_for_partition", ti.get("try_number") or 1)


@pytest.fixture
def demo_store(refresh_dag: AirflowServer) -> AirflowServer:
    """The server, its default artifact root (the one the Params' defaults and the web
    UI use) made afresh by ``python -m embedfresh.jobs.generate_data`` at the tests'
    small sizes: the demo store a new user triggers against, with nothing promoted yet
    (whatever an earlier test left there is removed first)."""
    root = refresh_dag.env["EMBEDFRESH_ARTIFACT_ROOT"]
    shutil.rmtree(Path(root.removeprefix("file://")), ignore_errors=True)
    write_demo_store(root)
    return refresh_dag
