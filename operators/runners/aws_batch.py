"""AWS Batch runner: the job as a Batch job, single-node or multi-node parallel (torchrun).

Submission, waiting, deferral and termination go through the Amazon provider
(``BatchClientHook``, ``BatchJobTrigger``); this module only builds the request from a
:class:`~embedfresh.operators.job_spec.JobSpec` and maps the finished job back to the exit-code
contract. The provider (and with it boto3) is imported on first use, never at module
level, so DAG files that name this runner still parse fast.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any

from embedfresh.core.exit_codes import ExitCode
from embedfresh.operators.constants import ARTIFACT_ROOT_ENV
from embedfresh.operators.job_spec import JobSpec
from embedfresh.operators.runners.base import JobResult
from embedfresh.operators.runners.local import DEFAULT_ENV

if TYPE_CHECKING:
    from airflow.providers.amazon.aws.hooks.batch_client import BatchClientHook
    from airflow.providers.amazon.aws.triggers.batch import BatchJobTrigger

#: Environment of every node of a multi-node job: libfabric over EFA with RDMA, the
#: transport NCCL (aws-ofi-nccl) and the Neuron collectives use between trn1/p5 nodes.
EFA_ENV: Mapping[str, str] = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}

#: Batch's own retries (``retryStrategy.evaluateOnExit``, at most 5 rules, first match
#: wins). Batch retries only what a new attempt on another host can fix: the job's
#: "transient" exit code 75, a reclaimed host (Spot), an image that did not pull, a task
#: that did not start. Everything else exits to Airflow, which maps the exit code:
#: 2, 3 and 4 fail for good, a crash is retried per the task's own retry policy, so a
#: crash is never retried twice over.
EVALUATE_ON_EXIT: tuple[Mapping[str, str], ...] = (
    {"onExitCode": str(int(ExitCode.TRANSIENT)), "action": "RETRY"},
    {"onStatusReason": "Host EC2*", "action": "RETRY"},
    {"onReason": "CannotPullContainerError*", "action": "RETRY"},
    {"onStatusReason": "Task failed to start", "action": "RETRY"},
    {"onReason": "*", "action": "EXIT"},  # 2, 3, 4 and crashes: Airflow decides
)

_JOB_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class BatchSettings:
    """Where and how a job runs on AWS Batch; the operator's ``batch`` dict holds these.

    :param job_definition: job definition name, ``name:revision`` or ARN. For
        ``num_nodes > 1`` a multi-node parallel definition whose main node is node 0 and
        whose node range is open-ended (``"0:"``), so ``numNodes`` can be overridden.
        Neuron devices (``/dev/neuron*``) are mapped there too (``linuxParameters``):
        Batch cannot override them at submit time.
    :param job_queue: job queue name or ARN.
    :param aws_conn_id: Airflow connection for AWS credentials; ``None``: boto3 defaults.
    :param region_name: AWS region; ``None``: the connection's or boto3's.
    :param share_identifier: fair-share identifier (only on queues with a fair-share policy).
    :param scheduling_priority_override: fair-share priority; higher runs first.
    :param num_nodes: nodes; above 1 a multi-node parallel job launched with torchrun.
    :param gpus: GPUs per node (``resourceRequirements`` type ``GPU``).
    :param vcpus: vCPUs per node (``resourceRequirements`` type ``VCPU``).
    :param memory: memory per node in MiB (``resourceRequirements`` type ``MEMORY``).
    :param retry_attempts: Batch attempts (1-10) for the faults in :data:`EVALUATE_ON_EXIT`.
    :param tags: tags of the submitted job.
    :param deferrable: wait in the triggerer (``BatchJobTrigger``) instead of the worker.
    :param poll_interval: seconds between status checks.
    :param max_polls: status checks before giving up waiting (retryable failure).
    :param python: the interpreter inside the image.
    :param master_port: torchrun's rendezvous port on the main node (multi-node only).
    """

    job_definition: str
    job_queue: str
    aws_conn_id: str | None = "aws_default"
    region_name: str | None = None
    share_identifier: str | None = None
    scheduling_priority_override: int | None = None
    num_nodes: int = 1
    gpus: int | None = None
    vcpus: int | None = None
    memory: int | None = None
    retry_attempts: int = 3
    tags: Mapping[str, str] = field(default_factory=dict)
    deferrable: bool = False
    poll_interval: float = 30
    max_polls: int = 4200
    python: str = "python"
    master_port: int = 29500

    def __post_init__(self) -> None:
        problems = []
        if not self.job_definition or not self.job_queue:
            problems.append("job_definition and job_queue are required")
        if self.num_nodes < 1:
            problems.append(f"num_nodes must be >= 1, got {self.num_nodes}")
        if not 1 <= self.retry_attempts <= 10:
            problems.append(
                f"retry_attempts must be 1-10 (a Batch limit), got {self.retry_attempts}"
            )
        for name in ("gpus", "vcpus", "memory"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "gpus" else 1):
                problems.append(f"{name} must be positive, got {value}")
        if self.poll_interval < 0 or self.max_polls < 1:
            problems.append("poll_interval must be >= 0 and max_polls >= 1")
        if problems:
            raise ValueError("invalid AWS Batch settings: " + "; ".join(problems))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> BatchSettings:
        """Settings from the operator's (rendered) ``batch`` dict; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown AWS Batch settings {unknown}; known: {', '.join(sorted(known))}"
            )
        return cls(**values)

    def resource_requirements(self) -> list[dict[str, str]]:
        wanted = (("GPU", self.gpus), ("VCPU", self.vcpus), ("MEMORY", self.memory))
        return [{"type": kind, "value": str(value)} for kind, value in wanted if value]


