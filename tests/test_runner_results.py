"""The XCom of every refresh task is the job's result record, identical under both runners.

The refresh's operators run in DAG order (health, train, evaluate, gate, the mapped embed
of the candidate, verify, index load, search check, release) on a small generated store,
once under the local runner and once under the AWS Batch runner, each against a fresh
vector index (a database of the session's PostgreSQL: the local job reads its DSN from
the worker's environment, the Batch container from its image, as a job definition's
secrets give it). Batch is moto's API in process; its jobs really run, through
:class:`~tests.batch_harness.LocalBatchExecutor` (the container's command and
environment from the submitted job, Batch's own ``AWS_BATCH_JOB_ID``), so the only way
a summary reaches the operator under Batch is the result record the job wrote to the
store. Both runs use the same store URL (a fresh copy of the data each time), because
summaries name artifacts by URL.

With the executor switched off, moto reports the job SUCCEEDED without running it, and
the task fails with a retryable error naming the record that does not exist: the value
the first test sees comes from the job, not from the runner.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException

from embedfresh.operators import (
    AcceleratorHealthOperator,
    CorpusShardsOperator,
    EmbeddingVerifyOperator,
    EvaluationOperator,
    IncrementalTrainingOperator,
    IndexLoadOperator,
    QualityGateOperator,
    ReleaseOperator,
    SearchCheckOperator,
    ShardEmbeddingOperator,
)
from tests.batch_harness import (
    PYTHON,
    LocalBatchExecutor,
    describe,
    moto_batch,
    settings,
)
from tests.conftest import DATA, DAY1, DAY2

pytestmark = pytest.mark.slow

DAG_ID = "embedding_model_refresh"
RUN_ID = "scheduled__2026-01-02T00:00:00+00:00"
TASKS = [
    "health", "train", "evaluate", "gate", "embed:0", "embed:1", "verify", "load_index",
    "search_check", "release",
]  # fmt: skip
#: Summary fields that measure time, different on every execution whatever the runner.
TIMINGS = {
    "train": {
        "samples_per_second",
        "wall_seconds",
        "seconds_to_first_step",
        "compute_hours",
        "estimated_cost_usd",
    },
    "verify": {"seconds"},
}


@pytest.fixture
def batch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Moto's Batch (tests/batch_harness.py); jobs end at once without running."""
    yield from moto_batch(monkeypatch)


@pytest.fixture
def batch_executor(
    batch: Any, monkeypatch: pytest.MonkeyPatch, index_dsn: str
) -> LocalBatchExecutor:
    """Moto's Batch whose single-node jobs really run, as local processes; the image
    carries the index's DSN (on AWS: the job definition's secrets)."""
    from embedfresh.core.settings import INDEX_DSN_ENV

    return LocalBatchExecutor(extra_env={INDEX_DSN_ENV: index_dsn}).install(monkeypatch)


class OutletEvents(SimpleNamespace):
    """An outlet's events, as far as the operators use them: ``extra`` of a static
    Asset, ``add`` through an alias."""

    def add(self, asset: Any, extra: dict | None = None) -> None:
        self.__dict__.setdefault("added", []).append((asset, extra))


def context(task_id: str, map_index: int = -1) -> dict[str, Any]:
    """What Airflow gives ``execute``, as far as these operators read it."""
    ti = SimpleNamespace(dag_id=DAG_ID, task_id=task_id, map_index=map_index)
    return {"ti": ti, "outlet_events": defaultdict(OutletEvents)}


def refresh(root: str, mode: str, runner_settings: dict[str, Any]) -> dict[str, Any]:
    """The refresh DAG's job tasks in order, as its DAG file wires them; XCom per task."""
    common = dict(
        artifact_root=root,
        model="tiny",
        backend="cpu",
        run_id=RUN_ID,
        env={"OMP_NUM_THREADS": "1"},
        execution_mode=mode,
        runner_settings=runner_settings,
    )
    xcom: dict[str, Any] = {}

    def run(op: Any, map_index: int = -1) -> None:
        key = op.task_id if map_index < 0 else f"{op.task_id}:{map_index}"
        xcom[key] = op.execute(context(op.task_id, map_index))

    run(AcceleratorHealthOperator(task_id="health", **common, job_settings={"collectives": False}))
    run(
        IncrementalTrainingOperator(
            task_id="train",
            **common,
            data_interval_start=DAY1.isoformat(),
            data_interval_end=DAY2.isoformat(),
            epochs=3,  # the DAG Param's default: enough for the gate to say PASS
        )
    )
    run(EvaluationOperator(task_id="evaluate", **common))
    run(QualityGateOperator(task_id="gate", **common))
    # The DAG's candidate: "{{ run_id }}", the version the train task published.
    version = RUN_ID
    groups = CorpusShardsOperator(
        task_id="list_shards", artifact_root=root, corpora=["products"], shards_per_task=2
    ).execute({})
    for index, kwargs in enumerate(groups):
        embed = ShardEmbeddingOperator(task_id="embed", **common, version=version, **kwargs)
        run(embed, index)
    run(EmbeddingVerifyOperator(task_id="verify", **common, version=version, corpus="products"))
    run(IndexLoadOperator(task_id="load_index", **common, corpus="products"))
    run(SearchCheckOperator(task_id="search_check", **common, corpus="products"))
    run(ReleaseOperator(task_id="release", **common, corpora=["products"]))
    return xcom


def record_path(store: Path, key: str) -> Path:
    return store / f"runs/tiny/{RUN_ID}/results/{DAG_ID}:{key}.json"


