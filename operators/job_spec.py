"""What a runner needs to start one data-plane job: program, settings, env, resources."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embedfresh.core.results import ResultTicket


def encode_setting(value: Any) -> str:
    """The ``value`` half of ``--set key=value``, as :func:`embedfresh.core.config.parse_override` reads it.

    The job parses the value as JSON when it parses, else takes it as a string. A plain
    string that would not parse as JSON stays raw (readable in the task log); anything
    else, including strings such as ``"123"`` or ``"true"``, is JSON-encoded so it comes
    back with its type.
    """
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return value
    return json.dumps(value, sort_keys=True)


#: AWS Batch's largest array job: children per ``SubmitJob``.
MAX_ARRAY_SIZE = 10_000


@dataclass(frozen=True)
class JobSpec:
    """One run of ``python -m embedfresh.jobs.<job> --set key=value ...``.

    :param job: the job's module under ``jobs`` (``train``, ``evaluate``, ``gate``, ...).
    :param settings: config fields of the job, passed as ``--set`` overrides.
    :param env: environment variables added to the runner's own.
    :param nproc_per_node: processes per node; above 1 the job starts under torchrun.
    :param result: the name and attempt id of the result record this execution writes
        (``--result-name``, ``--attempt-id``); ``None``: the job's defaults.
    :param array_size: copies of the job started at once as one AWS Batch array job, each
        told its index in ``AWS_BATCH_JOB_ARRAY_INDEX`` (2 to 10,000, Batch's limits); 1: a
        plain job. Only runners that can start arrays accept more than 1.
    """

    job: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    nproc_per_node: int = 1
    result: ResultTicket | None = None
    array_size: int = 1

    def __post_init__(self) -> None:
        if not self.job or not self.job.replace("_", "").isalnum():
            raise ValueError(f"job must be a module name under embedfresh.jobs, got {self.job!r}")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be >= 1, got {self.nproc_per_node}")
        if not (self.array_size == 1 or 2 <= self.array_size <= MAX_ARRAY_SIZE):
            raise ValueError(
                f"array_size must be 1 (a plain job) or 2 to {MAX_ARRAY_SIZE} (an AWS Batch "
                f"array job), got {self.array_size}"
            )

    @property
    def module(self) -> str:
        return f"embedfresh.jobs.{self.job}"

    def job_args(self) -> list[str]:
        """``--set key=value`` for every setting, in the order given, then the result
        record's ``--result-name NAME --attempt-id ID`` when :attr:`result` is set."""
        args: list[str] = []
        for key, value in self.settings.items():
            args += ["--set", f"{key}={encode_setting(value)}"]
        if self.result is not None:
            args += self.result.job_args()
        return args

    def argv(self, python: str) -> list[str]:
        """The command line: ``python -m embedfresh.jobs.X ...``, or under torchrun for data parallel.

        Data parallel on one node goes through :mod:`embedfresh.jobs.launch` (torchrun's arguments,
        the failing worker's exit code) with ``--standalone``: a free rendezvous port, so
        two tasks on one worker do not collide.
        """
        if self.nproc_per_node > 1:
            launcher = [
                python,
                "-m",
                "embedfresh.jobs.launch",
                "--standalone",
                "--nproc-per-node",
                str(self.nproc_per_node),
                "-m",
                self.module,
            ]
        else:
            launcher = [python, "-m", self.module]
        return launcher + self.job_args()
