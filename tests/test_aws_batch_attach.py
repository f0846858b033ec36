"""The AWS Batch runner against jobs that really run (tests/batch_harness.py's executor):
a retry attaches to the job its lost predecessor started, the job's log reaches the task
log, and the cost record counts every attempt from Batch's own clock.

The Airflow-level versions (a real worker killed, a real triggerer) are in
tests/airflow/test_batch_airflow.py; these drive the operator in process, with the task
state store as a dict.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from embedfresh.operators import AcceleratorHealthOperator
from embedfresh.operators.runners.aws_batch import STATE_KEY
from tests.batch_harness import (
    PYTHON,
    BatchExecutor,
    describe,
    moto_batch,
    run_batch_executor,
    settings,
)

RUN_ID = "manual__2026-03-04T05:06:07+00:00"


@pytest.fixture
def batch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    yield from moto_batch(monkeypatch)


@pytest.fixture
def executor(batch: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[BatchExecutor]:
    yield from run_batch_executor(monkeypatch, runnable_delay=0.1)


class StateStore(dict):
    """``context["task_state_store"]`` as the runner uses it: get and set."""

    def set(self, key: str, value: Any) -> None:
        self[key] = json.loads(json.dumps(value))  # JSON, as Airflow stores it


def health(root: str, python: str = PYTHON, **batch: Any) -> AcceleratorHealthOperator:
    return AcceleratorHealthOperator(
        task_id="health",
        model="tiny",
        artifact_root=root,
        run_id=RUN_ID,
        job_settings={"collectives": False},
        execution_mode="aws_batch",
        runner_settings=settings(python=python, poll_interval=0.2, **batch),
    )


@pytest.fixture
def slow_python(tmp_path: Path) -> str:
    """The image's interpreter, which first prints a line and holds while ``hold`` exists."""
    hold = tmp_path / "hold"
    hold.touch()
    path = tmp_path / "python"
    path.write_text(
        f'#!/bin/sh\necho "holding"\nwhile [ -e {hold} ]; do sleep 0.1; done\nexec {PYTHON} "$@"\n'
    )
    path.chmod(0o755)
    return str(path)


def release(slow_python: str) -> None:
    (Path(slow_python).parent / "hold").unlink()


def released_once_attached(
    op: AcceleratorHealthOperator, slow_python: str
) -> AcceleratorHealthOperator:
    """``op`` whose runner releases the held job right after it looked for it: released
    before, the job could end first on a loaded box, and a job that ended is never
    attached to (a second one is submitted, by design)."""
    attach = op.runner.attach

    def attached(*args: Any, **kwargs: Any) -> Any:
        spec = attach(*args, **kwargs)
        release(slow_python)
        return spec

    op.runner.attach = attached
    return op


def first_try_submits_and_dies(op: AcceleratorHealthOperator, state: StateStore | None) -> str:
    """What a worker does before it is lost: attach (nothing yet), submit, record."""
    spec = op.build_job_spec(op.result_ticket({}))
    spec = op.runner.attach(spec, logging.getLogger("first-try"), state)
    return op.runner.submit(spec, logging.getLogger("first-try"))


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "lost-before-recording"])
def test_a_retry_attaches_to_the_running_job_and_reads_its_record(
    batch, executor, tmp_path, slow_python, capfd, recorded
):
    root = f"file://{tmp_path / 'store'}"
    state = StateStore()
    job_id = first_try_submits_and_dies(health(root, slow_python), state)
    executor.wait_for(job_id, "RUNNING")
    if not recorded:  # the worker died between SubmitJob and recording the id
        state.clear()
    else:
        assert state[STATE_KEY]["job_id"] == job_id

    retry = released_once_attached(health(root, slow_python), slow_python)
    summary = retry.execute({"task_state_store": state})
    task_log = capfd.readouterr().out

    assert len(executor.submits) == 1, "a retry must not submit a second job"
    assert summary["verdict"] == "PASS"
    how = "recorded in the task state store" if recorded else "found by its name"
    assert f"Re-attaching to AWS Batch job {job_id}" in task_log and how in task_log
    # The record read is the one the running job wrote (its own attempt id, from its tags).
    record = json.loads((tmp_path / f"store/runs/tiny/{RUN_ID}/results/health.json").read_text())
    assert record["execution"]["aws_batch_job_id"] == job_id
    assert state[STATE_KEY]["job_id"] == job_id