def check_records(store: Path, xcom: dict[str, Any], job_ids: set[str] | None = None) -> None:
    """Each XCom is its own task instance's record; under Batch, written by that Batch job."""
    names = sorted(p.name for p in (store / f"runs/tiny/{RUN_ID}/results").iterdir())
    assert names == sorted(f"{DAG_ID}:{key}.json" for key in TASKS)  # nothing overwritten
    for key, value in xcom.items():
        record = json.loads(record_path(store, key).read_text())
        assert record["summary"] == value, key
        assert record["name"] == f"{DAG_ID}:{key}" and record["config"]["run_id"] == RUN_ID
        execution = record["execution"]
        if job_ids is None:
            assert "aws_batch_job_id" not in execution
        else:
            assert execution["aws_batch_job_id"] in job_ids, key


def check_costs(store: Path, runner: str) -> list[dict[str, Any]]:
    """Each task's execution left one cost record on its runner's clock, no failed attempt."""
    folder = store / f"runs/tiny/{RUN_ID}/reports/cost"
    records = []
    for key in TASKS:
        [path] = (folder / f"{DAG_ID}:{key}").glob("*.json")
        record = json.loads(path.read_text())
        assert record["runner"] == runner and record["task"] == f"{DAG_ID}:{key}", key
        assert path.stem == record["attempt_id"]
        assert record["failed_attempts"] == 0 and len(record["attempts"]) == 1, key
        assert record["seconds"] > 0 and record["estimated_cost_usd"] > 0, key
        records.append(record)
    return records


def without_timings(xcom: dict[str, Any]) -> dict[str, Any]:
    return {
        key: {k: v for k, v in value.items() if k not in TIMINGS.get(key.split(":")[0], ())}
        for key, value in xcom.items()
    }


def fresh_index(dsn: str) -> None:
    """Empty the index: each run releases the same run id into it."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS embedfresh CASCADE")


def test_every_task_returns_its_result_record_the_same_under_local_and_aws_batch(
    data_template: Path,
    tmp_path: Path,
    batch: Any,
    batch_executor: LocalBatchExecutor,
    index_dsn: str,
):
    store = tmp_path / "artifacts"
    root = f"file://{store}"

    shutil.copytree(data_template, store)
    local = refresh(root, "local", {})
    assert list(local) == TASKS
    check_records(store, local)
    check_costs(store, "local")
    assert batch_executor.executed == []  # the local run submitted nothing
    store.rename(tmp_path / "local-artifacts")
    fresh_index(index_dsn)

    shutil.copytree(data_template, store)
    on_batch = refresh(root, "aws_batch", settings(python=PYTHON))
    executed = batch_executor.executed
    assert len(executed) == len(TASKS)  # one Batch job per task, each really run
    check_records(store, on_batch, {e.job_id for e in executed})
    for cost, run in zip(check_costs(store, "aws_batch"), executed, strict=True):
        [attempt] = describe(batch, run.job_id)["attempts"]  # Batch's clock, not ours
        assert cost["seconds"] == (attempt["stoppedAt"] - attempt["startedAt"]) / 1000
    for run, key in zip(executed, TASKS, strict=True):
        assert describe(batch, run.job_id)["status"] == "SUCCEEDED" and run.exit_code == 0
        # The job printed exactly what the operator returned; it reached the operator
        # through the record only (the Batch job's stdout is its log stream's).
        assert run.stdout.strip().splitlines()[-1] == json.dumps(on_batch[key], sort_keys=True)
        assert run.command[run.command.index("--result-name") + 1] == f"{DAG_ID}:{key}"

    assert without_timings(on_batch) == without_timings(local)
    assert on_batch["gate"]["verdict"] == "PASS" and on_batch["release"]["production"] == RUN_ID
    assert on_batch["release"]["release"] == RUN_ID
    assert sum(on_batch[f"embed:{i}"]["rows"] for i in (0, 1)) == DATA["corpus_rows"]
    assert on_batch["verify"]["rows"] == DATA["corpus_rows"]

    # The executor off: Batch says SUCCEEDED but the job never ran, so the record there
    # is the previous execution's, and the retried task does not take it as its own.
    batch_executor.enabled = False
    before = record_path(store, "release").read_bytes()
    release = ReleaseOperator(
        task_id="release",
        model="tiny",
        artifact_root=root,
        run_id=RUN_ID,
        execution_mode="aws_batch",
        runner_settings=settings(python=PYTHON),
    )
    with pytest.raises(AirflowException, match="was left by another execution") as info:
        release.execute(context("release"))
    assert type(info.value) is AirflowException  # retried
    assert f"result record file://{record_path(store, 'release')} " in str(info.value)
    assert record_path(store, "release").read_bytes() == before
    assert len(batch_executor.executed) == len(TASKS)


@pytest.mark.parametrize("executor_on", [True, False], ids=["executor-on", "executor-off"])
def test_a_batch_task_returns_only_what_its_job_wrote(
    tmp_path: Path, batch: Any, monkeypatch: pytest.MonkeyPatch, executor_on: bool
):
    """The same health task on Batch: with the executor the job runs and its record is
    the XCom; without it Batch still says SUCCEEDED, and the task fails retryably,
    naming the record that no job wrote."""
    executor = LocalBatchExecutor().install(monkeypatch)
    executor.enabled = executor_on
    op = AcceleratorHealthOperator(
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
        summary = op.execute(context("health"))
        assert summary["verdict"] == "PASS"
        assert json.loads(path.read_text())["summary"] == summary
        return
    with pytest.raises(AirflowException, match="wrote no result record at") as info:
        op.execute(context("health"))
    assert type(info.value) is AirflowException  # retried
    assert f"file://{path}:" in str(info.value)
    assert describe(batch, op.runner.job_id)["status"] == "SUCCEEDED"
    assert executor.executed == [] and not path.exists()
