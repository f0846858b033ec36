"""SIGKILL of the training job mid-run, under the real scheduler: the ``train`` task fails,
Airflow retries it (the DAG's own retry policy), and the retry resumes from the newest
committed checkpoint instead of starting over; the run then succeeds.

The kill goes to the job (``python -m embedfresh.jobs.train``, a subprocess of the task runner in
its own process group), not to the Airflow task runner: the runner sees the job die
with -9 and fails the try, which is what a crashed node or an OOM kill looks like.
dag.test() would retry too (it re-schedules up_for_retry tasks), but only the scheduler
shows the retry as Airflow runs it in production: try 2 of the same task instance.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.airflow.server import REFRESH, AirflowServer, job_pids, task_states

pytestmark = pytest.mark.slow


def test_sigkilled_training_resumes_from_its_checkpoint_on_retry(
    refresh_dag: AirflowServer, root: str
):
    server = refresh_dag
    run_id = "kill-and-resume"
    artifacts = Path(root.removeprefix("file://"))
    checkpoints = artifacts / "runs/tiny" / run_id / "checkpoints"
    report = artifacts / "runs/tiny" / run_id / "reports/train.json"
    # 3 epochs (the Param default) of 32 steps: one checkpoint, at step 50 of 96. A manual
    # run trains on its conf's day, never on its data interval.
    server.trigger(
        REFRESH, run_id, "2026-01-02T12:00:00Z", {"artifact_root": root, "day": "2026-01-01"}
    )

    committed = server.wait_for(
        lambda: sorted(checkpoints.glob("step-*/COMMIT")), 240, "a committed checkpoint", 0.05
    )
    pids = job_pids("embedfresh.jobs.train", run_id)
    assert len(pids) == 1, f"expected one training job process, found {pids}"
    os.kill(pids[0], signal.SIGKILL)
    killed_at_step = int(committed[-1].parent.name.removeprefix("step-"))
    # The kill landed mid-run: the job had not written its report yet.
    assert not report.exists(), "the training job finished before it could be killed"

    run = server.wait_for_run(REFRESH, run_id)
    tis = server.task_instances(REFRESH, run_id)
    assert run["state"] == "success", server.explain(REFRESH, run_id)
    states = task_states(tis)
    # The session's server asks for approval (EMBEDFRESH_APPROVAL_TIMEOUT_MINUTES): the
    # approve task skips when the gate decides.
    assert states.pop("approve") == "skipped", states
    assert set(states.values()) == {"success"}, states
    (train_ti,) = [ti for ti in tis if ti["task_id"] == "train"]
    assert train_ti["try_number"] == 2

    tries = server.api("GET", f"/dags/{REFRESH}/dagRuns/{run_id}/taskInstances/train/tries")
    states = {t["try_number"]: t["state"] for t in tries["task_instances"]}
    assert states[1] != "success" and states[2] == "success", states

    # Both tries' jobs were forked by the fork server (the fast start): the kill, the
    # retry and the resume hold with it.
    for try_number in (1, 2):
        log = server.task_log(REFRESH, run_id, "train", try_number)
        assert "Job forked by the fork server" in log, log[-2000:]

    train = json.loads(report.read_text())
    assert train["data_interval"] == ["2026-01-01", "2026-01-02"]
    assert train["resumed_from"]["step"] == killed_at_step
    assert train["resumed_from"]["url"].endswith(f"step-{killed_at_step:08d}")
    assert train["steps"] == 96
    registry = json.loads((artifacts / "models/tiny/registry.json").read_text())
    assert registry["production"]["version"] == run_id