def test_a_retry_after_the_job_ended_submits_a_new_one(batch, executor, tmp_path, capfd):
    root = f"file://{tmp_path / 'store'}"
    state = StateStore()
    first = first_try_submits_and_dies(health(root), state)
    executor.wait(first)
    health(root).execute({"task_state_store": state})
    assert len(executor.submits) == 2
    assert "not attaching" in capfd.readouterr().out
    assert state[STATE_KEY]["job_id"] != first


def test_the_jobs_log_reaches_the_task_log_whole_past_one_page_while_polling(
    batch, executor, tmp_path, capfd
):
    """More lines than one GetLogEvents page (10,000 events): every one, in order, once."""
    marker = "marker-7f3a"
    script = tmp_path / "python"
    script.write_text(
        f"#!/bin/sh\n{PYTHON} -c \"print('\\\\n'.join('{marker} %05d' % i for i in range(12000)))\"\n"
        f'exec {PYTHON} "$@"\n'
    )
    script.chmod(0o755)
    capfd.readouterr()
    health(f"file://{tmp_path / 'store'}", str(script)).execute({})
    lines = [line for line in capfd.readouterr().out.splitlines() if f"] {marker} " in line]
    numbers = [line.split(f"] {marker} ", 1)[1][:5] for line in lines]
    assert numbers == [f"{i:05d}" for i in range(12000)]


def test_the_cost_record_counts_a_failed_attempt_and_the_retry_each_from_batchs_clock(
    batch, executor, tmp_path
):
    root = tmp_path / "store"
    # The image's interpreter holds in the first attempt (until its host is lost), never
    # in the second: the fault is placed by what the job prints, not by a clock.
    python = tmp_path / "python"
    python.write_text(
        '#!/bin/sh\nif [ "$AWS_BATCH_JOB_ATTEMPT" = 1 ]; then echo "holding"; sleep 600; fi\n'
        f'exec {PYTHON} "$@"\n'
    )
    python.chmod(0o755)
    op = health(f"file://{root}", str(python))
    name = op.runner.job_name(op.build_job_spec(op.result_ticket({})))
    # The first attempt loses its host; Batch's retry strategy runs a second.
    executor.fail(job_name=name, attempt=1, fault="host", on_output="holding")
    op.execute({})
    [submit] = executor.submits
    job = describe(batch, executor.calls_of("SubmitJob")[0].job_id)
    assert job["status"] == "SUCCEEDED" and len(job["attempts"]) == 2
    [cost_file] = (root / f"runs/tiny/{RUN_ID}/reports/cost/health").glob("*.json")
    cost = json.loads(cost_file.read_text())
    seconds = [a["seconds"] for a in cost["attempts"]]
    batch_seconds = [(a["stoppedAt"] - a["startedAt"]) / 1000 for a in job["attempts"]]
    assert seconds == batch_seconds and all(s > 0 for s in seconds)
    assert seconds[0] != seconds[1]
    assert cost["failed_attempts"] == 1 and cost["attempts"][0]["exit_code"] is None
    assert cost["seconds"] == pytest.approx(sum(seconds), abs=1e-3)
    assert cost["estimated_cost_usd"] == pytest.approx(
        sum(seconds) / 3600 * cost["price_per_hour_usd"], abs=1e-6
    )
    assert submit["jobName"] == name


def test_on_kill_while_polling_terminates_the_attached_job(batch, executor, tmp_path, slow_python):
    root = f"file://{tmp_path / 'store'}"
    state = StateStore()
    job_id = first_try_submits_and_dies(health(root, slow_python), state)
    executor.wait_for(job_id, "RUNNING")
    retry = health(root, slow_python)
    spec = retry.build_job_spec(retry.result_ticket({}))
    retry.runner.attach(spec, logging.getLogger("retry"), state)
    retry.on_kill()
    job = executor.wait(job_id)
    assert job["status"] == "FAILED" and "on_kill" in job["statusReason"]
    assert len(executor.submits) == 1


