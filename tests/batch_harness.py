"""AWS Batch for the tests: moto's Batch API, and an executor that really runs its jobs.

Moto's Batch without Docker (``mock_aws(config={"batch": {"use_docker": False}})``)
accepts a job and ends it inside SubmitJob, SUCCEEDED (or FAILED when
``MOTO_SIMPLE_BATCH_FAIL_AFTER=0``), without running anything: no RUNNING window, no
retry strategy, no log lines. :class:`BatchExecutor` stands in for the compute
environment. The product never sees it: it talks to moto through the provider's hooks
(boto3), and the executor works inside moto's Batch API (the ``SubmitJob``,
``TerminateJob``, ``CancelJob`` and ``ListJobs`` handlers of ``moto.batch.responses``),
so it serves in-process ``mock_aws`` and a ``ThreadedMotoServer`` in the test process
alike (both keep their state in the same backends, keyed by account and region).

Setting up (fixture bodies; each test module declares its own fixtures)::

    @pytest.fixture
    def batch(monkeypatch):                 # in-process mock_aws, boto3 Batch client
        yield from moto_batch(monkeypatch)

    @pytest.fixture
    def batch_server(monkeypatch):          # moto over HTTP on 127.0.0.1
        yield from moto_batch_server(monkeypatch)   # -> BatchServer(endpoint_url, client, logs)

    @pytest.fixture
    def executor(batch, monkeypatch):       # or (batch_server, monkeypatch)
        yield from run_batch_executor(monkeypatch, runnable_delay=0.2, max_parallel=2)

Both fixtures create the queue :data:`QUEUE` (compute environment :data:`COMPUTE_ENV`),
the container definition :data:`SINGLE` and the multi-node definition :data:`MULTI`, and
the log group :data:`LOG_GROUP`. ``moto_batch_server`` sets ``AWS_ENDPOINT_URL`` (and
test credentials, region) in ``os.environ`` for the test, so Airflow task processes and
triggerers started by the test reach the same moto; ``BatchServer.endpoint_url`` is it.
Its teardown resets moto's Batch and CloudWatch Logs state (S3 and the rest are kept).
``run_batch_executor`` yields the started executor and at teardown kills every process it
started and joins every thread (:meth:`BatchExecutor.shutdown`, which raises if one
would not end).

What a submitted single-node (``container``) job goes through, as DescribeJobs and
ListJobs show it:

* SubmitJob returns at once; the job is SUBMITTED for a moment (a quarter of
  ``runnable_delay``, at most 50 ms), then RUNNABLE until ``runnable_delay`` seconds
  after SubmitJob (a test can stop a worker "right after SubmitJob" in that window),
  then waits for one of ``max_parallel`` process slots (array children queue for them
  in index order), STARTING, and RUNNING while its process runs.
* The process is the container's command (the submitted ``containerOverrides.command``,
  else the definition's, ``Ref::`` parameters substituted), run in :data:`ROOT` (or
  ``cwd=``) in its own process group, with the environment Batch gives a container: the
  "image's" (:data:`IMAGE_ENV` from this process, ``OMP_NUM_THREADS=1``, and
  ``extra_env=``), the definition's environment under the submitted overrides, and
  ``AWS_BATCH_JOB_ID``, ``AWS_BATCH_JOB_ATTEMPT`` (1, 2, ...), ``AWS_BATCH_JQ_NAME``,
  ``AWS_BATCH_CE_NAME``, and for array children ``AWS_BATCH_JOB_ARRAY_INDEX`` and
  ``AWS_BATCH_JOB_ARRAY_SIZE`` (a child's job id is ``<parent id>:<index>``).
* Each attempt writes its stdout and stderr lines, as the process prints them, one event
  a line (blank lines dropped, as the awslogs driver does), to the CloudWatch Logs
  stream ``<definition name>/default/<task id>`` (a fresh 32-hex task id per attempt) in
  :data:`LOG_GROUP`; the job's ``container.logStreamName`` names the current attempt's
  stream from STARTING on, each ended attempt's ``container.logStreamName`` its own.
* An attempt ends as Batch reports it: ``attempts[i]`` holds ``startedAt``/``stoppedAt``
  (epoch ms of the real process start and end), ``statusReason``, and ``container``
  with ``exitCode`` (absent for an infrastructure fault), ``logStreamName``, and
  ``reason`` where Batch gives one. ``attempts`` lists ended attempts only. An exit 0
  ends the job SUCCEEDED; otherwise ``retryStrategy`` decides (the submitted one, else
  the definition's; default one attempt): ``evaluateOnExit`` rules are tried in order
  (``onExitCode``, ``onReason``, ``onStatusReason`` are globs, all given ones must
  match, a missing value matches as ""), the first match's action wins, and when no rule
  matches the job is retried, as AWS documents; RETRY within ``attempts`` makes the job
  RUNNABLE again for a new attempt, else it ends FAILED with the last attempt's
  ``statusReason`` (``"Essential container in task exited"`` for a process exit). The
  job's ``startedAt``/``stoppedAt`` are the last attempt's start and its end.
  An attempt that runs past ``timeout.attemptDurationSeconds`` (or the executor's
  ``timeout``) is killed and ends the job FAILED, ``"Job attempt duration exceeded
  timeout"``, without retry (as Batch does).
* Array jobs (``arrayProperties={"size": N}``, 2 to 10,000): every child runs with its
  own attempts and retries; the parent is PENDING until a child starts, RUNNING until
  all ended, then SUCCEEDED if all did, else FAILED (``"Array Child Job failed"``); its
  ``arrayProperties`` holds ``size`` and ``statusSummary`` (children by status), its
  ``startedAt``/``stoppedAt`` the first child start and the last child end. ListJobs on
  a queue lists the parent, ``arrayJobId=`` lists the children.
* TerminateJob: a job not yet started ends FAILED at once; a running one's process
  group gets SIGTERM, then SIGKILL after ``term_grace`` seconds; the attempt keeps the
  process's exit code (143 for SIGTERM, 137 for SIGKILL, as Docker reports signals),
  the job ends FAILED with the given reason, no further attempt. On an array parent it
  terminates every child. CancelJob does this only to jobs not yet STARTING (AWS
  leaves started jobs running and still answers 200: TerminateJob stops those).
* ListJobs without ``jobStatus`` and without ``filters`` lists RUNNING jobs only, as AWS
  does (moto lists all).

* Multi-node parallel jobs (a ``multinode`` definition, ``nodeOverrides``): one
  process per node (``numNodes`` from the overrides, else the definition), all started
  together (the job takes one of the ``max_parallel`` slots), each with its node's
  container (the definition's ``nodeRangeProperties`` under the submitted
  ``nodePropertyOverrides``, by ``targetNodes``) and ``AWS_BATCH_JOB_NODE_INDEX``,
  ``AWS_BATCH_JOB_NUM_NODES``, ``AWS_BATCH_JOB_MAIN_NODE_INDEX``, and on every node but
  the main one ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS=127.0.0.1``; each node its
  own log stream. The job ends when its main node's process does (the other nodes are
  then killed: their records show 137); retries repeat the whole job. As AWS documents
  (docs.aws.amazon.com/batch/latest/userguide/multi-node-parallel-jobs.html), each node
  is a job of its own: DescribeJobs on ``<id>#<node>`` gives it (``nodeDetails``, its
  own ``attempts``, its ``container`` with command, environment, ``logStreamName``,
  ``exitCode``); the job's own record has ``nodeProperties`` (``numNodes`` the
  submitted one) and no ``container``: no log stream, no exit code (its main node's
  record has them), and its attempts only their times and ``statusReason``.
  ``multinode=False`` leaves them to moto (ended at submit, nothing run).

EKS definitions are not run: moto's own behaviour stays. ``dependsOn`` is refused
(ClientException) rather than ignored.

Every Batch and CloudWatch Logs answer (moto's, the executor's, and the records
``wait``/``wait_for`` return) is checked against botocore's model of the operation's
output, as ``botocore.stub.Stubber`` checks a response (:func:`validate_response`); one
that is refused raises :class:`InvalidAwsResponse` there and again at the fixture's
teardown (:data:`refused_responses`).

Faults (:meth:`BatchExecutor.fail`), registered before or while the job runs::

    executor.fail(job_name=name, array_index=3, attempt=1, fault="host", after=0.3)
    executor.fail(job_id=job_id, attempt=2, fault="exit", exit_code=75, on_output="step 10")
    executor.fail(job_name=name, fault="pull")

``host``: the attempt's process group is killed once it ran ``after`` seconds (or printed
a line containing ``on_output``), and the attempt ends as a lost host does: no exit code,
``statusReason`` ``"Host EC2 (instance i-0abc...) terminated."``. ``exit``: the same,
but the attempt reports ``exit_code`` (``statusReason`` ``"Essential container in task
exited"``). ``pull``: the attempt never starts a process: ``statusReason`` ``"Task
failed to start"``, ``container.reason`` ``"CannotPullContainerError: ..."``. Each fault
fires once, on the first matching attempt; ``array_index=None`` matches a job that is
not an array child.

Record of calls: ``executor.calls`` holds every SubmitJob, TerminateJob, CancelJob and
ListJobs request moto received while the executor was installed (:class:`BatchCall`:
``action``, the request body as sent, ``job_id`` that SubmitJob returned, ``at``), and
``executor.submits`` the SubmitJob bodies alone; ``executor.executed`` holds each
process an attempt ran (:class:`ExecutedJob`: job id, command, env, exit code,
stdout, stderr, attempt, array index, times, status reason, log stream, pid, node
index). ``executor.wait(job_id)`` waits for a job to end and returns its DescribeJobs
record, ``executor.wait_for(job_id, "RUNNING")`` for a
status.

:class:`LocalBatchExecutor` is the executor as the tests before it knew it: each job
ends before SubmitJob returns (``sync_submit=True``, no RUNNABLE delay), for tests of
"the job already ended at the first look".
"""