class AwsBatchRunner:
    """Runs a job spec as an AWS Batch job through the Amazon provider's ``BatchClientHook``.

    Blocking: :meth:`run` submits, polls with the hook's back-off, and maps the outcome.
    Deferrable: :meth:`start` submits and returns a ``BatchJobTrigger`` (or the result,
    if the job already ended); :meth:`resume` maps the trigger's event.
    """

    def __init__(self, settings: BatchSettings) -> None:
        self.settings = settings
        self.job_id: str | None = None

    @classmethod
    def from_settings(cls, **values: Any) -> AwsBatchRunner:
        """The runner for an operator's ``runner_settings`` (:class:`BatchSettings` fields).

        :raises ValueError: unknown or invalid settings.
        """
        return cls(BatchSettings.from_mapping(values))

    @property
    def deferrable(self) -> bool:
        return self.settings.deferrable

    @cached_property
    def hook(self) -> BatchClientHook:
        from airflow.providers.amazon.aws.hooks.batch_client import BatchClientHook

        return BatchClientHook(
            aws_conn_id=self.settings.aws_conn_id,
            region_name=self.settings.region_name,
            max_retries=self.settings.max_polls,
        )

    # --- the request ------------------------------------------------------------------

    def job_name(self, spec: JobSpec) -> str:
        """``embedfresh-<job>-<run_id>`` in Batch's alphabet, at most 128 characters."""
        run_id = str(spec.settings.get("run_id", ""))
        return _JOB_NAME_CHARS.sub("-", f"embedfresh-{spec.job}-{run_id}").strip("-")[:128]

    def environment(self, spec: JobSpec) -> list[dict[str, str]]:
        """The spec's env (``NEURON_CC_FLAGS``, ``NEURON_COMPILE_CACHE_URL``, ...) over the
        defaults, plus the artifact root; Batch reserves the ``AWS_BATCH`` prefix."""
        env = {**DEFAULT_ENV, "PYTHONUNBUFFERED": "1"}
        if "artifact_root" in spec.settings:
            env[ARTIFACT_ROOT_ENV] = str(spec.settings["artifact_root"])
        env.update({k: str(v) for k, v in spec.env.items()})
        if self.settings.num_nodes > 1:
            env.update(EFA_ENV)
        reserved = sorted(k for k in env if k.startswith("AWS_BATCH"))
        if reserved:
            raise ValueError(f"AWS Batch reserves environment names starting AWS_BATCH: {reserved}")
        return [{"name": k, "value": v} for k, v in env.items()]

    def command(self, spec: JobSpec) -> list[str]:
        """``python -m embedfresh.jobs.X --set ...`` on one node; a torchrun launcher across nodes.

        The launcher is :mod:`embedfresh.jobs.launch` (torchrun's own arguments), which exits with the
        failing worker's code, so ``evaluateOnExit`` sees 2/3/4/75 and not torchrun's 1.

        Across nodes, Batch tells each node its index and the node count, and every node
        but the main one the main node's address: the main node falls back to its own
        address at run time, which only a shell on that node can know.
        """
        if self.settings.num_nodes == 1:
            return spec.argv(self.settings.python)
        torchrun = [
            self.settings.python, "-m", "embedfresh.jobs.launch",
            "--nnodes", "$AWS_BATCH_JOB_NUM_NODES",
            "--node_rank", "$AWS_BATCH_JOB_NODE_INDEX",
            "--nproc-per-node", str(spec.nproc_per_node),
            "--master_addr", "$MASTER_ADDR",
            "--master_port", str(self.settings.master_port),
        ]  # fmt: skip
        # $VARS stay unquoted-for-expansion (inside double quotes); the rest is shell-quoted.
        launcher = " ".join(f'"{a}"' if a.startswith("$") else shlex.quote(a) for a in torchrun)
        job = shlex.join(["-m", spec.module, *spec.job_args()])
        script = (
            'MASTER_ADDR="${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:-}"; '
            'if [ -z "$MASTER_ADDR" ]; then set -- $(hostname -i); MASTER_ADDR="$1"; fi; '
            f"exec {launcher} {job}"
        )
        return ["sh", "-c", script]

    def container_overrides(self, spec: JobSpec) -> dict[str, Any]:
        overrides: dict[str, Any] = {
            "command": self.command(spec),
            "environment": self.environment(spec),
        }
        if resources := self.settings.resource_requirements():
            overrides["resourceRequirements"] = resources
        return overrides

    def retry_strategy(self) -> dict[str, Any]:
        return {
            "attempts": self.settings.retry_attempts,
            "evaluateOnExit": [dict(rule) for rule in EVALUATE_ON_EXIT],
        }

    def submit_job_request(self, spec: JobSpec) -> dict[str, Any]:
        """The ``SubmitJob`` request for ``spec``: container or node overrides, retries, share."""
        s = self.settings
        request: dict[str, Any] = {
            "jobName": self.job_name(spec),
            "jobQueue": s.job_queue,
            "jobDefinition": s.job_definition,
            "retryStrategy": self.retry_strategy(),
        }
        if s.num_nodes == 1:
            request["containerOverrides"] = self.container_overrides(spec)
        else:
            # Multi-node jobs take their overrides per node range, never top-level.
            request["nodeOverrides"] = {
                "numNodes": s.num_nodes,
                "nodePropertyOverrides": [
                    {"targetNodes": "0:", "containerOverrides": self.container_overrides(spec)}
                ],
            }
        if s.share_identifier is not None:
            request["shareIdentifier"] = s.share_identifier
        if s.scheduling_priority_override is not None:
            request["schedulingPriorityOverride"] = s.scheduling_priority_override
        if s.tags:
            request["tags"] = dict(s.tags)
        return request

    # --- running ----------------------------------------------------------------------

    def submit(self, spec: JobSpec, log: logging.Logger) -> str:
        request = self.submit_job_request(spec)
        log.info(
            "Submitting AWS Batch job %s (definition %s, queue %s, %d node(s)): %s",
            request["jobName"], request["jobDefinition"], request["jobQueue"],
            self.settings.num_nodes, shlex.join(self.command(spec)),
        )  # fmt: skip
        from airflow.sdk.exceptions import AirflowException

        try:
            response = self.hook.client.submit_job(**request)
        except Exception as e:
            raise AirflowException(
                f"AWS Batch refused job {request['jobName']} on queue {request['jobQueue']}: {e}"
            ) from e
        self.job_id = response["jobId"]
        log.info("AWS Batch job %s submitted as %s", request["jobName"], self.job_id)
        return self.job_id

    def run(self, spec: JobSpec, log: logging.Logger) -> JobResult:
        job_id = self.submit(spec, log)
        self.hook.wait_for_job(job_id, delay=self.settings.poll_interval)
        return self._finished(job_id, log)

    def start(self, spec: JobSpec, log: logging.Logger) -> JobResult | BatchJobTrigger:
        """Submit; the result if the job already ended, else the trigger to defer to."""
        job_id = self.submit(spec, log)
        result = self.result(job_id)
        return result if result is not None else self.trigger(job_id)

    def trigger(self, job_id: str) -> BatchJobTrigger:
        from airflow.providers.amazon.aws.triggers.batch import BatchJobTrigger

        return BatchJobTrigger(
            job_id=job_id,
            aws_conn_id=self.settings.aws_conn_id,
            region_name=self.settings.region_name,
            waiter_delay=max(1, int(self.settings.poll_interval)),
            waiter_max_attempts=self.settings.max_polls,
        )

    def resume(self, event: dict[str, Any] | None, log: logging.Logger) -> JobResult:
        """Map the ``BatchJobTrigger`` event: the job's own outcome, whatever the waiter said."""
        from airflow.providers.amazon.aws.utils import validate_execute_complete_event
        from airflow.sdk.exceptions import AirflowException

        event = validate_execute_complete_event(event)
        job_id = event.get("job_id")
        if not job_id:
            raise AirflowException(f"AWS Batch trigger event names no job: {event}")
        self.job_id = job_id
        if event.get("status") != "success":
            log.warning("AWS Batch trigger for job %s ended: %s", job_id, event.get("message"))
        return self._finished(job_id, log)

    def _finished(self, job_id: str, log: logging.Logger) -> JobResult:
        from airflow.sdk.exceptions import AirflowException

        result = self.result(job_id)
        if result is None:
            raise AirflowException(
                f"AWS Batch job {job_id} has not finished after waiting; the task's retry "
                "submits it again and the job resumes from its checkpoint"
            )
        details = result.details
        log.info(
            "AWS Batch job %s (%s) %s with exit code %s after %s attempt(s); its output is "
            "in log stream %s: %s",
            job_id, details.get("job_name"), details.get("status"), result.exit_code,
            details.get("attempts"), details.get("log_stream"), result.tail,
        )  # fmt: skip
        return result

    def result(self, job_id: str) -> JobResult | None:
        """The finished job's outcome (``None`` while it still runs), from DescribeJobs."""
        job = self.hook.get_job_description(job_id)
        main_node = None
        if job.get("status") == "FAILED" and job_exit_code(job) is None and "nodeProperties" in job:
            # A multi-node job keeps the main node's exit code on that node's own record.
            main = f"{job_id}#{job['nodeProperties'].get('mainNode', 0)}"
            nodes = self.hook.client.describe_jobs(jobs=[main]).get("jobs", [])
            main_node = nodes[0] if nodes else None
        return job_result(job, main_node)

    def kill(self) -> None:
        """Terminate the submitted job (``on_kill``); Batch stops every node of it."""
        if self.job_id is not None:
            self.hook.terminate_job(self.job_id, reason="Airflow task killed (on_kill)")