def test_every_aws_call_the_runner_makes_is_in_the_readmes_iam_list(
    batch, executor, tmp_path, slow_python, monkeypatch
):
    """Submit, lose the worker before recording, attach by name, poll with the log, stop:
    every Batch and CloudWatch Logs call of that story needs a line in the README's IAM."""
    import botocore.client

    from tests.conftest import ROOT

    made: set[str] = set()
    original = botocore.client.BaseClient._make_api_call

    def record(client: Any, operation: str, params: Any) -> Any:
        made.add(f"{client.meta.service_model.signing_name}:{operation}")
        return original(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", record)
    root = f"file://{tmp_path / 'store'}"
    job_id = first_try_submits_and_dies(health(root, slow_python), None)
    executor.wait_for(job_id, "RUNNING")
    retry = released_once_attached(health(root, slow_python), slow_python)
    retry.execute({"task_state_store": StateStore()})
    killed = health(root, slow_python)
    killed.runner.job_id = job_id
    killed.on_kill()

    iam = (ROOT / "README.md").read_text().split("IAM:", 1)[1].split("\n## ", 1)[0]
    runner_calls = {c for c in made if c.split(":")[0] in ("batch", "logs")}
    assert {"batch:SubmitJob", "batch:ListJobs", "logs:GetLogEvents"} <= runner_calls
    missing = sorted(c for c in runner_calls if f"`{c}`" not in iam)
    assert not missing, f"calls the runner makes that the README's IAM list lacks: {missing}"


def test_an_array_job_reports_its_children_by_state_and_copies_their_logs_on_request(
    batch, executor, tmp_path
):
    """Three children, one of which exits 2 (bad input): the array FAILED with 2, each
    child's log copied into the task log because ``child_logs`` asks for it."""
    from embedfresh.operators.job_spec import JobSpec
    from embedfresh.operators.runners.aws_batch import AwsBatchRunner, BatchSettings

    script = tmp_path / "python"
    script.write_text(
        '#!/bin/sh\necho "child says $AWS_BATCH_JOB_ARRAY_INDEX"\n'
        '[ "$AWS_BATCH_JOB_ARRAY_INDEX" = 1 ] && { echo "bad slice" >&2; exit 2; }\nexit 0\n'
    )
    script.chmod(0o755)
    runner = AwsBatchRunner(
        BatchSettings.from_mapping(settings(python=str(script), poll_interval=0.2, child_logs=True))
    )
    log = logging.getLogger("array")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        result = runner.run(JobSpec("embed", {"run_id": "r1"}, array_size=3), log)
    finally:
        log.removeHandler(handler)
    assert result.exit_code == 2
    assert result.details["children"] == {"FAILED": 1, "SUCCEEDED": 2}
    assert f"child {result.details['aws_batch_job_id']}:1 exited 2" in result.tail
    said = sorted(m.split("] ", 1)[1] for m in records if "] child says" in m)
    assert said == ["child says 0", "child says 1", "child says 2"]
    assert any("] bad slice" in m for m in records)
    assert len(result.cost["attempts"]) == 3 and result.cost["children"] == 3


def test_every_nodes_log_reaches_the_task_log_prefixed_while_running_and_after(
    batch, executor, tmp_path
):
    """A 2-node job: each node is a Batch job of its own (``<id>#<n>``) with its own log
    stream, and the runner follows both into the task log, ``[node n]`` first."""
    import threading
    import time

    from embedfresh.operators import AwsBatchRunner, BatchSettings, JobSpec
    from tests.batch_harness import MULTI, QUEUE, REGION

    release = tmp_path / "release"
    fake_python = tmp_path / "python"
    # Each node says hello, holds until the test releases it, says bye; the main node
    # (0) ends the job, so it waits for node 1's bye first.
    fake_python.write_text(
        "#!/bin/sh\n"
        'i=$AWS_BATCH_JOB_NODE_INDEX; echo "hello from $i"\n'
        f"while [ ! -e {release} ]; do sleep 0.05; done\n"
        'echo "bye from $i"; touch "$0.$i"\n'
        '[ "$i" = 0 ] && while [ ! -e "$0.1" ]; do sleep 0.05; done\n'
        "exit 0\n"
    )
    fake_python.chmod(0o755)
    runner = AwsBatchRunner(
        BatchSettings(
            job_definition=MULTI, job_queue=QUEUE, num_nodes=2, python=str(fake_python),
            aws_conn_id=None, region_name=REGION, poll_interval=0.1,
        )
    )  # fmt: skip
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    log = logging.getLogger("test-mnp-task-log")
    log.setLevel(logging.INFO)
    log.addHandler(Collect())
    results: list[Any] = []
    thread = threading.Thread(
        target=lambda: results.append(runner.run(JobSpec("train", nproc_per_node=1), log))
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        want = {"[node 0] hello from 0", "[node 1] hello from 1"}
        while not want <= set(lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert want <= set(lines), lines  # while the job runs
        assert executor.status(runner.job_id) == "RUNNING"
    finally:
        release.touch()
        thread.join(timeout=60)
    [result] = results
    assert result.exit_code == 0
    assert {"[node 0] bye from 0", "[node 1] bye from 1"} <= set(lines)  # and after
    node_lines = [line for line in lines if line.startswith("[node ")]
    assert len(node_lines) == len(set(node_lines)) == 4  # each line once
