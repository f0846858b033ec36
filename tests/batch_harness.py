"""AWS Batch for the tests: moto's Batch API in process, and an executor that runs its jobs.

Moto's Batch without Docker (``mock_aws(config={"batch": {"use_docker": False}})``)
accepts a job and ends it at once, SUCCEEDED (or FAILED when
``MOTO_SIMPLE_BATCH_FAIL_AFTER=0``), without running anything. :class:`LocalBatchExecutor`
stands in for the compute environment: while it is switched on, every single-node job
moto accepts runs, before SubmitJob returns, as a local process with the container's
command and environment as Batch would give them (the job definition's environment
under the submitted overrides, plus ``AWS_BATCH_JOB_ID`` and the attempt number); the
job's DescribeJobs record then ends the way the process ended: SUCCEEDED on exit 0,
else FAILED with the process's exit code on its attempt, as Batch reports it.

Multi-node jobs keep moto's own behaviour (moto does not keep node overrides, so there
is no command to run).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import ROOT

REGION = "us-east-1"
QUEUE = "embedfresh-queue"
SINGLE = "embedfresh-train"
MULTI = "embedfresh-train-mnp"


def moto_batch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Moto's Batch with a queue, a single-node and a multi-node job definition.

    A fixture body (``yield from moto_batch(monkeypatch)``): each test module declares its
    own ``batch`` fixture with it. Yields a boto3 Batch client for reading back what moto
    stored.
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
    """An operator's ``runner_settings`` for the fixture's queue and single-node definition."""
    return {
        "job_definition": SINGLE,
        "job_queue": QUEUE,
        "aws_conn_id": None,  # boto3's own credentials: moto's
        "region_name": REGION,
        "poll_interval": 0,
        **overrides,
    }


def describe(client: Any, job_id: str) -> dict[str, Any]:
    [job] = client.describe_jobs(jobs=[job_id])["jobs"]
    return job


@dataclass(frozen=True)
class ExecutedJob:
    """One Batch job the executor ran: what it ran and how it ended."""

    job_id: str
    command: list[str]
    env: dict[str, str]
    exit_code: int
    stdout: str
    stderr: str


#: What the image gives every container before Batch adds its environment: a shell's
#: basics, and one intra-op thread (see tests/conftest.py job_env: a shared small box).
IMAGE_ENV = ("PATH", "HOME", "LANG", "TMPDIR")


class LocalBatchExecutor:
    """Runs the jobs moto's Batch accepts as local processes while :attr:`enabled`.

    :param timeout: seconds one job may run.
    """

    def __init__(self, timeout: float = 600) -> None:
        self.enabled = True
        self.timeout = timeout
        self.executed: list[ExecutedJob] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> LocalBatchExecutor:
        """Take over how moto's simple Batch backend ends a job it accepted."""
        from moto.batch_simple.models import BatchSimpleBackend

        original = BatchSimpleBackend._mark_job_as_finished
        executor = self

        def finish(backend: Any, include_start_attempt: bool, job: Any) -> None:
            properties = job.job_definition.container_properties
            if not executor.enabled or properties is None or not include_start_attempt:
                return original(backend, include_start_attempt, job)
            backend.backend._jobs[job.job_id] = job
            job.job_started_at = dt.datetime.now()
            job.log_stream_name = job._stream_name
            job._start_attempt()
            code = executor.run(job, properties)
            job.exit_code = code
            job.latest_attempt["container"]["exitCode"] = code
            if code != 0:
                job.job_stopped_reason = "Essential container in task exited"
            job._mark_stopped(success=code == 0)

        monkeypatch.setattr(BatchSimpleBackend, "_mark_job_as_finished", finish)
        return self

    def run(self, job: Any, properties: dict[str, Any]) -> int:
        """Run ``job``'s container command the way Batch would start it; its exit code."""
        overrides = job.container_overrides or {}
        command = list(overrides.get("command") or properties.get("command") or [])
        env = {k: os.environ[k] for k in IMAGE_ENV if k in os.environ}
        env["OMP_NUM_THREADS"] = "1"
        for source in (properties.get("environment"), overrides.get("environment")):
            env.update({e["name"]: e["value"] for e in source or []})
        env["AWS_BATCH_JOB_ID"] = job.job_id
        env["AWS_BATCH_JOB_ATTEMPT"] = str(len(job.attempts))
        env["AWS_BATCH_JQ_NAME"] = job.job_queue.name
        done = subprocess.run(
            command,
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=self.timeout,
            stdin=subprocess.DEVNULL,
        )
        self.executed.append(
            ExecutedJob(job.job_id, command, env, done.returncode, done.stdout, done.stderr)
        )
        return done.returncode

    def by_job_id(self, job_id: str) -> ExecutedJob:
        [run] = [e for e in self.executed if e.job_id == job_id]
        return run


#: The interpreter "inside the image": this test run's, which has embedfresh installed.
PYTHON = sys.executable
