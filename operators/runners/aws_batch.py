"""AWS Batch runner: the job as a Batch job, single-node or multi-node parallel (torchrun).

Submission, waiting, deferral and termination go through the Amazon provider
(``BatchClientHook``, ``BatchJobTrigger``); this module only builds the request from a
:class:`~embedfresh.operators.job_spec.JobSpec` and maps the finished job back to the exit-code
contract. The provider (and with it boto3) is imported on first use, never at module
level, so DAG files that name this runner still parse fast.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shlex
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from embedfresh.core.exit_codes import ExitCode
from embedfresh.operators.constants import ARTIFACT_ROOT_ENV
from embedfresh.operators.job_spec import JobSpec
from embedfresh.operators.runners.base import JobResult
from embedfresh.operators.runners.local import DEFAULT_ENV

if TYPE_CHECKING:
    from airflow.providers.amazon.aws.hooks.batch_client import BatchClientHook
    from airflow.providers.amazon.aws.hooks.logs import AwsLogsHook

    from embedfresh.operators.runners.aws_batch_trigger import BatchJobKillingTrigger

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

#: Batch states of a job that has not ended: one a retry attaches to instead of submitting.
LIVE_STATES = frozenset({"SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING"})
#: Batch's own names for a job's end.
END_STATES = frozenset({"SUCCEEDED", "FAILED"})
#: Not yet placed: a multi-node job's nodes have no log stream to read.
_QUEUED = frozenset({"SUBMITTED", "PENDING", "RUNNABLE"})

#: The task state store key (``context["task_state_store"]``, one per task instance,
#: kept across tries) under which the runner records the job it submitted.
#:
#: Not Airflow 3.3's ``ResumableJobMixin``, which does the same on the synchronous path
#: only: it cannot hand its reconnect decision to a deferred wait (apache/airflow#71485,
#: as the provider's ``GlueJobOperator`` notes), and a worker lost between SubmitJob and
#: the store's write resubmits a duplicate job. The runner closes that window by finding
#: the job by its name (:meth:`AwsBatchRunner.job_name`), deferred or not, for any operator.
STATE_KEY = "embedfresh_aws_batch_job"
#: Tags of every submitted job: the result record it writes, so a retry that finds the
#: job by name (the worker died before recording it) reads that job's record.
TAG_RESULT_NAME = "embedfresh:result-name"
TAG_ATTEMPT_ID = "embedfresh:attempt-id"

#: DescribeJobs takes at most 100 job ids per call.
_DESCRIBE_CHUNK = 100


class TaskStateStore(Protocol):
    """What the runner needs of Airflow's ``context["task_state_store"]``."""

    def get(self, key: str, default: Any = None) -> Any: ...

    def set(self, key: str, value: Any) -> None: ...


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
        An operator passes its own ``aws_conn_id`` argument here; giving it inside
        ``batch=`` is kept for compatibility.
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
        An operator passes its own ``deferrable`` argument here (default: Airflow's
        ``[operators] default_deferrable``).
    :param poll_interval: seconds between status checks.
    :param max_polls: status checks before giving up waiting (retryable failure).
    :param python: the interpreter inside the image.
    :param master_port: torchrun's rendezvous port on the main node (multi-node only).
    :param log_group: the CloudWatch Logs group of the job definition's ``awslogs`` driver
        (Batch's default ``/aws/batch/job``): the job's output is copied from it into
        the task log.
    :param child_logs: for an array job, also copy every child's log into the task log
        once the job ends (off by default: 10,000 children are a lot of log).
    :param instance_type: what a node is billed as in the job's cost record (a key of
        :data:`embedfresh.core.cost.PRICES_USD`); ``None``: the backend's default.
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
    log_group: str = "/aws/batch/job"
    child_logs: bool = False
    instance_type: str | None = None

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
    """Runs a job spec as an AWS Batch job through the Amazon provider's hooks.

    Blocking: :meth:`run` submits, polls, and copies the job's CloudWatch log into the
    task log as it grows. Deferrable: :meth:`start` submits and returns a trigger (or
    the result, if the job already ended); :meth:`resume` maps the trigger's event and
    copies the log then. Either way :meth:`attach` first looks for this task instance's
    job still running (recorded in the task state store, else found by its
    deterministic name), so a retry after a lost worker waits on that job instead of
    submitting a second one that bills and writes beside it.
    """

    def __init__(self, settings: BatchSettings) -> None:
        self.settings = settings
        self.job_id: str | None = None
        self._state: TaskStateStore | None = None
        self._spec: JobSpec | None = None
        self._links: tuple[Any, Any] | None = None

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

    @cached_property
    def logs_hook(self) -> AwsLogsHook:
        from airflow.providers.amazon.aws.hooks.logs import AwsLogsHook

        return AwsLogsHook(
            aws_conn_id=self.settings.aws_conn_id, region_name=self.settings.region_name
        )

    # --- the links a person follows from the task -------------------------------------

    def link_to(self, context: Any, operator: Any) -> None:
        """Persist the provider's Batch links (job, definition, queue, CloudWatch log) of
        the job this runner submits, attaches to or resumes, into ``context``'s XCom, as
        the provider's ``BatchOperator`` does; nothing without a task instance."""
        has_ti = hasattr(context, "get") and context.get("ti") is not None
        self._links = (context, operator) if has_ti else None

    def _persist_links(self, job_id: str, job: Mapping[str, Any] | None = None) -> None:
        """The job's details link; with its DescribeJobs record, its definition, queue and
        newest CloudWatch log stream too. Never fails the task: a link is not the job."""
        if self._links is None:
            return
        from airflow.providers.amazon.aws.links.batch import (
            BatchJobDefinitionLink,
            BatchJobDetailsLink,
            BatchJobQueueLink,
        )
        from airflow.providers.amazon.aws.links.logs import CloudWatchEventsLink

        context, operator = self._links
        try:
            where = {
                "context": context,
                "operator": operator,
                "region_name": self.hook.conn_region_name,
                "aws_partition": self.hook.conn_partition,
            }
            BatchJobDetailsLink.persist(**where, job_id=job_id)
            if job is None:
                return
            if job.get("jobDefinition"):
                BatchJobDefinitionLink.persist(**where, job_definition_arn=job["jobDefinition"])
            if job.get("jobQueue"):
                BatchJobQueueLink.persist(**where, job_queue_arn=job["jobQueue"])
            if job.get("container") or job.get("nodeProperties"):
                if awslogs := self.hook.get_job_all_awslogs_info(job_id):
                    CloudWatchEventsLink.persist(**where, **awslogs[-1])  # the newest attempt
        except Exception as e:
            logging.getLogger(__name__).warning(
                "Could not store the links of AWS Batch job %s: %s", job_id, e
            )

    # --- the request ------------------------------------------------------------------

    def job_name(self, spec: JobSpec) -> str:
        """``embedfresh-<job>-<run_id>-<hash>`` in Batch's alphabet, at most 128 characters.

        Deterministic per task instance: the hash covers the run id and the result
        record's name (DAG, task, map index), so a retry computes the same name and
        can find a job its lost predecessor submitted; two tasks of one run never share it.
        """
        run_id = str(spec.settings.get("run_id", ""))
        who = spec.result.name if spec.result is not None else ""
        digest = hashlib.sha256(f"{spec.job}\0{run_id}\0{who}".encode()).hexdigest()[:12]
        readable = _JOB_NAME_CHARS.sub("-", f"embedfresh-{spec.job}-{run_id}").strip("-")
        return f"{readable[: 128 - len(digest) - 1]}-{digest}"

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
        """The ``SubmitJob`` request for ``spec``: container or node overrides, retries,
        array size, share, and the tags naming the result record the job writes."""
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
        if spec.array_size > 1:
            if s.num_nodes > 1:
                raise ValueError("AWS Batch runs no multi-node job as an array job")
            request["arrayProperties"] = {"size": spec.array_size}
        if s.share_identifier is not None:
            request["shareIdentifier"] = s.share_identifier
        if s.scheduling_priority_override is not None:
            request["schedulingPriorityOverride"] = s.scheduling_priority_override
        tags = dict(s.tags)
        if spec.result is not None:
            tags[TAG_RESULT_NAME] = spec.result.name
            tags[TAG_ATTEMPT_ID] = spec.result.attempt_id
        if tags:
            request["tags"] = tags
        return request

    # --- attaching or submitting --------------------------------------------------------

    def attach(
        self, spec: JobSpec, log: logging.Logger, state: TaskStateStore | None = None
    ) -> JobSpec:
        """Find this task instance's job if it is still running; the spec to go on with.

        First the job recorded in ``state`` (Airflow's task state store), then, because a
        worker can die between ``SubmitJob`` and recording its answer, a live job under
        this task instance's deterministic name (:meth:`job_name`, ``ListJobs``). Found:
        the runner waits on it (:meth:`run`, :meth:`start` submit nothing) and the spec
        returned carries that job's result ticket (from its tags), so the record it
        writes is the one read. Not found: ``spec`` itself; a job that ended is never
        attached to: the next one resumes from the checkpoint.
        """
        from embedfresh.core.results import ResultTicket

        self._state = state
        recorded = state.get(STATE_KEY) if state is not None else None
        job, how = None, ""
        if isinstance(recorded, Mapping) and recorded.get("job_id"):
            found = self._describe([str(recorded["job_id"])])
            if found and found[0].get("status") in LIVE_STATES:
                job, how = found[0], "recorded in the task state store"
            else:
                status = found[0].get("status") if found else "unknown to Batch"
                log.info(
                    "AWS Batch job %s of an earlier try is %s: not attaching",
                    recorded["job_id"], status,
                )  # fmt: skip
        if job is None:
            job, how = self._live_job_named(self.job_name(spec)), "found by its name"
        if job is None:
            return spec
        tags = job.get("tags") or {}
        if not (tags.get(TAG_RESULT_NAME) and tags.get(TAG_ATTEMPT_ID)):
            log.warning(
                "AWS Batch job %s (%s) carries no result tags, so its record could not be "
                "told from another's: not attaching, a new job is submitted",
                job.get("jobId"), job.get("jobName"),
            )  # fmt: skip
            return spec
        self.job_id = str(job["jobId"])
        self._persist_links(self.job_id)
        ticket = ResultTicket(name=tags[TAG_RESULT_NAME], attempt_id=tags[TAG_ATTEMPT_ID])
        log.info(
            "Re-attaching to AWS Batch job %s (%s), %s, %s: no second job is submitted",
            self.job_id, job.get("jobName"), job.get("status"), how,
        )  # fmt: skip
        self._record(self.job_id, ticket, log)
        return replace(spec, result=ticket)

    def _live_job_named(self, name: str) -> dict[str, Any] | None:
        """The newest job of the queue named ``name`` that has not ended, if any."""
        pages = self.hook.client.get_paginator("list_jobs").paginate(
            jobQueue=self.settings.job_queue,
            filters=[{"name": "JOB_NAME", "values": [name]}],
        )
        summaries = [j for page in pages for j in page.get("jobSummaryList", [])]
        live = [j for j in summaries if j.get("jobName") == name and j.get("status") in LIVE_STATES]
        if not live:
            return None
        newest = max(live, key=lambda j: j.get("createdAt", 0))
        found = self._describe([newest["jobId"]])
        return found[0] if found else None

    def _describe(self, job_ids: Iterable[str]) -> list[dict[str, Any]]:
        """DescribeJobs in chunks of 100 (Batch's limit), in the order asked."""
        ids = list(job_ids)
        jobs: dict[str, dict[str, Any]] = {}
        for i in range(0, len(ids), _DESCRIBE_CHUNK):
            response = self.hook.client.describe_jobs(jobs=ids[i : i + _DESCRIBE_CHUNK])
            jobs.update({j["jobId"]: j for j in response.get("jobs", [])})
        return [jobs[i] for i in ids if i in jobs]

    def _record(self, job_id: str, ticket: Any, log: logging.Logger) -> None:
        if self._state is None:
            return
        value = {"job_id": job_id, "result": ticket.to_dict() if ticket is not None else None}
        try:
            self._state.set(STATE_KEY, value)
        except Exception as e:  # the name still finds the job on a retry
            log.warning("Could not record AWS Batch job %s in the task state store: %s", job_id, e)

    def submit(self, spec: JobSpec, log: logging.Logger) -> str:
        request = self.submit_job_request(spec)
        what = f"an array of {spec.array_size}" if spec.array_size > 1 else "a job"
        log.info(
            "Submitting AWS Batch job %s as %s (definition %s, queue %s, %d node(s)): %s",
            request["jobName"], what, request["jobDefinition"], request["jobQueue"],
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
        self._persist_links(self.job_id)
        self._record(self.job_id, spec.result, log)
        return self.job_id

    # --- running ----------------------------------------------------------------------

    def run(self, spec: JobSpec, log: logging.Logger) -> JobResult:
        """Submit (unless :meth:`attach` found the job), wait, copy its log, map its end."""
        self._spec = spec
        job_id = self.job_id or self.submit(spec, log)
        self._wait(job_id, log)
        return self._finished(job_id, log)

    def _wait(self, job_id: str, log: logging.Logger) -> None:
        """Poll until the job ends, copying each attempt's log lines as they arrive."""
        from airflow.sdk.exceptions import AirflowException

        copier = LogCopier(self.logs_hook, self.settings.log_group, log)
        for _ in range(self.settings.max_polls):
            [job] = self._describe([job_id]) or [{}]
            self._copy_logs(copier, job)
            if job.get("status") in END_STATES:
                return
            # The provider's jitter (+/- a fifth): many tasks do not poll Batch in step.
            interval = self.settings.poll_interval
            time.sleep(self.hook.add_jitter(interval, width=interval / 5))
        raise AirflowException(
            f"AWS Batch job {job_id} has not finished after {self.settings.max_polls} polls "
            f"{self.settings.poll_interval} s apart; the task's retry attaches to it again"
        )

    def start(self, spec: JobSpec, log: logging.Logger) -> JobResult | BatchJobKillingTrigger:
        """Submit (unless :meth:`attach` found the job); the result if it already ended,
        else the trigger to defer to."""
        self._spec = spec
        job_id = self.job_id or self.submit(spec, log)
        if self.result(job_id) is not None:
            return self._finished(job_id, log)
        return self.trigger(job_id)

    def trigger(self, job_id: str) -> BatchJobKillingTrigger:
        from embedfresh.operators.runners.aws_batch_trigger import BatchJobKillingTrigger

        return BatchJobKillingTrigger(
            job_id=job_id,
            aws_conn_id=self.settings.aws_conn_id,
            region_name=self.settings.region_name,
            waiter_delay=max(1, int(self.settings.poll_interval)),
            waiter_max_attempts=self.settings.max_polls,
        )

    def resume(self, event: dict[str, Any] | None, log: logging.Logger) -> JobResult:
        """Map the trigger's event: the job's own outcome, whatever the waiter said; the
        job's log is copied into the task log now (the triggerer has no task log)."""
        from airflow.providers.amazon.aws.utils import validate_execute_complete_event
        from airflow.sdk.exceptions import AirflowException

        event = validate_execute_complete_event(event)
        job_id = event.get("job_id")
        if not job_id:
            raise AirflowException(f"AWS Batch trigger event names no job: {event}")
        self.job_id = job_id
        if event.get("status") != "success":
            log.warning("AWS Batch trigger for job %s ended: %s", job_id, event.get("message"))
        [job] = self._describe([job_id]) or [{}]
        self._copy_logs(LogCopier(self.logs_hook, self.settings.log_group, log), job)
        return self._finished(job_id, log)

    def _copy_logs(self, copier: LogCopier, job: Mapping[str, Any]) -> None:
        """Copy what is new in the job's log streams; a multi-node job's are its nodes'.

        On AWS each node of a multi-node parallel job is a job of its own, ``<jobId>#<n>``,
        with its own attempts and log streams; the job's own record names none. Every
        node is described (one DescribeJobs call) and its lines copied as ``[node n]``.
        """
        copier.copy(log_streams(job))
        for node in self._nodes(job):
            index = (node.get("nodeDetails") or {}).get("nodeIndex")
            copier.copy(log_streams(node), label=f"node {index}")

    def _nodes(self, job: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A multi-node job's node records, by index, once it left the queue; else ``[]``."""
        num_nodes = (job.get("nodeProperties") or {}).get("numNodes")
        if not num_nodes or "nodeDetails" in job or job.get("status") in _QUEUED:
            return []
        return self._describe(f"{job['jobId']}#{i}" for i in range(int(num_nodes)))

    def _finished(self, job_id: str, log: logging.Logger) -> JobResult:
        from airflow.sdk.exceptions import AirflowException

        [job] = self._describe([job_id]) or [{}]
        self._persist_links(job_id, job)
        children = self._children(job)
        if children and self.settings.child_logs:
            copier = LogCopier(self.logs_hook, self.settings.log_group, log)
            for child in children:
                log.info("--- log of AWS Batch array child %s ---", child.get("jobId"))
                copier.copy(log_streams(child))
        result = self.result(job_id) if not children else array_result(job, children)
        if result is None:
            raise AirflowException(
                f"AWS Batch job {job_id} has not finished after waiting; the task's retry "
                "attaches to it again"
            )
        details = result.details
        log.info(
            "AWS Batch job %s (%s) %s with exit code %s after %s attempt(s); its output is "
            "in log stream %s: %s",
            job_id, details.get("job_name"), details.get("status"), result.exit_code,
            details.get("attempts"), details.get("log_stream"), result.tail,
        )  # fmt: skip
        cost = self.cost(job, children)
        log.info(
            "AWS Batch cost of job %s: %.1f s over %d attempt(s), %.6f instance-hours, "
            "estimated $%.6f (%s)",
            job_id, cost["seconds"], len(cost["attempts"]), cost["instance_hours"],
            cost["estimated_cost_usd"], cost["instance_type"],
        )  # fmt: skip
        return replace(result, cost=cost)

    def _children(self, job: Mapping[str, Any]) -> list[dict[str, Any]]:
        """An array job's children, in index order; ``[]`` for any other job."""
        size = (job.get("arrayProperties") or {}).get("size")
        if not size or "index" in (job.get("arrayProperties") or {}):
            return []
        return self._describe(f"{job['jobId']}:{i}" for i in range(int(size)))

    def cost(
        self, job: Mapping[str, Any], children: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The job's cost record from Batch's own ``startedAt``/``stoppedAt`` of every
        attempt (failed ones included) of the job or of each array child."""
        from embedfresh.core.cost import DEFAULT_INSTANCE

        backend = str((self._spec.settings if self._spec else {}).get("backend", "cpu"))
        instance = self.settings.instance_type or DEFAULT_INSTANCE.get(backend, "cpu")
        nodes = int((job.get("nodeProperties") or {}).get("numNodes") or self.settings.num_nodes)
        return batch_cost(job, children or [], instance_type=instance, nodes=nodes)

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
        """Terminate the job (``on_kill``): Batch stops every node, or every child of an array."""
        if self.job_id is not None:
            self.hook.terminate_job(self.job_id, reason="Airflow task killed (on_kill)")


class LogCopier:
    """Copies CloudWatch log streams into a logger, each line once, however often called.

    Each stream keeps its continuation token, so a poll reads only what is new; a stream
    Batch names before it exists is read when it does.
    """

    def __init__(self, hook: AwsLogsHook, group: str, log: logging.Logger) -> None:
        self.hook = hook
        self.group = group
        self.log = log
        self.tokens: dict[str, Any] = {}
        self.lines = 0

    def copy(self, streams: Iterable[str], label: str | None = None) -> None:
        """Log each new line of ``streams`` as ``[label] line`` (default: the stream's
        task id)."""
        from airflow.providers.amazon.aws.hooks.logs import AwsLogsHook

        for stream in streams:
            token = self.tokens.setdefault(stream, AwsLogsHook.ContinuationToken())
            prefix = label or stream.rsplit("/", 1)[-1]
            try:
                for event in self.hook.get_log_events(self.group, stream, continuation_token=token):
                    self.log.info("[%s] %s", prefix, event["message"])
                    self.lines += 1
            except self.hook.conn.exceptions.ResourceNotFoundException:
                continue  # not created yet: the container has not started


def log_streams(job: Mapping[str, Any]) -> list[str]:
    """Every attempt's log stream of a DescribeJobs record, oldest first, then the
    running attempt's (on the job's own container until it ends)."""
    streams: list[str] = []
    for attempt in job.get("attempts") or []:
        name = (attempt.get("container") or {}).get("logStreamName")
        if name and name not in streams:
            streams.append(name)
    current = (job.get("container") or {}).get("logStreamName")
    if current and current not in streams:
        streams.append(current)
    return streams


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


def _child_exit_code(child: Mapping[str, Any]) -> int:
    code = job_exit_code(child)
    return int(ExitCode.TRANSIENT) if code is None else code


def array_result(parent: Mapping[str, Any], children: list[dict[str, Any]]) -> JobResult | None:
    """Map an array job's end to one exit code; ``None`` while a child still runs.

    All children SUCCEEDED: 0. Otherwise the failed children decide, most final first:
    a bad input, a refused gate or an unhealthy device (2, 3, 4: a retry would fail the same
    way), else a crash's code, else 75 (Batch's retries ran out on transient faults):
    the task's retry submits only what is not committed. The tail names the failed
    children, their codes and reasons.
    """
    if parent.get("status") not in END_STATES:
        return None
    by_state: dict[str, int] = {}
    for child in children:
        by_state[child.get("status", "UNKNOWN")] = (
            by_state.get(child.get("status", "UNKNOWN"), 0) + 1
        )
    failed = [c for c in children if c.get("status") == "FAILED"]
    codes = [_child_exit_code(c) for c in failed]
    final = [
        c for c in codes if c in (ExitCode.BAD_INPUT, ExitCode.GATE_REFUSED, ExitCode.UNHEALTHY)
    ]
    crashes = [c for c in codes if c not in (ExitCode.OK, ExitCode.TRANSIENT)]
    if parent.get("status") == "SUCCEEDED" and not failed:
        code = int(ExitCode.OK)
    else:
        code = final[0] if final else crashes[0] if crashes else int(ExitCode.TRANSIENT)
    lines = [
        f"AWS Batch array job {parent.get('jobId')} {parent.get('status')}: "
        f"{len(children)} children, "
        + ", ".join(f"{n} {state}" for state, n in sorted(by_state.items()))
    ]
    for child, child_code in list(zip(failed, codes, strict=True))[:10]:
        reason = child.get("statusReason") or ""
        lines.append(f"child {child.get('jobId')} exited {child_code}: {reason}".rstrip(": "))
    if len(failed) > 10:
        lines.append(f"... and {len(failed) - 10} more failed children")
    details = {
        "aws_batch_job_id": parent.get("jobId"),
        "job_name": parent.get("jobName"),
        "status": parent.get("status"),
        "exit_code": code,
        "attempts": sum(len(c.get("attempts") or []) for c in children),
        "log_stream": None,
        "children": dict(sorted(by_state.items())),
    }
    return JobResult(exit_code=code, summary=None, tail="\n".join(lines), details=details)


def _iso(ms: int | None) -> str | None:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat() if ms else None


def batch_cost(
    job: Mapping[str, Any],
    children: list[dict[str, Any]],
    *,
    instance_type: str,
    nodes: int = 1,
) -> dict[str, Any]:
    """A cost record (:func:`embedfresh.core.cost.cost_record`) from Batch's own clock:
    every attempt of the job (or of each array child), failed ones included, from its
    ``startedAt`` to its ``stoppedAt``.

    An attempt Batch reports without both times (it never started a container) costs
    nothing and is listed with ``seconds: 0``.
    """
    from embedfresh.core.cost import cost_record

    attempts = []
    for record in children or [job]:
        index = (record.get("arrayProperties") or {}).get("index")
        for number, attempt in enumerate(record.get("attempts") or [], start=1):
            started, stopped = attempt.get("startedAt"), attempt.get("stoppedAt")
            seconds = max(0.0, (stopped - started) / 1000) if started and stopped else 0.0
            attempts.append(
                {
                    "job_id": record.get("jobId"),
                    "array_index": index,
                    "attempt": number,
                    "started_at": _iso(started),
                    "stopped_at": _iso(stopped),
                    "seconds": seconds,
                    "exit_code": (attempt.get("container") or {}).get("exitCode"),
                    "status_reason": attempt.get("statusReason"),
                }
            )
    return cost_record(
        attempts,
        instance_type=instance_type,
        nodes=nodes,
        runner="aws_batch",
        aws_batch_job_id=job.get("jobId"),
        job_name=job.get("jobName"),
        status=job.get("status"),
        children=len(children),
    )
