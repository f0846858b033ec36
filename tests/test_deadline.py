"""The refresh DAG's Deadline Alert, with a real scheduler: a run that outlives its time
budget gets its breach recorded where a platform engineer looks.

The budget is set to a few seconds (``EMBEDFRESH_REFRESH_DEADLINE_SECONDS``, read when the
dag-processor parses the DAG). The DAG stays paused, so the triggered run stays queued and
outlives any budget without spending CPU; the deadline counts from the moment it was
queued, as in production. The scheduler marks the deadline missed and its LocalExecutor
runs ``embedfresh.operators.deadline.record_deadline_breach``. The breach then shows in Airflow's
Deadlines view of the run (the UI's REST endpoint), in the callback's log, and as
``runs/tiny/<run_id>/reports/deadline.json`` in the artifact store, and people are told
(an e-mail, received here by a real SMTP server).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import httpx
import pytest

from tests.airflow.server import REFRESH, AirflowServer
from tests.mailbox import Mailbox

pytestmark = pytest.mark.slow

BUDGET_S = 3
RUN_ID = "deadline-test"


def test_a_run_past_its_deadline_records_the_breach(tmp_path: Path):
    artifacts = tmp_path / "artifacts"
    root = f"file://{artifacts}"
    mailbox = Mailbox().start()  # the deployment's e-mail, to a real SMTP server
    server = AirflowServer(tmp_path / "airflow-home", root, extra_env=mailbox.env())
    server.env["EMBEDFRESH_REFRESH_DEADLINE_SECONDS"] = str(BUDGET_S)
    try:
        server.start()
        assert server.wait_for_dag(REFRESH)["is_paused"] is True
        conf = {"artifact_root": root, "day": "2026-01-01"}  # a manual run's day: its conf
        run = server.trigger(REFRESH, RUN_ID, "2026-01-02T00:00:00Z", conf)
        assert run["state"] == "queued"

        record_path = artifacts / "runs" / "tiny" / RUN_ID / "reports" / "deadline.json"
        server.wait_for(record_path.exists, 180, "the deadline callback's record", every=2)
        record = json.loads(record_path.read_text())
        # The callback tells people after it wrote the record.
        server.wait_for(mailbox.messages, 60, "the breach's e-mail", every=1)

        def ui_deadlines() -> list[dict]:
            response = httpx.get(
                f"{server.base_url}/ui/dags/{REFRESH}/dagRuns/{RUN_ID}/deadlines",
                headers={"Authorization": f"Bearer {server.token}"},
                timeout=30,
            )
            response.raise_for_status()
            return response.json()["deadlines"]

        (deadline,) = ui_deadlines()
        callback_logs = [
            p.read_text(errors="replace")
            for p in (server.home / "logs").rglob("*")
            if p.is_file() and "executor_callbacks" in str(p)
        ]
    finally:
        server.stop()
        mailbox.stop()

    assert record["dag_id"] == REFRESH and record["run_id"] == RUN_ID
    assert record["state_at_breach"] == "queued"
    assert record["interval_seconds"] == BUDGET_S
    queued = dt.datetime.fromisoformat(record["queued_at"])
    due = dt.datetime.fromisoformat(record["deadline_time"])
    assert due - queued == dt.timedelta(seconds=BUDGET_S)
    assert dt.datetime.fromisoformat(record["recorded_at"]) >= due

    assert deadline["missed"] is True
    assert deadline["alert_name"] == "refresh time budget"
    assert any("DEADLINE MISSED" in text and RUN_ID in text for text in callback_logs), (
        callback_logs or "no executor_callbacks log"
    )
    (mail,) = mailbox.messages()
    body = mail.get_body().get_content()
    assert RUN_ID in mail["Subject"] and "deadline" in mail["Subject"].lower(), mail["Subject"]
    assert f"Run {RUN_ID} of DAG {REFRESH} (model tiny) had not finished by its deadline" in body
    assert "reports/deadline.json" in body, body