from __future__ import annotations

import copy
import datetime as dt
import fnmatch
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import ROOT

REGION = "us-east-1"
QUEUE = "embedfresh-queue"
COMPUTE_ENV = "embedfresh-trn1"
SINGLE = "embedfresh-train"
MULTI = "embedfresh-train-mnp"
LOG_GROUP = "/aws/batch/job"

#: What the image gives every container before Batch adds its environment: a shell's
#: basics (and one intra-op thread, see tests/conftest.py job_env: a shared small box).
IMAGE_ENV = ("PATH", "HOME", "LANG", "TMPDIR")

#: The interpreter "inside the image": this test run's, which has embedfresh installed.
PYTHON = sys.executable

ENDED = ("SUCCEEDED", "FAILED")
NOT_STARTED = ("SUBMITTED", "PENDING", "RUNNABLE")
EXITED = "Essential container in task exited"
TIMED_OUT = "Job attempt duration exceeded timeout"
CHILD_FAILED = "Array Child Job failed"
STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")


# --- moto's Batch, set up ---------------------------------------------------------------


def _aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another test's moto server may have pointed every client at itself.
    for key in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "MOTO_SIMPLE_BATCH_FAIL_AFTER"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)


def _create_batch_resources(session_kwargs: dict[str, Any], role_name: str) -> Any:
    """The queue, its compute environment, both definitions and the log group; the client."""
    import boto3

    role = boto3.client("iam", **session_kwargs).create_role(
        RoleName=role_name, AssumeRolePolicyDocument="{}"
    )["Role"]["Arn"]
    client = boto3.client("batch", **session_kwargs)
    env_arn = client.create_compute_environment(
        computeEnvironmentName=COMPUTE_ENV,
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
    boto3.client("logs", **session_kwargs).create_log_group(logGroupName=LOG_GROUP)
    return client


# --- AWS's own shapes -------------------------------------------------------------------

#: The services whose every answer is checked against botocore's model of AWS.
VALIDATED_SERVICES = ("batch", "logs")


class InvalidAwsResponse(AssertionError):
    """A response that botocore's model of the operation's output refuses."""


#: The answers refused during the current test (a test that plants one clears it).
refused_responses: list[InvalidAwsResponse] = []


@functools.cache
def _service_model(service: str) -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model(service)


def validate_response(service: str, operation: str, response: dict[str, Any]) -> None:
    """Check ``response`` against botocore's output shape of ``service``'s ``operation``,
    as ``botocore.stub.Stubber.add_response`` does; raise :class:`InvalidAwsResponse`."""
    from botocore.validate import ParamValidator

    model = _service_model(service)
    # moto names a REST operation (Batch's) in lower case: "describejobs"
    names = {name.lower(): name for name in model.operation_names}
    shape = model.operation_model(names[operation.lower()]).output_shape
    if shape is None:
        if response:
            raise InvalidAwsResponse(f"{service} {operation} returns nothing, got {response!r}")
        return
    report = ParamValidator().validate(response, shape)
    report._errors = [e for e in report._errors if not _not_started_yet(e)]
    if report.has_errors():
        raise InvalidAwsResponse(
            f"{service} {operation} response is not in AWS's shape:\n{report.generate_report()}"
            + f"\nin {json.dumps(response)[:2000]}"
        )


def _not_started_yet(error: tuple[str, str, dict[str, Any]]) -> bool:
    """botocore's model marks ``JobDetail.startedAt`` required, but AWS leaves it out of a
    job that has not started, or ended without starting (measured in getmoto/moto#2202;
    amazonka made it optional, brendanhay/amazonka#561): that one disagreement passes."""
    kind, _, details = error
    if kind != "missing required field" or details.get("required_name") != "startedAt":
        return False
    job = details.get("user_params") or {}
    ran = any(a.get("startedAt") for a in job.get("attempts") or [])
    status = job.get("status")
    return status in (*NOT_STARTED, "STARTING") or (status in ENDED and not ran)


def _validate_moto_responses(monkeypatch: pytest.MonkeyPatch) -> list[InvalidAwsResponse]:
    """Check every successful Batch and CloudWatch Logs answer moto gives (in process or
    over HTTP; the executor's own answers included) against botocore's model, as it is
    returned. The list holds what was refused, for the fixture's teardown: the product
    might have swallowed the error a refused answer became."""
    from moto.batch.models import Job
    from moto.core.responses import BaseResponse

    refused = refused_responses
    refused.clear()
    original = BaseResponse.call_action

    def call_action(self: Any) -> Any:
        status, headers, body = original(self)
        if self.boto3_service_name in VALIDATED_SERVICES and 200 <= int(status) < 300:
            try:
                response = json.loads(body) if body else {}
                validate_response(self.boto3_service_name, self._get_action(), response)
            except InvalidAwsResponse as e:
                refused.append(e)
                raise
        return status, headers, body

    monkeypatch.setattr(BaseResponse, "call_action", call_action)
    monkeypatch.setattr(Job, "describe", _with_resource_requirements(Job.describe))
    return refused


def _with_resource_requirements(describe: Any) -> Any:
    """Moto's DescribeJobs record of a container gives ``vcpus`` as a float (botocore's
    model: an integer) derived from ``resourceRequirements``, which it leaves out; AWS
    answers the container's ``resourceRequirements`` (vcpus/memory are deprecated)."""

    def described(job: Any) -> dict[str, Any]:
        result = describe(job)
        container = result.get("container")
        if not container:
            return result
        base = job.job_definition.container_properties or {}
        if getattr(job, "node_index", None) is not None:
            base, overrides = _container_spec(job)
        else:
            overrides = job.container_overrides or {}
        wanted = overrides.get("resourceRequirements") or base.get("resourceRequirements")
        if wanted:
            container["resourceRequirements"] = copy.deepcopy(wanted)
        for key in ("vcpus", "memory"):
            value = container.pop(key, None)
            if value is not None and not wanted:
                container[key] = int(value)
        return result

    return described


def _no_refused(refused: list[InvalidAwsResponse]) -> None:
    if refused:
        raise InvalidAwsResponse(f"{len(refused)} response(s) not in AWS's shape") from refused[0]


def moto_batch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Moto's Batch in process with the queue, both job definitions and the log group.

    A fixture body (``yield from moto_batch(monkeypatch)``). Yields a boto3 Batch client
    for reading back what moto stored.
    """
    from moto import mock_aws

    _aws_env(monkeypatch)
    refused = _validate_moto_responses(monkeypatch)
    with mock_aws(config={"batch": {"use_docker": False}}):
        yield _create_batch_resources({"region_name": REGION}, "embedfresh-batch")
    _no_refused(refused)


@dataclass(frozen=True)
class BatchServer:
    """Moto over HTTP in this process: where it listens and clients on it."""

    endpoint_url: str
    client: Any  # boto3 Batch client
    logs: Any  # boto3 CloudWatch Logs client


def moto_batch_server(
    monkeypatch: pytest.MonkeyPatch, endpoint_url: str | None = None
) -> Iterator[BatchServer]:
    """Moto's Batch behind a ``ThreadedMotoServer`` on 127.0.0.1, set up like :func:`moto_batch`.

    A fixture body (``yield from moto_batch_server(monkeypatch)``). Starts a server, or
    uses the one at ``endpoint_url`` (e.g. the session's ``s3_endpoint``: one moto serves
    every service). ``AWS_ENDPOINT_URL``, test credentials and the region are set in
    ``os.environ`` for the test, so processes it starts reach this moto. Moto's Batch
    runs without Docker. At the end, moto's Batch and CloudWatch Logs state is reset
    and a server started here is stopped.
    """
    import boto3
    from moto.batch.models import batch_backends
    from moto.core.config import default_user_config
    from moto.logs.models import logs_backends
    from moto.server import ThreadedMotoServer

    _aws_env(monkeypatch)
    refused = _validate_moto_responses(monkeypatch)
    monkeypatch.setitem(default_user_config, "batch", {"use_docker": False})
    server = None
    if endpoint_url is None:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        server.start()
        host, port = server.get_host_and_port()
        endpoint_url = f"http://{host}:{port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint_url)
    role = f"embedfresh-batch-{uuid.uuid4().hex[:8]}"
    kwargs = {"region_name": REGION, "endpoint_url": endpoint_url}
    try:
        client = _create_batch_resources(kwargs, role)
        yield BatchServer(endpoint_url, client, boto3.client("logs", **kwargs))
    finally:
        try:
            boto3.client("iam", **kwargs).delete_role(RoleName=role)
        finally:
            batch_backends.reset()
            logs_backends.reset()
            if server is not None:
                server.stop()
    _no_refused(refused)


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


def log_lines(logs: Any, stream: str) -> list[str]:
    """Every message of ``stream`` in :data:`LOG_GROUP`, paging GetLogEvents to its end."""
    lines: list[str] = []
    token = None
    while True:
        kwargs = {"nextToken": token} if token else {}
        page = logs.get_log_events(
            logGroupName=LOG_GROUP, logStreamName=stream, startFromHead=True, **kwargs
        )
        lines += [e["message"] for e in page["events"]]
        if not page["events"] or page["nextForwardToken"] == token:
            return lines
        token = page["nextForwardToken"]


# --- the record -------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutedJob:
    """One attempt of a Batch job that ran a process: what it ran and how it ended.

    ``exit_code`` is what Batch reports on the attempt: ``None`` for an infrastructure
    fault (``status_reason`` says which), 128 + the signal for a killed process.
    """

    job_id: str
    command: list[str]
    env: dict[str, str]
    exit_code: int | None
    stdout: str
    stderr: str
    attempt: int = 1
    array_index: int | None = None
    started_at: int = 0  # epoch ms
    stopped_at: int = 0  # epoch ms
    status_reason: str = ""
    log_stream: str = ""
    pid: int = 0
    node_index: int | None = None


@dataclass(frozen=True)
class BatchCall:
    """One Batch API request moto received while the executor was installed."""

    action: str  # SubmitJob, TerminateJob, CancelJob, ListJobs
    request: dict[str, Any]
    at: float  # time.time()
    job_id: str | None = None  # SubmitJob's answer


@dataclass
class Fault:
    """An attempt to end as an infrastructure fault or an exit code (:meth:`BatchExecutor.fail`)."""

    fault: str
    job_name: str | None = None
    job_id: str | None = None
    array_index: int | None = None
    attempt: int = 1
    exit_code: int | None = None
    after: float = 0.3
    on_output: str | None = None
    instance: str = "i-0abc1234def567890"
    fired_on: str | None = None  # the job id it ended an attempt of

    def matches(self, job: _Job, attempt: int) -> bool:
        if self.fired_on is not None or attempt != self.attempt:
            return False
        if job.array_index != self.array_index:
            return False
        if self.job_name is not None and job.job_name != self.job_name:
            return False
        if self.job_id is not None and self.job_id not in (job.job_id, job.parent_id):
            return False
        return True


def _now_ms() -> int:
    return int(time.time() * 1000)


def _exit_code(returncode: int) -> int:
    """What Docker (and so Batch) reports for a process: its code, or 128 + the signal."""
    return 128 - returncode if returncode < 0 else returncode


def retry_action(
    rules: list[dict[str, str]], exit_code: int | None, reason: str, status: str
) -> str:
    """``RETRY`` or ``EXIT`` for an ended attempt under ``evaluateOnExit`` (AWS's rules)."""
    values = {
        "onExitCode": "" if exit_code is None else str(exit_code),
        "onReason": reason or "",
        "onStatusReason": status or "",
    }
    for rule in rules:
        conditions = [k for k in values if k in rule]
        if all(fnmatch.fnmatchcase(values[k], rule[k]) for k in conditions):
            return rule["action"].upper()
    return "RETRY"  # AWS: when no rule matches, the job is retried


# --- the job, as moto stores it ---------------------------------------------------------


def _job_class() -> type:
    from moto.batch.models import Job

    class ExecutorJob(Job):
        """Moto's Job whose status only the executor moves (never started as a thread)."""

        @property
        def status(self) -> str | None:  # type: ignore[override]
            until = getattr(self, "submitted_until", None)
            if self._status == "SUBMITTED" and until is not None and time.monotonic() >= until:
                self._status = "PENDING" if self.children else "RUNNABLE"
            return self._status

        @status.setter
        def status(self, value: str) -> None:
            self._status = value

        def _get_container_property(self, p: str, default: Any) -> Any:
            if p != "environment":
                return super()._get_container_property(p, default)
            env = self.executor.environment(self)
            env = {k: v for k, v in env.items() if k not in self.executor.image_env()}
            return [{"name": k, "value": v} for k, v in env.items()]

        def describe_short(self) -> dict[str, Any]:
            with self.executor.lock:
                result: dict[str, Any] = {
                    "jobId": self.job_id,
                    "jobArn": self.arn,
                    "jobName": self.job_name,
                    "createdAt": self.created_ms,
                    "status": self.status,
                    "jobDefinition": self.job_definition.arn,
                }
                if self.job_stopped_reason is not None:
                    result["statusReason"] = self.job_stopped_reason
                if self.started_ms is not None:
                    result["startedAt"] = self.started_ms
                if self.stopped_ms is not None:
                    result["stoppedAt"] = self.stopped_ms
                if self.exit_code is not None:
                    result["container"] = {"exitCode": self.exit_code}
                if self.children:
                    result["arrayProperties"] = {"size": len(self.children)}
                elif self.array_index is not None:
                    result["arrayProperties"] = {"index": self.array_index}
                return result

        def describe(self) -> dict[str, Any]:
            with self.executor.lock:
                result = super().describe()
                short = self.describe_short()
                short.pop("container", None)
                for key in ("startedAt", "stoppedAt", "statusReason"):
                    result.pop(key, None)
                result.update(short)
                result["retryStrategy"] = copy.deepcopy(self.retry_strategy)
                result["attempts"] = copy.deepcopy(self.ended_attempts)
                container = result.setdefault("container", {})
                container.pop("exitCode", None)
                container.pop("logStreamName", None)
                if self.log_stream_name:
                    container["logStreamName"] = self.log_stream_name
                last = self.ended_attempts[-1]["container"] if self.ended_attempts else {}
                if self.status in ENDED:
                    for key in ("exitCode", "reason"):
                        if key in last:
                            container[key] = last[key]
                if self.nodes:  # AWS: the nodes run the containers, the job has none
                    properties = copy.deepcopy(self.job_definition.node_properties)
                    result["nodeProperties"] = {**properties, "numNodes": self.num_nodes}
                    result.pop("container", None)
                    result["attempts"] = [
                        {k: v for k, v in a.items() if k != "container"} for a in result["attempts"]
                    ]
                if self.node_index is not None:
                    result.pop("nodeProperties", None)
                    container["command"] = self.executor._command(self)
                    container["environment"] = self._get_container_property("environment", [])
                    main = self.node_index == self.mnp.main_node
                    result["nodeDetails"] = {"nodeIndex": self.node_index, "isMainNode": main}
                if self.children:
                    result.pop("container", None)
                    result["arrayProperties"] = {
                        "size": len(self.children),
                        "statusSummary": self.status_summary(),
                    }
                    result["attempts"] = []
                elif self.array_index is not None:
                    result["arrayProperties"] = {"index": self.array_index}
                return result

        def status_summary(self) -> dict[str, int]:
            counts = Counter(child.status for child in self.children)
            return {status: counts.get(status, 0) for status in STATUSES}

    return ExecutorJob


_JOB_CLASS: type | None = None


def _new_job(executor: BatchExecutor, request: dict[str, Any], **kwargs: Any) -> _Job:
    global _JOB_CLASS
    if _JOB_CLASS is None:
        _JOB_CLASS = _job_class()
    job = _JOB_CLASS(**kwargs)
    job.executor = executor
    job.request = request
    job.status = "SUBMITTED"
    job.created_ms = _now_ms()
    job.started_ms = None
    job.stopped_ms = None
    job.children = []
    job.parent = None
    job.parent_id = None
    job.array_index = None
    job.array_size = None
    job.ended_attempts = []
    job.terminate_reason = None
    job.nodes = []  # a multi-node job's node jobs
    job.mnp = None  # a node job's multi-node job
    job.node_index = None
    job.num_nodes = None
    job.main_node = 0
    job.node_overrides = {}
    job.retry_strategy = (
        request.get("retryStrategy") or job.job_definition.retry_strategy or {"attempts": 1}
    )
    return job


_Job = Any  # an ExecutorJob: moto's Job plus the executor's fields above


# --- the executor -----------------------------------------------------------------------


class BatchExecutor:
    """Runs the container jobs moto's Batch accepts, asynchronously, as local processes.

    :param runnable_delay: seconds a submitted (or retried) job stays RUNNABLE before it
        may start.
    :param max_parallel: processes running at once (array children queue for a slot).
    :param timeout: seconds one attempt may run (a job's ``attemptDurationSeconds``
        applies when shorter).
    :param sync_submit: SubmitJob returns only after the job ended (moto's old way).
    :param extra_env: more environment of the "image", under the job's.
    :param term_grace: seconds between SIGTERM and SIGKILL on TerminateJob.
    :param cwd: the container's working directory.
    :param multinode: run multi-node jobs (off: moto's own way, ended at submit).
    """

    def __init__(
        self,
        *,
        runnable_delay: float = 0.2,
        max_parallel: int = 2,
        timeout: float = 600,
        sync_submit: bool = False,
        extra_env: dict[str, str] | None = None,
        term_grace: float = 2.0,
        cwd: str | os.PathLike[str] = ROOT,
        multinode: bool = True,
    ) -> None:
        self.enabled = True
        self.multinode = multinode
        self.runnable_delay = runnable_delay
        self.max_parallel = max_parallel
        self.timeout = timeout
        self.sync_submit = sync_submit
        self.extra_env = dict(extra_env or {})
        self.term_grace = term_grace
        self.cwd = cwd
        self.calls: list[BatchCall] = []
        self.executed: list[ExecutedJob] = []
        self.faults: list[Fault] = []
        self.jobs: dict[str, _Job] = {}
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self._queue: list[tuple[float, int, _Job]] = []  # (not before, order, job)
        self._order = 0
        self._workers: list[threading.Thread] = []
        self._readers: list[threading.Thread] = []
        self._live: dict[str, subprocess.Popen[bytes]] = {}  # job id -> its process
        self._logs_lock = threading.Lock()
        self._closed = False
        self.errors: list[BaseException] = []

    # --- the view a test has --------------------------------------------------------------

    @property
    def submits(self) -> list[dict[str, Any]]:
        """The SubmitJob request bodies moto received, in order."""
        return [c.request for c in self.calls if c.action == "SubmitJob"]

    def calls_of(self, action: str) -> list[BatchCall]:
        return [c for c in self.calls if c.action == action]

    def by_job_id(self, job_id: str) -> ExecutedJob:
        """The one attempt ``job_id`` ran (fails if it ran none or several)."""
        [run] = [e for e in self.executed if e.job_id == job_id]
        return run

    def attempts_of(self, job_id: str) -> list[ExecutedJob]:
        return [e for e in self.executed if e.job_id == job_id]

    def fail(
        self,
        *,
        job_name: str | None = None,
        job_id: str | None = None,
        array_index: int | None = None,
        attempt: int = 1,
        fault: str = "host",
        exit_code: int | None = None,
        after: float = 0.3,
        on_output: str | None = None,
    ) -> Fault:
        """Make one attempt end in ``fault`` (see the module doc); returns the fault."""
        if fault not in ("host", "exit", "pull"):
            raise ValueError(f"fault must be host, exit or pull, got {fault!r}")
        if (fault == "exit") != (exit_code is not None):
            raise ValueError("an exit fault needs exit_code, and only it takes one")
        if job_name is None and job_id is None:
            raise ValueError("name the job: job_name= or job_id=")
        planned = Fault(fault, job_name, job_id, array_index, attempt, exit_code, after, on_output)
        with self.lock:
            self.faults.append(planned)
        return planned

    def status(self, job_id: str) -> str:
        with self.lock:
            return self.jobs[job_id].status

    def wait_for(self, job_id: str, *statuses: str, timeout: float = 60) -> dict[str, Any]:
        """Wait until ``job_id`` is in one of ``statuses``; its DescribeJobs record."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                job = self.jobs.get(job_id)
                if job is not None and job.status in statuses:
                    record = job.describe()
                    validate_response("batch", "DescribeJobs", {"jobs": [record]})
                    return record
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = None if job is None else job.status
                    raise TimeoutError(
                        f"Batch job {job_id} is {seen}, not {statuses}, after {timeout}s"
                    )
                self._changed.wait(min(left, 0.5))

    def wait(self, job_id: str, timeout: float = 60) -> dict[str, Any]:
        """Wait until ``job_id`` ended (SUCCEEDED or FAILED); its DescribeJobs record."""
        return self.wait_for(job_id, *ENDED, timeout=timeout)

    def live_pids(self) -> list[int]:
        with self.lock:
            return [p.pid for p in self._live.values()]

    # --- installing -------------------------------------------------------------------------

    def install(self, monkeypatch: pytest.MonkeyPatch) -> BatchExecutor:
        """Take over moto's SubmitJob, TerminateJob, CancelJob and ListJobs; start the workers.

        Prefer :func:`run_batch_executor`, which shuts the executor down at the end of the
        test; here, the monkeypatch's undo shuts it down too, as a backstop.
        """
        from moto.batch.responses import BatchResponse

        executor = self
        originals = {
            name: getattr(BatchResponse, name)
            for name in ("submitjob", "terminatejob", "canceljob", "listjobs")
        }

        def submitjob(response: Any) -> str:
            return executor._submit(response, originals["submitjob"])

        def terminatejob(response: Any) -> str:
            return executor._stop(response, "TerminateJob", originals["terminatejob"])

        def canceljob(response: Any) -> str:
            return executor._stop(response, "CancelJob", originals["canceljob"])

        def listjobs(response: Any) -> str:
            return executor._list(response, originals["listjobs"])

        monkeypatch.setattr(_Backstop(self), "armed", True)
        for name, patched in (
            ("submitjob", submitjob),
            ("terminatejob", terminatejob),
            ("canceljob", canceljob),
            ("listjobs", listjobs),
        ):
            monkeypatch.setattr(BatchResponse, name, patched)
        with self.lock:
            for i in range(self.max_parallel):
                worker = threading.Thread(
                    target=self._work, name=f"batch-executor-{i}", daemon=True
                )
                worker.start()
                self._workers.append(worker)
        return self

    def shutdown(self) -> None:
        """Kill every process this executor started and join every thread it started."""
        with self._changed:
            self._closed = True
            live = list(self._live.values())
            self._changed.notify_all()
        for process in live:
            _kill_group(process, signal.SIGKILL)
        left = []
        for thread in [*self._workers, *self._readers]:
            thread.join(timeout=15)
            if thread.is_alive():
                left.append(thread.name)
        for process in live:
            process.wait(timeout=15)
        if left:
            raise RuntimeError(f"batch executor threads still running after shutdown: {left}")
        if self.errors:
            errors, self.errors = self.errors, []
            raise RuntimeError(f"batch executor failed: {errors!r}") from errors[0]

    # --- moto's handlers ----------------------------------------------------------------

    def _record(self, action: str, response: Any) -> BatchCall:
        body = response.body
        request = json.loads(body) if body else {}
        call = BatchCall(action, request, time.time())
        with self.lock:
            self.calls.append(call)
        return call

    def _backend(self, response: Any) -> Any:
        from moto.batch.models import batch_backends

        return batch_backends[response.current_account][response.region]

    def _submit(self, response: Any, original: Any) -> str:
        from moto.batch.exceptions import ClientException
        from moto.batch.models import JOB_NAME_REGEX

        if not self.enabled:
            return original(response)
        call = self._record("SubmitJob", response)
        request = call.request
        backend = self._backend(response)
        job_def = backend.get_job_definition(request.get("jobDefinition", ""))
        if job_def is None:
            raise ClientException(f"Job definition {request.get('jobDefinition')} does not exist")
        multinode = job_def.type == "multinode" and bool(job_def.node_properties)
        if not (multinode and self.multinode) and job_def.container_properties is None:
            answer = original(response)  # EKS (and multi-node if switched off): moto's way
            self._answered(call, json.loads(answer)["jobId"])
            return answer
        name = request.get("jobName", "")
        if JOB_NAME_REGEX.match(name) is None:
            raise ClientException("Job name should match valid pattern")
        queue = backend.get_job_queue(request.get("jobQueue", ""))
        if queue is None:
            raise ClientException(f"Job queue {request.get('jobQueue')} does not exist")
        if request.get("dependsOn"):
            raise ClientException("the test Batch executor does not run jobs with dependsOn")
        size = (request.get("arrayProperties") or {}).get("size")
        if size is not None and not 2 <= size <= 10_000:
            raise ClientException(f"Array job size must be between 2 and 10000, got {size}")

        def make(job_id: str | None, tags: Any) -> _Job:
            return _new_job(
                self,
                request,
                name=name,
                job_def=job_def,
                job_queue=queue,
                backend=backend,
                log_backend=backend.logs_backend,
                container_overrides=copy.deepcopy(request.get("containerOverrides") or {}),
                eks_properties_override=None,
                depends_on=None,
                parameters=request.get("parameters"),
                all_jobs=backend._jobs,
                timeout=request.get("timeout") or job_def.timeout,
                array_properties={},
                provided_job_id=job_id,
                tags=tags,
            )

        with self._changed:
            if self._closed:
                raise ClientException("the test Batch executor is shut down")
            job = make(None, request.get("tags"))
            backend._jobs[job.job_id] = job
            self.jobs[job.job_id] = job
            if multinode:
                job.node_overrides = request.get("nodeOverrides") or {}
                properties = job_def.node_properties
                job.num_nodes = int(job.node_overrides.get("numNodes") or properties["numNodes"])
                job.main_node = int(properties.get("mainNode", 0))
                for index in range(job.num_nodes):
                    node = make(f"{job.job_id}#{index}", None)
                    queue.jobs.remove(node)  # ListJobs on the queue lists the job only
                    node.mnp, node.node_index, node.status = job, index, "RUNNABLE"
                    job.nodes.append(node)
                    backend._jobs[node.job_id] = node
                    self.jobs[node.job_id] = node
                self._enqueue(job)
            elif size is None:
                self._enqueue(job)
            else:
                job._child_jobs = job.children
                for index in range(size):
                    child = make(f"{job.job_id}:{index}", None)
                    queue.jobs.remove(child)  # ListJobs on the queue lists the parent only
                    child.parent, child.parent_id = job, job.job_id
                    child.array_index, child.array_size = index, size
                    child.status = "RUNNABLE"
                    job.children.append(child)
                    backend._jobs[child.job_id] = child
                    self.jobs[child.job_id] = child
                    self._enqueue(child)
            # SUBMITTED for a moment, then RUNNABLE (an array: PENDING), as Batch moves it.
            job.status = "SUBMITTED"
            job.submitted_until = time.monotonic() + min(0.05, self.runnable_delay / 4)
            self._answered(call, job.job_id)
        if self.sync_submit:
            self.wait(job.job_id, timeout=self.timeout)
        return json.dumps({"jobId": job.job_id, "jobName": name, "jobArn": job.arn})

    def _answered(self, call: BatchCall, job_id: str) -> None:
        with self.lock:
            index = self.calls.index(call)
            self.calls[index] = BatchCall(call.action, call.request, call.at, job_id)

    def _stop(self, response: Any, action: str, original: Any) -> str:
        if not self.enabled:
            return original(response)
        request = self._record(action, response).request
        job_id, reason = request.get("jobId", ""), request.get("reason", "")
        with self._changed:
            job = self.jobs.get(job_id)
            if job is None:
                return original(response)  # a job moto ran, or none: moto's answer
            job = job.mnp or job  # a node: its multi-node job
            if not reason:
                from moto.batch.exceptions import ClientException

                raise ClientException("'reason' is a required field (cannot be an empty string)")
            for target in job.children or [job]:
                self._stop_job(target, reason, terminate=action == "TerminateJob")
            self._changed.notify_all()
        return ""

    def _stop_job(self, job: _Job, reason: str, terminate: bool) -> None:
        if job.status in ENDED or job.terminate_reason is not None:
            return
        if job.status in NOT_STARTED:
            self._queue = [q for q in self._queue if q[2] is not job]
            job.job_stopped_reason = reason
            self._end(job, "FAILED")
        elif terminate:  # STARTING or RUNNING: the worker stops the process(es)
            job.terminate_reason = reason
            for target in job.nodes or [job]:
                process = self._live.get(target.job_id)
                if process is not None:
                    _kill_group(process, signal.SIGTERM)

    def _list(self, response: Any, original: Any) -> str:
        answer = original(response)
        if not self.enabled:
            return answer
        request = self._record("ListJobs", response).request
        if request.get("jobStatus") or request.get("filters"):
            return answer
        listed = json.loads(answer)
        listed["jobSummaryList"] = [
            j for j in listed["jobSummaryList"] if j.get("status") == "RUNNING"
        ]
        return json.dumps(listed)

    # --- running ------------------------------------------------------------------------

    def _enqueue(self, job: _Job) -> None:
        self._order += 1
        self._queue.append((time.monotonic() + self.runnable_delay, self._order, job))
        self._changed.notify_all()

    def _next(self) -> _Job | None:
        """The next RUNNABLE job whose delay is over, for a free worker; None: shut down."""
        with self._changed:
            while not self._closed:
                now = time.monotonic()
                ready = [q for q in self._queue if q[0] <= now]
                if ready:
                    first = min(ready, key=lambda q: q[1])
                    self._queue.remove(first)
                    job = first[2]
                    for target in [job, *job.nodes]:
                        target.status = "STARTING"
                    self._update_parent(job)
                    self._changed.notify_all()
                    return job
                soonest = min((q[0] for q in self._queue), default=now + 1)
                self._changed.wait(max(0.005, min(soonest - now, 1.0)))
            return None

    def _work(self) -> None:
        while (job := self._next()) is not None:
            try:
                self._attempt(job)
            except BaseException as e:  # a harness bug: end the job and tell the test
                self.errors.append(e)
                with self._changed:
                    job.job_stopped_reason = f"test executor error: {e!r}"
                    self._end(job, "FAILED")

    def image_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in IMAGE_ENV if k in os.environ}
        env["OMP_NUM_THREADS"] = "1"
        env.update(self.extra_env)
        return env

    def environment(self, job: _Job, attempt: int | None = None) -> dict[str, str]:
        """The container's environment as Batch gives it (``attempt``: with AWS_BATCH_*)."""
        env = self.image_env()
        base, overrides = _container_spec(job)
        for source in (base.get("environment"), overrides.get("environment")):
            env.update({e["name"]: e["value"] for e in source or []})
        env["AWS_BATCH_JOB_ID"] = job.job_id
        if job.node_index is not None:
            main = job.mnp.main_node
            env["AWS_BATCH_JOB_NODE_INDEX"] = str(job.node_index)
            env["AWS_BATCH_JOB_NUM_NODES"] = str(job.mnp.num_nodes)
            env["AWS_BATCH_JOB_MAIN_NODE_INDEX"] = str(main)
            if job.node_index != main:  # only the other nodes are told the main's address
                env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "127.0.0.1"
        if attempt is not None:
            env["AWS_BATCH_JOB_ATTEMPT"] = str(attempt)
            env["AWS_BATCH_JQ_NAME"] = job.job_queue.name
            env["AWS_BATCH_CE_NAME"] = _compute_env_name(job)
            if job.array_index is not None:
                env["AWS_BATCH_JOB_ARRAY_INDEX"] = str(job.array_index)
                env["AWS_BATCH_JOB_ARRAY_SIZE"] = str(job.array_size)
        return env

    def _command(self, job: _Job) -> list[str]:
        base, overrides = _container_spec(job)
        command = overrides.get("command") or base.get("command") or []
        return list(job._add_parameters_to_command(list(command)))

    def _fault_for(self, job: _Job, attempt: int) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.matches(job, attempt):
                    return fault
        return None

    def _attempt(self, job: _Job) -> None:
        """One attempt of ``job``: its process (a multi-node job: one per node) to the end."""
        attempt = len(job.ended_attempts) + 1
        units = [_Unit(target, self, attempt) for target in job.nodes or [job]]
        main = units[job.main_node if job.nodes else 0]
        logs = job.backend.logs_backend
        with self._logs_lock:
            logs.ensure_log_group(LOG_GROUP)
            for unit in units:
                logs.ensure_log_stream(LOG_GROUP, unit.stream)
        started = _now_ms()
        fault = self._fault_for(job, attempt)
        if fault is not None and fault.fault == "pull":
            fault.fired_on = job.job_id
            for unit in units:
                unit.container["reason"] = (
                    "CannotPullContainerError: pull image manifest has been retried 1 time(s): "
                    "failed to resolve ref (injected by the test)"
                )
            self._nodes_ended(job, units, started, _now_ms(), "Task failed to start")
            self._attempt_ended(
                job, attempt, started, main.summary(job), None, "Task failed to start"
            )
            return
        with self._changed:
            if job.terminate_reason is not None:  # terminated while STARTING
                self._end(job, "FAILED", reason=job.terminate_reason)
                return
            for unit in units:
                unit.start(self.cwd)
                self._live[unit.job.job_id] = unit.process
            started = _now_ms()
            for target in [job, *job.nodes]:
                target.log_stream_name = main.stream
                target.started_ms = started
                target.job_started_at = dt.datetime.fromtimestamp(started / 1000)
                target.status = "RUNNING"
            for unit in units:
                unit.job.log_stream_name = unit.stream
            self._update_parent(job)
            self._changed.notify_all()
        readers = [reader for unit in units for reader in unit.readers(self, logs)]
        with self.lock:
            self._readers = [t for t in self._readers if t.is_alive()] + readers
        for reader in readers:
            reader.start()
        limit = self.timeout
        if job.timeout and job.timeout.get("attemptDurationSeconds"):
            limit = min(limit, float(job.timeout["attemptDurationSeconds"]))
        t0 = time.monotonic()
        ending: tuple[str, Fault | None] | None = None  # why the executor stopped it
        while True:  # the job ends when its (main node's) process does
            try:
                main.process.wait(timeout=0.02)
                break
            except subprocess.TimeoutExpired:
                pass
            if ending is not None:
                continue
            ran = time.monotonic() - t0
            if job.terminate_reason is not None:
                ending = ("terminated", None)
                for unit in units:
                    self._escalate(unit.process)
            elif ran > limit:
                ending = ("timeout", None)
            elif self._closed:
                ending = ("shutdown", None)
            else:
                fault = self._fault_for(job, attempt)
                if fault is not None and (
                    any(fault.on_output in line for u in units for line in u.out + u.err)
                    if fault.on_output is not None
                    else ran >= fault.after
                ):
                    fault.fired_on = job.job_id
                    ending = ("fault", fault)
            if ending is not None and ending[0] != "terminated":
                for unit in units:
                    _kill_group(unit.process, signal.SIGKILL)
        stopped = _now_ms()
        for unit in units:  # the other nodes, and whatever a job left in its group
            _kill_group(unit.process, signal.SIGKILL)
        for unit in units:
            unit.process.wait(timeout=15)
        for reader in readers:
            reader.join(timeout=10)
        with self.lock:
            for unit in units:
                self._live.pop(unit.job.job_id, None)
        exit_code: int | None = _exit_code(main.process.returncode)
        status_reason = EXITED
        kind, fault = ending or ("exit", None)
        if kind == "fault" and fault is not None:
            if fault.fault == "host":
                exit_code = None
                status_reason = f"Host EC2 (instance {fault.instance}) terminated."
            else:
                exit_code = fault.exit_code
        elif kind == "timeout":
            exit_code, status_reason = None, TIMED_OUT
        elif kind == "shutdown":
            exit_code, status_reason = None, "test ended"
        for unit in units:
            code = exit_code if unit is main else _exit_code(unit.process.returncode)
            if exit_code is None:
                code = None  # the host (or the attempt) went: no container exited
            if code is not None:
                unit.container["exitCode"] = code
            self.executed.append(unit.executed(code, started, stopped, status_reason))
        self._nodes_ended(job, units, started, stopped, status_reason)
        self._attempt_ended(
            job, attempt, started, main.summary(job), exit_code, status_reason, stopped=stopped,
            final=kind in ("terminated", "timeout", "shutdown"),
        )  # fmt: skip

    def _nodes_ended(
        self, job: _Job, units: list[_Unit], started: int, stopped: int, reason: str
    ) -> None:
        """Each node of a multi-node attempt keeps its own attempt record."""
        if not job.nodes:
            return
        with self.lock:
            for unit in units:
                unit.job.ended_attempts.append(
                    {
                        "container": unit.container,
                        "startedAt": started,
                        "stoppedAt": stopped,
                        "statusReason": reason,
                    }
                )

    def _attempt_ended(
        self,
        job: _Job,
        attempt: int,
        started: int,
        container: dict[str, Any],
        exit_code: int | None,
        status_reason: str,
        stopped: int | None = None,
        final: bool = False,
    ) -> None:
        stopped = _now_ms() if stopped is None else stopped
        record = {
            "container": container,
            "startedAt": started,
            "stoppedAt": stopped,
            "statusReason": status_reason,
        }
        with self._changed:
            job.ended_attempts.append(record)
            job.started_ms = started
            job.log_stream_name = container["logStreamName"]
            for node in job.nodes:
                node.started_ms = started
            if exit_code == 0 and not final:
                job.job_stopped_reason = status_reason
                self._end(job, "SUCCEEDED", stopped)
                return
            strategy = job.retry_strategy or {}
            action = retry_action(
                strategy.get("evaluateOnExit") or [],
                exit_code,
                container.get("reason", ""),
                status_reason,
            )
            if not final and action == "RETRY" and attempt < int(strategy.get("attempts", 1)):
                for target in [job, *job.nodes]:
                    target.status = "RUNNABLE"
                self._update_parent(job)
                self._enqueue(job)
                return
            job.job_stopped_reason = job.terminate_reason or status_reason
            self._end(job, "FAILED", stopped)

    def _end(
        self, job: _Job, status: str, stopped: int | None = None, reason: str | None = None
    ) -> None:
        """End ``job`` (the lock held): moto's stopped fields, the parent, the waiters."""
        if reason is not None:
            job.job_stopped_reason = reason
        job.stopped_ms = _now_ms() if stopped is None else stopped
        job.job_stopped = True
        job.job_stopped_at = dt.datetime.fromtimestamp(job.stopped_ms / 1000)
        last = job.ended_attempts[-1]["container"] if job.ended_attempts else {}
        job.exit_code = last.get("exitCode")
        job.status = status
        for node in job.nodes:  # a multi-node job's nodes end with it
            if node.status not in ENDED:
                self._end(node, status, job.stopped_ms, job.job_stopped_reason)
        self._update_parent(job)
        self._changed.notify_all()

    def _update_parent(self, job: _Job) -> None:
        parent = job.parent
        if parent is None or parent.status in ENDED:
            return
        children = parent.children
        # The first child start ever: a retried child's started_ms moves to its last
        # attempt's, which must not move the parent's start later.
        starts = [c.started_ms for c in (parent, *children) if c.started_ms is not None]
        if starts:
            parent.started_ms = min(starts)
        if all(c.status in ENDED for c in children):
            failed = any(c.status == "FAILED" for c in children)
            if failed:
                parent.job_stopped_reason = CHILD_FAILED
            parent.stopped_ms = max(c.stopped_ms for c in children)
            parent.job_stopped = True
            parent.job_stopped_at = dt.datetime.fromtimestamp(parent.stopped_ms / 1000)
            parent.status = "FAILED" if failed else "SUCCEEDED"
        elif any(c.status not in NOT_STARTED for c in children):
            parent.status = "RUNNING"

    def _escalate(self, process: subprocess.Popen[bytes]) -> None:
        """TerminateJob: SIGTERM the group (sent already), SIGKILL after the grace."""
        _kill_group(process, signal.SIGTERM)

        def kill_later() -> None:
            try:
                process.wait(timeout=self.term_grace)
            except subprocess.TimeoutExpired:
                _kill_group(process, signal.SIGKILL)

        killer = threading.Thread(target=kill_later, daemon=True, name=f"kill-{process.pid}")
        with self.lock:
            self._readers.append(killer)
        killer.start()

    def _read(self, pipe: Any, sink: list[str], logs: Any, stream: str) -> None:
        """Copy one pipe of the process to ``sink`` and, a line an event, to its log stream."""
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            sink.append(line)
            message = line.rstrip("\r\n")
            if message:
                with self._logs_lock:
                    logs.put_log_events(
                        LOG_GROUP, stream, [{"timestamp": _now_ms(), "message": message}]
                    )
        pipe.close()


def _covers(target: str, index: int, num_nodes: int) -> bool:
    """Whether a ``targetNodes`` range (``"0:"``, ``":1"``, ``"2"``, ``"1:3"``) holds ``index``."""
    start, sep, end = target.partition(":")
    if not sep:
        return int(start) == index
    return (int(start) if start else 0) <= index <= (int(end) if end else num_nodes - 1)


def _container_spec(job: _Job) -> tuple[dict[str, Any], dict[str, Any]]:
    """The container a job (or a node of a multi-node job) runs, and its submitted overrides."""
    if job.node_index is None:
        return job.job_definition.container_properties or {}, job.container_overrides or {}
    parent, base, overrides = job.mnp, {}, {}
    for node_range in job.job_definition.node_properties.get("nodeRangeProperties") or []:
        if _covers(node_range["targetNodes"], job.node_index, parent.num_nodes):
            base = node_range.get("container") or {}
    for override in parent.node_overrides.get("nodePropertyOverrides") or []:
        if _covers(override["targetNodes"], job.node_index, parent.num_nodes):
            overrides = override.get("containerOverrides") or {}
    return base, overrides


class _Unit:
    """One process of an attempt: a job's, or one node's of a multi-node job."""

    def __init__(self, job: _Job, executor: BatchExecutor, attempt: int) -> None:
        self.job = job
        self.attempt = attempt
        self.command = executor._command(job)
        self.env = executor.environment(job, attempt)
        task = uuid.uuid4().hex
        self.stream = f"{job.job_definition.name}/default/{task}"
        self.container: dict[str, Any] = {
            "containerInstanceArn": f"arn:aws:ecs:{REGION}:123456789012:container-instance/{task}",
            "taskArn": f"arn:aws:ecs:{REGION}:123456789012:task/{task}",
            "logStreamName": self.stream,
            "networkInterfaces": [],
        }
        self.out: list[str] = []
        self.err: list[str] = []
        self.process: subprocess.Popen[bytes] = None  # type: ignore[assignment]

    def start(self, cwd: str | os.PathLike[str]) -> None:
        self.process = subprocess.Popen(
            self.command,
            env=self.env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def readers(self, executor: BatchExecutor, logs: Any) -> list[threading.Thread]:
        pipes = ((self.process.stdout, self.out, "out"), (self.process.stderr, self.err, "err"))
        return [
            threading.Thread(
                target=executor._read,
                args=(pipe, sink, logs, self.stream),
                daemon=True,
                name=f"{self.job.job_id}-{name}",
            )
            for pipe, sink, name in pipes
        ]

    def summary(self, job: _Job) -> dict[str, Any]:
        """The attempt's container on the job's own record: a multi-node job's has no exit
        code (its main node's record has)."""
        if not job.nodes:
            return self.container
        return {k: v for k, v in self.container.items() if k != "exitCode"}

    def executed(self, code: int | None, started: int, stopped: int, reason: str) -> ExecutedJob:
        return ExecutedJob(
            self.job.job_id, self.command, self.env, code, "".join(self.out), "".join(self.err),
            self.attempt, self.job.array_index, started, stopped, reason, self.stream,
            self.process.pid, self.job.node_index,
        )  # fmt: skip


def _compute_env_name(job: _Job) -> str:
    environments = job.job_queue.environments or []
    return environments[0].name if environments else ""


def _kill_group(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Backstop:
    """Shuts the executor down when the monkeypatch undoes ``armed`` (end of the test)."""

    def __init__(self, executor: BatchExecutor) -> None:
        object.__setattr__(self, "executor", executor)
        object.__setattr__(self, "armed", False)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "armed" and not value:
            self.executor.shutdown()


def run_batch_executor(monkeypatch: pytest.MonkeyPatch, **options: Any) -> Iterator[BatchExecutor]:
    """A fixture body: the installed :class:`BatchExecutor` (``options``: its parameters),
    shut down at the end of the test (every process killed, every thread joined)."""
    executor = BatchExecutor(**options).install(monkeypatch)
    try:
        yield executor
    finally:
        executor.shutdown()


class LocalBatchExecutor(BatchExecutor):
    """The executor where each job ends before SubmitJob returns (``sync_submit``)."""

    def __init__(self, timeout: float = 600, **options: Any) -> None:
        options.setdefault("sync_submit", True)
        options.setdefault("runnable_delay", 0.0)
        super().__init__(timeout=timeout, **options)
