"""The ``aws_batch`` execution mode against moto's AWS Batch API (in process, no Docker).

Moto runs the real provider code (``BatchClientHook`` submit, wait, describe, terminate)
against a Batch API that finishes every job at once: SUCCEEDED, or FAILED when
``MOTO_SIMPLE_BATCH_FAIL_AFTER=0``, without running anything. Moto keeps the container
command, environment and tags of a submitted job, not its node overrides, retry
strategy or fair-share fields: those are read from the SubmitJob request as botocore
sent it (after validating it against the Batch service model). What a successful task
returns is the job's result record, so a job moto only pretends to run leaves the task
failing, retryably, on the missing record; where a test needs the job to run, the
``batch_executor`` fixture (tests/batch_harness.py) runs it as a local process, after
SubmitJob returned, through RUNNABLE and RUNNING, and ends the Batch job with the
process's exit code. The per-exit-code mapping is also tested on
DescribeJobs-shaped records, which is what the runner maps.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from embedfresh.core.config import JobConfig
from embedfresh.operators import (
    AcceleratorHealthOperator,
    AwsBatchRunner,
    BatchSettings,
    IncrementalTrainingOperator,
    JobSpec,
    QualityGateOperator,
)
from embedfresh.operators.constants import ARTIFACT_ROOT_ENV
from embedfresh.operators.runners.aws_batch import EVALUATE_ON_EXIT, job_result
from tests.batch_harness import (
    MULTI,
    PYTHON,
    QUEUE,
    REGION,
    BatchExecutor,
    describe,
    moto_batch,
    run_batch_executor,
    settings,
)
from tests.conftest import ROOT

NEURON_ENV = {
    "NEURON_CC_FLAGS": "--target trn1 --auto-cast all --auto-cast-type bf16 --optlevel 1",
    "NEURON_COMPILE_CACHE_URL": "s3://bucket/prod/compile-cache/neuron/abc123",
}
LOG = logging.getLogger("tests.aws_batch")
RUN_ID = "scheduled__2026-01-02T00:00:00+00:00"


@pytest.fixture
def batch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Moto's Batch (tests/batch_harness.py); jobs end at once without running."""
    yield from moto_batch(monkeypatch)


