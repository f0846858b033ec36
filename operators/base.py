"""The base operator every embedfresh job operator derives from.

An operator is a job kind (which ``python -m embedfresh.jobs.<name>`` and its settings) times an
execution mode (which runner). The runner is built lazily, so ``__init__`` does no I/O
and DAG files parse fast; exit codes are mapped to Airflow reactions in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from embedfresh.core.exit_codes import ExitCode
from embedfresh.operators.constants import ExecutionMode
from embedfresh.operators.job_spec import JobSpec
from embedfresh.operators.runners import (
    AwsBatchRunner,
    BatchSettings,
    DeferrableRunner,
    JobResult,
    LocalRunner,
    Runner,
)

#: Exit codes that mean retrying cannot help: fail the task for good.
NO_RETRY_EXIT_CODES: dict[int, str] = {
    ExitCode.BAD_INPUT: "bad input or config",
    ExitCode.GATE_REFUSED: "quality gate refused the model",
    ExitCode.UNHEALTHY: "health check found a faulty device or link",
}


class EmbedfreshJobOperator(BaseOperator):
    """Runs one data-plane job (``python -m embedfresh.jobs.<job_name>``) and returns its summary.

    The job's JSON summary (its last stdout line) becomes the task's XCom
    ``return_value``. Exit codes map to Airflow as the job contract says: 0 success;
    2, 3, 4 fail without retry; 75 (transient) and anything else raise a retryable error.

    Subclasses set :attr:`job_name` and may add settings in :meth:`job_specific_settings`.

    :param artifact_root: root URL of the artifact store, ``file://`` or ``s3://`` (templated).
    :param model: model config name, ``tiny`` or ``minilm`` (templated).
    :param backend: accelerator backend, ``auto``, ``cpu`` or ``cuda`` (templated).
    :param run_id: the job's run id, stable across retries so a retry resumes (templated).
    :param job_settings: extra config fields of the job; they override the operator's
        own (templated).
    :param env: environment variables for the job (templated).
    :param execution_mode: where the job runs: ``local`` (a subprocess of the worker) or
        ``aws_batch`` (an AWS Batch job; needs ``batch``).
    :param nproc_per_node: processes per node (data parallel under torchrun); an int or a
        template rendering to one, e.g. ``"{{ params.nproc }}"`` (templated).
    :param batch: with ``aws_batch``, the :class:`~embedfresh.operators.runners.BatchSettings` fields:
        ``job_definition``, ``job_queue``, ``num_nodes``, ``share_identifier``,
        ``deferrable``, ... (templated).
    :raises AirflowFailException: exit code 2, 3 or 4 (no retry).
    :raises AirflowException: exit code 75 or any other failure (retried per policy).
    """

    job_name: ClassVar[str]

    template_fields: Sequence[str] = (
        "artifact_root",
        "model",
        "backend",
        "run_id",
        "job_settings",
        "env",
        "batch",
        "nproc_per_node",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "job_settings": "json",
        "env": "json",
        "batch": "json",
    }
    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        artifact_root: str,
        model: str = "tiny",
        backend: str = "cpu",
        run_id: str = "{{ run_id }}",
        job_settings: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        execution_mode: str = ExecutionMode.LOCAL,
        nproc_per_node: int | str = 1,
        batch: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.artifact_root = artifact_root
        self.model = model
        self.backend = backend
        self.run_id = run_id
        self.job_settings = job_settings or {}
        self.env = env or {}
        self.execution_mode = ExecutionMode(execution_mode)
        self.nproc_per_node = nproc_per_node
        self.batch = batch
        if self.execution_mode == ExecutionMode.AWS_BATCH and not batch:
            raise ValueError(
                "execution_mode='aws_batch' needs batch={'job_definition': ..., 'job_queue': ...}"
            )

    @cached_property
    def runner(self) -> Runner:
        """The runner for :attr:`execution_mode`, built on first use (after templating)."""
        if self.execution_mode == ExecutionMode.AWS_BATCH:
            return AwsBatchRunner(BatchSettings.from_mapping(self.batch or {}))
        return LocalRunner()

    def job_specific_settings(self) -> dict[str, Any]:
        """Settings this job kind adds to the common ones (override in subclasses)."""
        return {}

    def build_job_spec(self) -> JobSpec:
        settings = {
            "artifact_root": self.artifact_root,
            "model": self.model,
            "backend": self.backend,
            "run_id": self.run_id,
            **self.job_specific_settings(),
            **self.job_settings,
        }
        return JobSpec(
            job=self.job_name,
            settings=settings,
            env=self.env,
            nproc_per_node=self._nproc_per_node(),
        )

    def _nproc_per_node(self) -> int:
        try:
            return int(self.nproc_per_node)
        except (TypeError, ValueError):
            raise AirflowFailException(
                f"nproc_per_node must be a whole number of processes, got {self.nproc_per_node!r}"
            ) from None

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.build_job_spec()
        runner = self.runner
        if isinstance(runner, DeferrableRunner) and runner.deferrable:
            started = runner.start(spec, self.log)
            if not isinstance(started, JobResult):
                self.defer(
                    trigger=started, method_name="execute_complete", timeout=self.execution_timeout
                )
            return self.handle_result(spec, started)
        return self.handle_result(spec, runner.run(spec, self.log))

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume after the runner's trigger fired: map the job's outcome like :meth:`execute`."""
        runner = self.runner
        if not isinstance(runner, DeferrableRunner):
            raise AirflowException(f"{type(runner).__name__} cannot resume a deferred task")
        return self.handle_result(self.build_job_spec(), runner.resume(event, self.log))

    def handle_result(self, spec: JobSpec, result: JobResult) -> dict[str, Any]:
        """Map a job's exit code to Airflow's reaction: the one place that does it."""
        code = result.exit_code
        if code == ExitCode.OK:
            if result.summary is None:
                raise AirflowException(
                    f"{spec.module} exited 0 but printed no JSON summary as its last stdout line"
                )
            return result.summary
        reason = result.last_error_line or "no message on stderr"
        if code in NO_RETRY_EXIT_CODES:
            raise AirflowFailException(
                f"{spec.module} failed with exit code {code} "
                f"({NO_RETRY_EXIT_CODES[code]}), not retrying: {reason}"
            )
        if code == ExitCode.TRANSIENT:
            raise AirflowException(
                f"{spec.module} hit a transient infrastructure fault (exit code {code}); "
                f"a retry resumes run {spec.settings.get('run_id')}: {reason}"
            )
        raise AirflowException(f"{spec.module} crashed with exit code {code}: {reason}")

    def on_kill(self) -> None:
        # Only a runner that was built can have started anything.
        if "runner" in self.__dict__:
            self.runner.kill()
