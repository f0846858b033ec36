"""The ``aws_batch`` execution mode against moto's AWS Batch API (in process, no Docker).

Moto runs the real provider code (``BatchClientHook`` submit, wait, describe, terminate)
against a Batch API that finishes every job at once: SUCCEEDED, or FAILED when
``MOTO_SIMPLE_BATCH_FAIL_AFTER=0``. Moto keeps the container command, environment and tags
of a submitted job, not its node overrides, retry strategy or fair-share fields: those are
read from the SubmitJob request as botocore sent it (after validating it against the
Batch service model). Moto cannot end a job with a chosen exit code, so the per-exit-code
mapping is tested on DescribeJobs-shaped records, which is what the runner maps.
"""

from __future__ import annotations

import json
import logging
import os
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
    AwsBatchRunner,
    BatchSettings,
    IncrementalTrainingOperator,
    JobSpec,
    QualityGateOperator,
)
from embedfresh.operators.constants import ARTIFACT_ROOT_ENV
from embedfresh.operators.runners.aws_batch import EVALUATE_ON_EXIT, job_result
from tests.conftest import ROOT

REGION = "us-east-1"
QUEUE = "embedfresh-queue"
SINGLE = "embedfresh-train"
MULTI = "embedfresh-train-mnp"
NEURON_ENV = {
    "NEURON_CC_FLAGS": "--target trn1 --auto-cast all --auto-cast-type bf16 --optlevel 1",
    "NEURON_COMPILE_CACHE_URL": "s3://bucket/prod/compile-cache/neuron/abc123",
}
LOG = logging.getLogger("tests.aws_batch")


@pytest.fixture
def batch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Moto's Batch with a queue, a single-node and a multi-node job definition.

    Yields a boto3 Batch client for reading back what moto stored.
    """
    import boto3
    from moto import mock_aws

    # Another test's moto server may have pointed every client at itself.
    for key in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "MOTO_SIMPLE_BATCH_FAIL_AFTER"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws(config={"batch": {"use_docker": False}}):
        role = boto3.client("iam").create_role(
            RoleName="embedfresh-batch", AssumeRolePolicyDocument="{}"
        )["Role"]["Arn"]
        client = boto3.client("batch", region_name=REGION)
        env_arn = client.create_compute_environment(
            computeEnvironmentName="embedfresh-trn1",
            type="UNMANAGED",
            state="ENABLED",
            serviceRole=role,
        )["computeEnvironmentArn"]
        client.create_job_queue(
            jobQueueName=QUEUE,
            state="ENABLED",
            priority=1,
            computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env_arn}],
        )
        container = {
            "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/embedfresh:latest",
            "command": ["python", "-m", "embedfresh.jobs.health"],
            "resourceRequirements": [
                {"type": "VCPU", "value": "4"},
                {"type": "MEMORY", "value": "8192"},
            ],
            "environment": [{"name": "FROM_DEFINITION", "value": "1"}],
        }
        client.register_job_definition(
            jobDefinitionName=SINGLE, type="container", containerProperties=container
        )
        client.register_job_definition(
            jobDefinitionName=MULTI,
            type="multinode",
            nodeProperties={
                "numNodes": 2,
                "mainNode": 0,
                "nodeRangeProperties": [{"targetNodes": "0:", "container": container}],
            },
        )
        yield client


def settings(**overrides: Any) -> dict[str, Any]:
    return {
        "job_definition": SINGLE,
        "job_queue": QUEUE,
        "aws_conn_id": None,  # boto3's own credentials: moto's
        "region_name": REGION,
        "poll_interval": 0,
        **overrides,
    }


def train_operator(**batch: Any) -> IncrementalTrainingOperator:
    return IncrementalTrainingOperator(
        task_id="train",
        artifact_root="s3://bucket/prod",
        run_id="scheduled__2026-01-02T00:00:00+00:00",
        data_interval_start="2026-01-01",
        data_interval_end="2026-01-02",
        env=dict(NEURON_ENV),
        execution_mode="aws_batch",
        batch=settings(**batch),
    )


def capture_submit_requests(runner: AwsBatchRunner) -> list[dict[str, Any]]:
    """The SubmitJob bodies the hook's client sends, after botocore validated them."""
    sent: list[dict[str, Any]] = []

    def on_call(params: dict[str, Any], **_: Any) -> None:
        sent.append(json.loads(params["body"]))

    runner.hook.client.meta.events.register("before-call.batch.SubmitJob", on_call)
    return sent


def describe(client: Any, job_id: str) -> dict[str, Any]:
    [job] = client.describe_jobs(jobs=[job_id])["jobs"]
    return job


# --- single node, end to end through the provider's hook ------------------------------