@pytest.fixture
def batch_executor(batch: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[BatchExecutor]:
    """Moto's Batch whose single-node jobs really run, as local processes."""
    yield from run_batch_executor(monkeypatch)


def train_operator(root: str = "s3://bucket/prod", **batch: Any) -> IncrementalTrainingOperator:
    """The training task on Batch; its settings given as ``batch=`` (the documented name)."""
    return IncrementalTrainingOperator(
        task_id="train",
        model="tiny",
        artifact_root=root,
        run_id=RUN_ID,
        data_interval_start="2026-01-01",
        data_interval_end="2026-01-02",
        env=dict(NEURON_ENV),
        execution_mode="aws_batch",
        batch=settings(**batch),
    )


def health_operator(root: str, **batch: Any) -> AcceleratorHealthOperator:
    """A job that succeeds on any store in seconds, run by the test executor's "image"."""
    return AcceleratorHealthOperator(
        task_id="health",
        model="tiny",
        artifact_root=root,
        run_id=RUN_ID,
        job_settings={"collectives": False},
        execution_mode="aws_batch",
        runner_settings=settings(python=PYTHON, **batch),
    )


def capture_submit_requests(runner: AwsBatchRunner) -> list[dict[str, Any]]:
    """The SubmitJob bodies the hook's client sends, after botocore validated them."""
    sent: list[dict[str, Any]] = []

    def on_call(params: dict[str, Any], **_: Any) -> None:
        sent.append(json.loads(params["body"]))

    runner.hook.client.meta.events.register("before-call.batch.SubmitJob", on_call)
    return sent


def record_url(root: str, name: str) -> str:
    return f"{root}/runs/tiny/{RUN_ID}/results/{name}.json"


# --- single node, end to end through the provider's hook ------------------------------


def test_a_single_node_job_runs_the_job_argv_with_its_env_and_retry_strategy(
    batch, tmp_path, capfd
):
    root = f"file://{tmp_path}"
    op = train_operator(
        root,
        gpus=1,
        vcpus=8,
        memory=30000,
        share_identifier="search",
        scheduling_priority_override=7,
        tags={"team": "search"},
    )
    sent = capture_submit_requests(op.runner)
    # Moto says SUCCEEDED without running the job: no result record, so no XCom, and a
    # retryable error that names the record the job should have written.
    with pytest.raises(AirflowException, match="exited 0 but wrote no result record") as info:
        op.execute({})
    assert type(info.value) is AirflowException
    assert f"at {record_url(root, 'train')}:" in str(info.value)

    job_id = op.runner.job_id
    job = describe(batch, job_id)
    assert job["status"] == "SUCCEEDED"
    # The Batch job's facts go to the task log, not to the XCom.
    log = capfd.readouterr().out
    assert f"ran as {{'aws_batch_job_id': '{job_id}'" in log and "'exit_code': 0" in log
    command = job["container"]["command"]
    # The job's argv, then the result record's name (the task id) and a fresh attempt id.
    assert command[:-4] == op.build_job_spec().argv("python")
    assert command[-4:-1] == ["--result-name", "train", "--attempt-id"]
    assert len(command[-1]) == 32 and int(command[-1], 16) >= 0
    assert command[:3] == ["python", "-m", "embedfresh.jobs.train"]
    env = {e["name"]: e["value"] for e in job["container"]["environment"]}
    assert {k: env[k] for k in NEURON_ENV} == NEURON_ENV
    assert env[ARTIFACT_ROOT_ENV] == root
    assert env["FROM_DEFINITION"] == "1"  # the definition's env stays under the overrides
    # The team's tags, and the result record the job writes (a retry that finds the job
    # by name reads that record).
    assert job["tags"] == {
        "team": "search",
        "embedfresh:result-name": "train",
        "embedfresh:attempt-id": command[-1],
    }
    # Readable, and one per task instance (a hash of the run and the result name).
    assert re.fullmatch(
        r"embedfresh-train-scheduled__2026-01-02T00-00-00-00-00-[0-9a-f]{12}", job["jobName"]
    )

    [request] = sent
    assert request["retryStrategy"] == {
        "attempts": 3,
        "evaluateOnExit": [
            {"onExitCode": "75", "action": "RETRY"},
            {"onStatusReason": "Host EC2*", "action": "RETRY"},
            {"onReason": "CannotPullContainerError*", "action": "RETRY"},
            {"onStatusReason": "Task failed to start", "action": "RETRY"},
            {"onReason": "*", "action": "EXIT"},
        ],
    }
    assert request["shareIdentifier"] == "search"
    assert request["schedulingPriorityOverride"] == 7
    assert request["containerOverrides"]["resourceRequirements"] == [
        {"type": "GPU", "value": "1"},
        {"type": "VCPU", "value": "8"},
        {"type": "MEMORY", "value": "30000"},
    ]
    assert "nodeOverrides" not in request


def test_a_failed_job_without_an_exit_code_is_a_retryable_transient_fault(batch, monkeypatch):
    monkeypatch.setenv("MOTO_SIMPLE_BATCH_FAIL_AFTER", "0")
    op = train_operator()
    with pytest.raises(AirflowException, match="transient") as info:
        op.execute({})
    assert type(info.value) is AirflowException  # retried, and the run resumes
    assert op.runner.job_id is not None and op.runner.job_id in str(info.value)
    assert describe(batch, op.runner.job_id)["status"] == "FAILED"


def test_a_jobs_own_exit_code_reaches_the_task_through_the_batch_record(
    batch, batch_executor, tmp_path
):
    """The job really runs (the executor): training on a store without data is bad input,
    exit 2 on the Batch attempt, and the task fails for good; no record is written."""
    root = f"file://{tmp_path}"
    op = train_operator(root, python=PYTHON)
    with pytest.raises(AirflowFailException, match="exit code 2 .bad input") as info:
        op.execute({})
    [run] = batch_executor.executed
    assert run.job_id == op.runner.job_id and run.exit_code == 2
    assert run.env[ARTIFACT_ROOT_ENV] == root and run.env["AWS_BATCH_JOB_ID"] == run.job_id
    assert "train: error:" in run.stderr and "missing training partition" in run.stderr
    job = describe(batch, run.job_id)
    assert job["status"] == "FAILED" and job["attempts"][-1]["container"]["exitCode"] == 2
    assert f"AWS Batch job {run.job_id} FAILED" in str(info.value)
    assert not (tmp_path / "runs/tiny" / RUN_ID / "results").exists()


def test_on_kill_terminates_the_submitted_job(batch, tmp_path):
    op = train_operator(f"file://{tmp_path}")
    op.on_kill()  # nothing submitted yet: nothing to stop
    with pytest.raises(AirflowException, match="wrote no result record"):
        op.execute({})  # moto "ran" it: SUCCEEDED, nothing written
    op.on_kill()
    job = describe(batch, op.runner.job_id)
    assert job["statusReason"] == "Airflow task killed (on_kill)"


# --- multi-node parallel --------------------------------------------------------------


def test_a_multi_node_job_overrides_every_node_with_a_torchrun_launcher_and_efa(batch, tmp_path):
    root = f"file://{tmp_path}"
    op = train_operator(root, job_definition=MULTI, num_nodes=2, gpus=8)
    op.nproc_per_node = 8
    sent = capture_submit_requests(op.runner)
    with pytest.raises(AirflowException, match="wrote no result record at") as info:
        op.execute({})  # moto ends the job SUCCEEDED without running any node
    assert f"at {record_url(root, 'train')}:" in str(info.value)

    job = describe(batch, op.runner.job_id)
    assert job["status"] == "SUCCEEDED"
    assert job["nodeProperties"]["numNodes"] == 2  # moto keeps the definition's, not ours
    [request] = sent
    assert "containerOverrides" not in request
    nodes = request["nodeOverrides"]
    assert nodes["numNodes"] == 2
    [override] = nodes["nodePropertyOverrides"]
    assert override["targetNodes"] == "0:"
    container = override["containerOverrides"]
    env = {e["name"]: e["value"] for e in container["environment"]}
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert {k: env[k] for k in NEURON_ENV} == NEURON_ENV
    assert env[ARTIFACT_ROOT_ENV] == root
    assert container["resourceRequirements"] == [{"type": "GPU", "value": "8"}]
    sh, dash_c, script = container["command"]
    assert (sh, dash_c) == ("sh", "-c")
    # Every node runs the job with the same result name and attempt id; rank 0 writes.
    assert " --result-name train --attempt-id " in script
    for piece in (
        '--nnodes "$AWS_BATCH_JOB_NUM_NODES"',
        '--node_rank "$AWS_BATCH_JOB_NODE_INDEX"',
        "--nproc-per-node 8",
        "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS",
        "hostname -i",
    ):
        assert piece in script


def test_a_failed_multi_node_job_maps_like_a_single_node_one(batch, monkeypatch):
    monkeypatch.setenv("MOTO_SIMPLE_BATCH_FAIL_AFTER", "0")
    op = train_operator(job_definition=MULTI, num_nodes=2)
    with pytest.raises(AirflowException, match="transient") as info:
        op.execute({})
    assert type(info.value) is AirflowException


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    """An "interpreter" that prints its arguments, one per line."""
    path = tmp_path / "python"
    path.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def run_launcher(command: list[str], node_env: dict[str, str]) -> list[str]:
    env = {"PATH": os.environ["PATH"], **node_env}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.splitlines()


def test_the_launcher_finds_the_main_node_at_run_time_and_keeps_every_argument(fake_python):
    tricky = {"run_id": "manual__2026-01-01T00:00:00+00:00", "note": 'it\'s $HOME; "quoted"'}
    spec = JobSpec("train", tricky, nproc_per_node=4)
    runner = AwsBatchRunner(
        BatchSettings(job_definition=MULTI, job_queue=QUEUE, num_nodes=2, python=fake_python)
    )
    command = runner.command(spec)
    expected_tail = ["--master_port", "29500", "-m", "embedfresh.jobs.train", *spec.job_args()]

    child = run_launcher(
        command,
        {
            "AWS_BATCH_JOB_NUM_NODES": "2",
            "AWS_BATCH_JOB_NODE_INDEX": "1",
            "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.3.7",
        },
    )
    assert child == [
        "-m", "embedfresh.jobs.launch", "--nnodes", "2", "--node_rank", "1",
        "--nproc-per-node", "4", "--master_addr", "10.0.3.7", *expected_tail,
    ]  # fmt: skip

    # Batch gives the main node no main-node address: it uses its own.
    own = subprocess.run(["hostname", "-i"], capture_output=True, text=True).stdout.split()[0]
    main = run_launcher(command, {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "0"})
    assert main[main.index("--master_addr") + 1] == own
    assert main[main.index("--node_rank") + 1] == "0"
    assert main[-len(expected_tail) :] == expected_tail


# --- deferrable -------------------------------------------------------------------------


def test_deferrable_returns_at_once_when_the_job_already_ended(batch, batch_executor, tmp_path):
    op = health_operator(f"file://{tmp_path}", deferrable=True)
    # The job ends before the runner's first look (the executor ends it within
    # SubmitJob): no deferral, the record's summary.
    batch_executor.sync_submit = True
    summary = op.execute({})
    assert summary["verdict"] == "PASS"
    [run] = batch_executor.executed
    assert run.stdout.strip().splitlines()[-1] == json.dumps(summary, sort_keys=True)


def test_deferrable_defers_to_the_providers_trigger_and_resumes_on_its_event(
    batch, batch_executor, tmp_path
):
    root = f"file://{tmp_path}"
    op = health_operator(root, deferrable=True, poll_interval=45, max_polls=100)
    with pytest.raises(TaskDeferred) as info:
        op.execute({})  # the job is RUNNABLE at the first look
    deferred = info.value
    assert deferred.method_name == "execute_complete"
    classpath, kwargs = deferred.trigger.serialize()
    # The provider's trigger, plus on_kill: a person stopping the task stops the job.
    assert classpath == "embedfresh.operators.runners.aws_batch_trigger.BatchJobKillingTrigger"
    job_id = op.runner.job_id
    assert kwargs["job_id"] == job_id and kwargs["region_name"] == REGION
    assert kwargs["waiter_delay"] == 45 and kwargs["waiter_max_attempts"] == 100
    # The result ticket travels with the deferral (Airflow passes it back as kwargs).
    assert batch_executor.wait(job_id)["status"] == "SUCCEEDED"
    [run] = batch_executor.executed
    ticket = deferred.kwargs["result"]
    assert run.command[-4:] == ["--result-name", "health", "--attempt-id", ticket["attempt_id"]]

    # What the trigger yields when the waiter sees SUCCEEDED; a fresh operator resumes
    # and returns the record that Batch job wrote.
    event = {"status": "success", "job_id": job_id}
    resumed = health_operator(root, deferrable=True)
    summary = resumed.execute_complete({}, event, **deferred.kwargs)
    record = json.loads(Path(record_url(root, "health").removeprefix("file://")).read_text())
    assert summary == record["summary"] and summary["verdict"] == "PASS"
    assert record["execution"]["aws_batch_job_id"] == job_id
    # Resumed with another attempt id (not the one it deferred with): not its record.
    other = {"result": {**ticket, "attempt_id": "0" * 32}}
    with pytest.raises(AirflowException, match="was left by another execution"):
        health_operator(root, deferrable=True).execute_complete({}, event, **other)
    with pytest.raises(AirflowException, match="without a result name and attempt id"):
        health_operator(root, deferrable=True).execute_complete({}, event)
    with pytest.raises(AirflowException, match="event is None"):
        resumed.execute_complete({}, None, **deferred.kwargs)


def test_a_trigger_error_event_maps_the_jobs_own_failure(batch, monkeypatch):
    monkeypatch.setenv("MOTO_SIMPLE_BATCH_FAIL_AFTER", "0")
    job_id = AwsBatchRunner(BatchSettings(**settings())).submit(JobSpec("train"), LOG)
    event = {"status": "error", "message": "Failure while running batch job", "job_id": job_id}
    with pytest.raises(AirflowException, match="transient") as info:
        train_operator(deferrable=True).execute_complete({}, event)
    assert type(info.value) is AirflowException


# --- the exit-code mapping, on DescribeJobs records -------------------------------------


def record(status: str, exit_code: int | None = None, **extra: Any) -> dict[str, Any]:
    container = {"logStreamName": "embedfresh-train/default/abc"}
    if exit_code is not None:
        container["exitCode"] = exit_code
    return {
        "jobId": "abc",
        "jobName": "embedfresh-gate-r1",
        "status": status,
        "statusReason": "Essential container in task exited",
        "attempts": [{"container": container}],
        "container": dict(container),
        **extra,
    }


def gate() -> QualityGateOperator:
    return QualityGateOperator(
        task_id="gate",
        model="tiny",
        artifact_root="s3://b/p",
        run_id="r1",
        execution_mode="aws_batch",
        batch=settings(),
    )


@pytest.mark.parametrize("code, meaning", [(2, "bad input"), (3, "gate refused"), (4, "health")])
def test_exit_2_3_4_on_batch_fail_the_task_without_retry(code: int, meaning: str):
    op = gate()
    with pytest.raises(AirflowFailException, match=meaning) as info:
        op.handle_result(op.build_job_spec(), job_result(record("FAILED", code)))
    assert f"exit code {code}" in str(info.value) and "AWS Batch job abc FAILED" in str(info.value)


@pytest.mark.parametrize("code, words", [(75, "transient"), (1, "crashed"), (137, "crashed")])
def test_exit_75_and_crashes_on_batch_are_retryable(code: int, words: str):
    op = gate()
    with pytest.raises(AirflowException, match=words) as info:
        op.handle_result(op.build_job_spec(), job_result(record("FAILED", code)))
    assert type(info.value) is AirflowException


def test_the_last_attempts_exit_code_wins_and_the_reason_is_quoted():
    job = record("FAILED", 75)
    job["attempts"].append({"container": {"exitCode": 3, "reason": "OutOfMemoryError"}})
    result = job_result(job)
    assert result.exit_code == 3
    assert result.last_error_line == (
        "AWS Batch job abc FAILED: Essential container in task exited; OutOfMemoryError"
    )


def test_a_job_that_never_ran_to_an_exit_is_transient():
    host_lost = record("FAILED", statusReason="Host EC2 (instance i-0abc) terminated.")
    assert job_result(host_lost).exit_code == 75
    assert "Host EC2" in job_result(host_lost).tail


def test_a_multi_node_job_takes_the_main_nodes_exit_code():
    parent = record("FAILED", nodeProperties={"mainNode": 0, "numNodes": 2})
    del parent["attempts"], parent["container"]
    assert job_result(parent, main_node=record("FAILED", 4)).exit_code == 4


def test_success_names_the_batch_job_for_the_log_and_unfinished_jobs_have_no_result():
    done = job_result(record("SUCCEEDED", 0))
    # What the job returned is in its result record; the result only says where it ran.
    assert done.exit_code == 0 and done.summary is None
    assert done.details == {
        "aws_batch_job_id": "abc",
        "job_name": "embedfresh-gate-r1",
        "status": "SUCCEEDED",
        "exit_code": 0,
        "attempts": 1,
        "log_stream": "embedfresh-train/default/abc",
    }
    for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING"):
        assert job_result(record(status)) is None


# --- settings -----------------------------------------------------------------------------


def test_settings_are_validated_once_with_one_clear_error():
    with pytest.raises(ValueError, match="unknown AWS Batch settings \\['queue'\\]"):
        BatchSettings.from_mapping({"job_definition": "d", "queue": "q"})
    with pytest.raises(ValueError, match="retry_attempts must be 1-10"):
        BatchSettings(job_definition="d", job_queue="q", retry_attempts=11)
    with pytest.raises(ValueError, match="num_nodes"):
        BatchSettings(job_definition="d", job_queue="q", num_nodes=0)
    with pytest.raises(ValueError, match="reserves"):
        AwsBatchRunner(BatchSettings(job_definition="d", job_queue="q")).environment(
            JobSpec("train", env={"AWS_BATCH_JOB_ID": "x"})
        )
    assert len(EVALUATE_ON_EXIT) <= 5  # Batch accepts at most five evaluateOnExit rules
    # The variable the runner sets in the container is the one a job's config reads.
    with mock.patch.dict(os.environ, {ARTIFACT_ROOT_ENV: "s3://bucket/from-env"}):
        assert JobConfig().artifact_root == "s3://bucket/from-env"


def test_the_batch_field_is_templated_and_the_runner_is_built_lazily():
    op = IncrementalTrainingOperator(
        task_id="t",
        model="tiny",
        artifact_root="s3://b/p",
        execution_mode="aws_batch",
        batch={"job_definition": "{{ params.job_definition }}", "job_queue": "q"},
    )
    # batch= is the runner's settings under their documented name: templated as such.
    assert "runner_settings" in op.template_fields and "runner" not in op.__dict__
    assert op.runner_settings == {"job_definition": "{{ params.job_definition }}", "job_queue": "q"}
    op.runner_settings = {"job_definition": "rendered", "job_queue": "q", "num_nodes": 2}
    assert op.runner.settings == BatchSettings(
        job_definition="rendered", job_queue="q", num_nodes=2
    )
    with pytest.raises(ValueError, match="runner_settings or batch, not both"):
        IncrementalTrainingOperator(
            task_id="u", model="tiny", artifact_root="s3://b/p", execution_mode="aws_batch",
            batch={"job_definition": "d"}, runner_settings={"job_queue": "q"},
        )  # fmt: skip
    # A misspelled setting is a DAG import error, not a retried task.
    with pytest.raises(ValueError, match="unknown settings \\['queue'\\] for execution_mode"):
        IncrementalTrainingOperator(
            task_id="v", model="tiny", artifact_root="s3://b/p", execution_mode="aws_batch",
            runner_settings={"job_definition": "d", "job_queue": "q", "queue": "typo"},
        )  # fmt: skip


def test_importing_the_operators_does_not_import_boto3_or_the_provider():
    code = (
        "import sys, embedfresh.operators; "
        "assert embedfresh.operators.AwsBatchRunner; "
        "heavy = ('boto3', 'botocore', 'airflow.providers.amazon.aws.hooks.base_aws'); "
        "bad = [m for m in heavy if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