def job_exit_code(job: Mapping[str, Any]) -> int | None:
    """The container's exit code in a DescribeJobs record: last attempt's, else the job's."""
    attempts = job.get("attempts") or []
    for container in (attempts[-1].get("container") if attempts else None, job.get("container")):
        if container and container.get("exitCode") is not None:
            return int(container["exitCode"])
    return None


def job_result(
    job: Mapping[str, Any], main_node: Mapping[str, Any] | None = None
) -> JobResult | None:
    """Map a DescribeJobs record to the exit-code contract; ``None`` while it runs.

    SUCCEEDED is exit 0; FAILED carries the container's exit code, from the main node's
    record for multi-node jobs. A FAILED job with no exit code never ran to an exit (host
    reclaimed, image not pulled, terminated, timed out): 75, transient, so Airflow
    retries and the job resumes. The result's details name the Batch job (for the task
    log); what the job returned is in its result record in the artifact store, which
    the operator reads, and its stdout in its log stream.
    """
    status = job.get("status")
    if status not in ("SUCCEEDED", "FAILED"):
        return None
    code = job_exit_code(job)
    if code is None and main_node is not None:
        code = job_exit_code(main_node)
    if code is None:
        code = int(ExitCode.OK) if status == "SUCCEEDED" else int(ExitCode.TRANSIENT)
    attempts = job.get("attempts") or []
    container = (attempts[-1].get("container") if attempts else None) or job.get("container") or {}
    reason = "; ".join(part for part in (job.get("statusReason"), container.get("reason")) if part)
    details = {
        "aws_batch_job_id": job.get("jobId"),
        "job_name": job.get("jobName"),
        "status": status,
        "exit_code": code,
        "attempts": len(attempts),
        "log_stream": container.get("logStreamName"),
    }
    tail = f"AWS Batch job {job.get('jobId')} {status}" + (f": {reason}" if reason else "")
    return JobResult(exit_code=code, summary=None, tail=tail, details=details)