def test_a_single_node_job_runs_the_job_argv_with_its_env_and_retry_strategy(batch):
    op = train_operator(
        gpus=1,
        vcpus=8,
        memory=30000,
        share_identifier="search",
        scheduling_priority_override=7,
        tags={"team": "search"},
    )
    sent = capture_submit_requests(op.runner)
    summary = op.execute({})

    job = describe(batch, summary["aws_batch_job_id"])
    assert job["status"] == "SUCCEEDED" and summary["status"] == "SUCCEEDED"
    assert summary["exit_code"] == 0
    spec = op.build_job_spec()
    assert job["container"]["command"] == spec.argv("python")
    assert job["container"]["command"][:3] == ["python", "-m", "embedfresh.jobs.train"]
    env = {e["name"]: e["value"] for e in job["container"]["environment"]}
    assert {k: env[k] for k in NEURON_ENV} == NEURON_ENV
    assert env[ARTIFACT_ROOT_ENV] == "s3://bucket/prod"
    assert env["FROM_DEFINITION"] == "1"  # the definition's env stays under the overrides
    assert job["tags"] == {"team": "search"}
    assert job["jobName"] == "embedfresh-train-scheduled__2026-01-02T00-00-00-00-00"

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


def test_on_kill_terminates_the_submitted_job(batch):
    op = train_operator()
    op.on_kill()  # nothing submitted yet: nothing to stop
    op.execute({})
    op.on_kill()
    job = describe(batch, op.runner.job_id)
    assert job["statusReason"] == "Airflow task killed (on_kill)"


# --- multi-node parallel --------------------------------------------------------------


def test_a_multi_node_job_overrides_every_node_with_a_torchrun_launcher_and_efa(batch):
    op = train_operator(job_definition=MULTI, num_nodes=2, gpus=8)
    op.nproc_per_node = 8
    sent = capture_submit_requests(op.runner)
    summary = op.execute({})

    job = describe(batch, summary["aws_batch_job_id"])
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
    assert env[ARTIFACT_ROOT_ENV] == "s3://bucket/prod"
    assert container["resourceRequirements"] == [{"type": "GPU", "value": "8"}]
    sh, dash_c, script = container["command"]
    assert (sh, dash_c) == ("sh", "-c")
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


def test_deferrable_returns_at_once_when_the_job_already_ended(batch):
    op = train_operator(deferrable=True)
    assert op.execute({})["status"] == "SUCCEEDED"  # moto ends jobs at submit: no deferral


class StillRunning(AwsBatchRunner):
    """Sees the job as still running on the first look: moto ends every job at submit."""

    looked = False

    def result(self, job_id: str):
        if not self.looked:
            self.looked = True
            return None
        return super().result(job_id)


def test_deferrable_defers_to_the_providers_trigger_and_resumes_on_its_event(batch):
    op = train_operator(deferrable=True, poll_interval=45, max_polls=100)
    op.__dict__["runner"] = StillRunning(op.runner.settings)
    with pytest.raises(TaskDeferred) as info:
        op.execute({})
    deferred = info.value
    assert deferred.method_name == "execute_complete"
    classpath, kwargs = deferred.trigger.serialize()
    assert classpath == "airflow.providers.amazon.aws.triggers.batch.BatchJobTrigger"
    job_id = op.runner.job_id
    assert kwargs["job_id"] == job_id and kwargs["region_name"] == REGION
    assert kwargs["waiter_delay"] == 45 and kwargs["waiter_max_attempts"] == 100

    # What the trigger yields when the waiter sees SUCCEEDED; a fresh operator resumes.
    resumed = train_operator(deferrable=True)
    summary = resumed.execute_complete({}, {"status": "success", "job_id": job_id})
    assert summary["aws_batch_job_id"] == job_id and summary["exit_code"] == 0
    with pytest.raises(AirflowException, match="event is None"):
        resumed.execute_complete({}, None)


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


def test_success_carries_a_summary_and_unfinished_jobs_have_no_result():
    done = job_result(record("SUCCEEDED", 0))
    assert done.exit_code == 0 and done.summary["aws_batch_job_id"] == "abc"
    assert done.summary["log_stream"] == "embedfresh-train/default/abc"
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
        artifact_root="s3://b/p",
        execution_mode="aws_batch",
        batch={"job_definition": "{{ params.job_definition }}", "job_queue": "q"},
    )
    assert "batch" in op.template_fields and "runner" not in op.__dict__


def test_importing_the_operators_does_not_import_boto3_or_the_provider():
    code = (
        "import sys, operators; "
        "assert embedfresh.operators.AwsBatchRunner; "
        "heavy = ('boto3', 'botocore', 'airflow.providers.amazon.aws.hooks.base_aws'); "
        "bad = [m for m in heavy if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
