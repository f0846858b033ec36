"""Under AWS Batch, a task's XCom is the result record its own Batch job wrote, never one
an earlier execution left.

A task's health step on Batch: moto's API in process; its jobs really run, through
:class:`~tests.batch_harness.LocalBatchExecutor` (the container's command and
environment from the submitted job, Batch's own ``AWS_BATCH_JOB_ID``), so the only way a
summary reaches the operator is the record the job wrote to the store. With the executor
switched off, moto reports the job SUCCEEDED without running it, and the task fails with
a retryable error naming the record that does not exist, or, where an earlier execution
left one, naming that.

The whole refresh on Batch, every task's record written by its own Batch job and equal
to its XCom, and the XComs equal to the local runner's, is tests/test_refresh_on_batch.py.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException

from embedfresh.core import layout
from embedfresh.operators import AcceleratorHealthOperator
from tests.batch_harness import PYTHON, LocalBatchExecutor, describe, moto_batch, settings

DAG_ID = "embedding_model_refresh"
RUN_ID = "scheduled__2026-01-02T00:00:00+00:00"


@pytest.fixture
def batch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Moto's Batch (tests/batch_harness.py); jobs end at once without running."""
    yield from moto_batch(monkeypatch)


class OutletEvents(SimpleNamespace):
    """An outlet's events, as far as the operators use them: ``extra`` of a static
    Asset, ``add`` through an alias."""

    def add(self, asset: Any, extra: dict | None = None) -> None:
        self.__dict__.setdefault("added", []).append((asset, extra))


def context(task_id: str) -> dict[str, Any]:
    """What Airflow gives ``execute``, as far as these operators read it."""
    ti = SimpleNamespace(dag_id=DAG_ID, task_id=task_id, map_index=-1)
    return {"ti": ti, "outlet_events": defaultdict(OutletEvents)}


def record_path(store: Path, key: str) -> Path:
    return store / layout.result("tiny", RUN_ID, f"{DAG_ID}:{key}")


@pytest.mark.parametrize("executor_on", [True, False], ids=["executor-on", "executor-off"])
def test_a_batch_task_returns_only_what_its_job_wrote(
    tmp_path: Path, batch: Any, monkeypatch: pytest.MonkeyPatch, executor_on: bool
):
    """The same health task on Batch: with the executor the job runs and its record is
    the XCom; the executor then off, Batch still says SUCCEEDED but no job ran, and the
    retried task does not take the earlier execution's record as its own. Without any
    execution, it fails retryably naming the record that no job wrote."""
    executor = LocalBatchExecutor().install(monkeypatch)
    executor.enabled = executor_on

    def health() -> AcceleratorHealthOperator:
        return AcceleratorHealthOperator(
            task_id="health",
            model="tiny",
            artifact_root=f"file://{tmp_path}",
            run_id=RUN_ID,
            job_settings={"collectives": False},
            execution_mode="aws_batch",
            runner_settings=settings(python=PYTHON),
        )

    path = record_path(tmp_path, "health")
    if executor_on:
        summary = health().execute(context("health"))
        assert summary["verdict"] == "PASS"
        [run] = executor.executed
        record = json.loads(path.read_text())
        assert record["summary"] == summary and record["name"] == f"{DAG_ID}:health"
        assert record["execution"]["aws_batch_job_id"] == run.job_id
        # The job printed exactly what the operator returned; it reached the operator
        # through the record only (the Batch job's stdout is its log stream's).
        assert run.stdout.strip().splitlines()[-1] == json.dumps(summary, sort_keys=True)

        executor.enabled = False
        before = path.read_bytes()
        with pytest.raises(AirflowException, match="was left by another execution") as info:
            health().execute(context("health"))
        assert type(info.value) is AirflowException  # retried
        assert f"result record file://{path} " in str(info.value)
        assert path.read_bytes() == before and len(executor.executed) == 1
        return
    op = health()
    with pytest.raises(AirflowException, match="wrote no result record at") as info:
        op.execute(context("health"))
    assert type(info.value) is AirflowException  # retried
    assert f"file://{path}:" in str(info.value)
    assert describe(batch, op.runner.job_id)["status"] == "SUCCEEDED"
    assert executor.executed == [] and not path.exists()
