"""The contract between an operator and the runner that executes its job spec."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from embedfresh.operators.job_spec import JobSpec


@dataclass(frozen=True)
class JobResult:
    """How one job run ended.

    What the job returned is not here: the operator reads it from the job's result record
    (:mod:`embedfresh.core.results`), which every runner's jobs write to the same store.

    :param exit_code: the job's exit status (negative: killed by that signal number).
    :param summary: the JSON object the job printed as its last stdout line, if the runner
        saw its stdout (the local runner does; a remote one does not). For the log only.
    :param tail: the last lines of the job's stderr, where errors are reported.
    :param details: where and how the job ran, in the runner's terms (the AWS Batch job
        id, its attempts and log stream, ...), written to the task log.
    :param cost: the job's cost record from the runner's own clock (AWS Batch: every
        attempt's ``startedAt``/``stoppedAt``), which the operator writes to the run's
        reports; ``None``: the runner keeps none.
    """

    exit_code: int
    summary: dict[str, Any] | None
    tail: str
    details: Mapping[str, Any] = field(default_factory=dict)
    cost: Mapping[str, Any] | None = None

    @property
    def last_error_line(self) -> str:
        """The last non-empty stderr line: the job's one-line error message on exit 2/3/4."""
        for line in reversed(self.tail.splitlines()):
            if line.strip():
                return line.strip()
        return ""


class Runner(Protocol):
    """Runs a job spec to completion somewhere, streaming its output into ``log``.

    A runner runs ``spec``'s command line (:meth:`JobSpec.argv`, with the result-record
    options) and reports how it ended; the job itself writes its result record. Register
    a new one under an ``execution_mode`` name with
    :func:`~embedfresh.operators.runners.registry.register_runner`.
    """

    def run(self, spec: JobSpec, log: logging.Logger) -> JobResult: ...

    def kill(self) -> None:
        """Stop the job started by :meth:`run` (called from ``on_kill``); idempotent."""
        ...


@runtime_checkable
class DeferrableRunner(Runner, Protocol):
    """A runner that can wait in the triggerer instead of the worker when :attr:`deferrable`."""

    deferrable: bool

    def start(self, spec: JobSpec, log: logging.Logger) -> JobResult | Any:
        """Start the job; its result if it already ended, else the trigger to defer to."""
        ...

    def resume(self, event: dict[str, Any] | None, log: logging.Logger) -> JobResult:
        """The result of the job the trigger's ``event`` reports on (validated first)."""
        ...


@runtime_checkable
class AttachingRunner(Runner, Protocol):
    """A runner whose job outlives the worker: a retry can wait on the job a lost try started."""

    def attach(self, spec: JobSpec, log: logging.Logger, state: Any = None) -> JobSpec:
        """Find the task instance's job still running (``state``: Airflow's
        ``context["task_state_store"]``); the spec to go on with, that job's if found."""
        ...


@runtime_checkable
class LinkingRunner(Runner, Protocol):
    """A runner whose job has pages elsewhere (a cloud console, its logs): it stores what
    the operator's extra links need as it learns it (the job's id, its queue, its log
    stream), in the task's XCom, the way the Amazon provider's own operators do."""

    def link_to(self, context: Any, operator: Any) -> None:
        """Persist links for the job this runner starts, attaches to or resumes from now
        on, through ``context["ti"]`` (``operator``: the task the links belong to)."""
        ...
