"""The base operator every embedfresh job operator derives from.

An operator is a job kind (which ``python -m embedfresh.jobs.<name>`` and its settings) times an
execution mode (which runner, looked up by name in
:mod:`embedfresh.operators.runners.registry`). The runner is built lazily, so ``__init__``
does no I/O and DAG files parse fast; exit codes are mapped to Airflow reactions in one
place, and what a successful job returned is read from its result record
(:mod:`embedfresh.core.results`), the same way whatever runner ran it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from embedfresh.core.exit_codes import ExitCode
from embedfresh.operators.constants import ExecutionMode
from embedfresh.operators.job_spec import JobSpec
from embedfresh.operators.runners import (
    AttachingRunner,
    DeferrableRunner,
    JobResult,
    Runner,
    registered_runner,
)

if TYPE_CHECKING:
    from embedfresh.core.results import ResultTicket

#: Exit codes that mean retrying cannot help: fail the task for good.
NO_RETRY_EXIT_CODES: dict[int, str] = {
    ExitCode.BAD_INPUT: "bad input or config",
    ExitCode.GATE_REFUSED: "quality gate refused the model",
    ExitCode.UNHEALTHY: "health check found a faulty device or link",
}


class FailFastTemplatesMixin:
    """Template errors fail the task for good: a Jinja ``UndefinedError`` (a manual run's
    missing ``data_interval_start``), a syntax error or a filter given the wrong type is
    the same on every retry, so it raises :class:`AirflowFailException` naming the task,
    the field and the template, instead of spending the task's retries.

    Hooks ``_do_render_template_fields``: the one method both an operator's own
    ``render_template_fields`` and a mapped task's (which renders through the unmapped
    operator's) call. Anything else raised while rendering (an XCom pull that lost the
    API server) stays retryable.
    """

    #: Errors of rendering that no retry can cure.
    TEMPLATE_ERRORS: ClassVar[tuple[type[BaseException], ...]] = (TypeError, ValueError)

    def _do_render_template_fields(
        self,
        parent: Any,
        template_fields: Iterable[str],
        context: Any,
        jinja_env: Any,
        seen_oids: set[int],
    ) -> None:
        import jinja2

        try:
            super()._do_render_template_fields(  # type: ignore[misc]
                parent, template_fields, context, jinja_env, seen_oids
            )
        except AirflowFailException:
            raise
        except (jinja2.TemplateError, *self.TEMPLATE_ERRORS) as e:
            task = getattr(self, "task_id", type(self).__name__)
            raise AirflowFailException(
                f"task {task}: a template of {sorted(template_fields)} does not render "
                f"({type(e).__name__}: {e}); a template or Param error, not retrying"
            ) from e


class EmbedfreshJobOperator(FailFastTemplatesMixin, BaseOperator):
    """Runs one data-plane job (``python -m embedfresh.jobs.<job_name>``) and returns its summary.

    The job is told a result name unique to this task instance and a fresh attempt id
    (``--result-name``, ``--attempt-id``); on success it writes its result record
    ``runs/<model>/<run_id>/results/<name>.json`` to the artifact store. The operator
    reads that record back and returns its summary (what the job also prints) as the
    task's XCom ``return_value``: the same value under every runner. Exit codes map to
    Airflow as the job contract says: 0 success; 2, 3, 4 fail without retry; 75
    (transient) and anything else raise a retryable error, as does an exit 0 without
    this execution's record.

    Subclasses set :attr:`job_name` and may add settings in :meth:`job_specific_settings`.

    :param artifact_root: root URL of the artifact store, ``file://`` or ``s3://`` (templated).
    :param model: model name: a preset (``tiny``, ``minilm``) or a team's own published
        model (templated).
    :param backend: accelerator backend, ``auto``, ``cpu`` or ``cuda`` (templated).
    :param run_id: the job's run id, stable across retries so a retry resumes (templated).
    :param job_settings: extra config fields of the job; they override the operator's
        own (templated).
    :param env: environment variables for the job (templated).
    :param execution_mode: where the job runs, a registered runner's name
        (:func:`~embedfresh.operators.runners.register_runner`): built in, ``local`` (a
        subprocess of the worker) and ``aws_batch`` (an AWS Batch job; needs its
        settings). An unknown name fails when the DAG file is parsed.
    :param nproc_per_node: processes per node (data parallel under torchrun); an int or a
        template rendering to one, e.g. ``"{{ params.nproc }}"`` (templated).
    :param runner_settings: keyword arguments of the runner; for ``aws_batch`` the
        :class:`~embedfresh.operators.runners.BatchSettings` fields: ``job_definition``,
        ``job_queue``, ``num_nodes``, ``share_identifier``, ``deferrable``, ...; for
        ``local`` those of :class:`~embedfresh.operators.runners.LocalRunner` (templated).
    :param batch: another name for ``runner_settings``, the one the ``aws_batch``
        settings are documented under; give one or the other.
    :param check_inputs: the run's inputs to check in the store before the job starts
        (errors at the door, for a DAG's first task): ``{"corpus": name, "version": name}``,
        either or both (several corpora as ``"a,b"``); when given, ``model`` is checked too (a preset or a model with a
        production version). Empty: nothing checked (templated).
    :raises AirflowFailException: exit code 2, 3 or 4 (no retry), a missing input
        named by ``check_inputs`` (with what the store holds), or a template that does
        not render (:class:`FailFastTemplatesMixin`).
    :raises AirflowException: exit code 75 or any other failure, or an exit 0 without
        this execution's result record (retried per policy).
    """

    job_name: ClassVar[str]

    template_fields: Sequence[str] = (
        "artifact_root",
        "model",
        "backend",
        "run_id",
        "job_settings",
        "env",
        "runner_settings",
        "nproc_per_node",
        "check_inputs",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "job_settings": "json",
        "env": "json",
        "runner_settings": "json",
        "check_inputs": "json",
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
        runner_settings: dict[str, Any] | None = None,
        batch: dict[str, Any] | None = None,
        check_inputs: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.artifact_root = artifact_root
        self.model = model
        self.backend = backend
        self.run_id = run_id
        self.job_settings = job_settings or {}
        self.env = env or {}
        self.nproc_per_node = nproc_per_node
        if runner_settings and batch:
            raise ValueError("give the runner's settings as runner_settings or batch, not both")
        self.runner_settings = runner_settings or batch or {}
        self.check_inputs = check_inputs or {}
        unknown = set(self.check_inputs) - {"corpus", "version"}
        if unknown:
            raise ValueError(f"check_inputs takes corpus and version, not {sorted(unknown)}")
        # Checked here, at parse time: a typo in a DAG file is an import error, not a
        # task that fails hours later.
        registered = registered_runner(execution_mode)
        self.execution_mode = str(execution_mode)
        if registered.required_settings and not self.runner_settings:
            raise ValueError(
                f"execution_mode={self.execution_mode!r} needs its runner settings, "
                f"e.g. {registered.required_settings}"
            )

    @cached_property
    def runner(self) -> Runner:
        """The runner for :attr:`execution_mode`, built on first use (after templating)."""
        return registered_runner(self.execution_mode).build(self.runner_settings)

    def job_specific_settings(self) -> dict[str, Any]:
        """Settings this job kind adds to the common ones (override in subclasses)."""
        return {}

    def use_run_context(self, context: Any) -> None:
        """Read what :meth:`job_specific_settings` needs from the running task's context
        (the run's data interval, ...), before the job spec is built: called first by
        :meth:`execute` and :meth:`execute_complete`. Nothing by default."""

    def build_job_spec(self, result: ResultTicket | None = None) -> JobSpec:
        """The job's command: settings, environment, processes, and the result ticket."""
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
            result=result,
        )

    def result_ticket(self, context: Any) -> ResultTicket:
        """This execution's result name (one per task instance) and a fresh attempt id."""
        from embedfresh.core.results import ResultTicket, new_attempt_id, result_name

        ti = context.get("ti") if hasattr(context, "get") else None
        if ti is not None:
            name = result_name(ti.task_id, dag_id=ti.dag_id, map_index=ti.map_index)
        else:  # called outside a task run (tests, a person in a shell)
            name = result_name(self.task_id)
        return ResultTicket(name=name, attempt_id=new_attempt_id())

    def _nproc_per_node(self) -> int:
        try:
            return int(self.nproc_per_node)
        except (TypeError, ValueError):
            raise AirflowFailException(
                f"nproc_per_node must be a whole number of processes, got {self.nproc_per_node!r}"
            ) from None

    def verify_inputs(self) -> None:
        """Check :attr:`check_inputs` (and the model) in the store; nothing when empty.

        :raises AirflowFailException: one is missing (no retry: it will not appear by
            itself), naming it and what the store holds.
        """
        if not self.check_inputs:
            return
        from embedfresh.core import inputs
        from embedfresh.core.exit_codes import BadInputError
        from embedfresh.core.storage import ArtifactStore

        try:
            store = ArtifactStore(self.artifact_root)
            inputs.check_model(store, self.model)
            if self.check_inputs.get("version"):
                inputs.check_version(store, self.model, self.check_inputs["version"])
            for corpus in str(self.check_inputs.get("corpus") or "").split(","):
                if corpus.strip():  # one corpus, or several as "a,b"
                    inputs.check_corpus(store, corpus.strip())
        except BadInputError as e:
            raise AirflowFailException(str(e)) from e
        self.log.info(
            "inputs present in %s: model %s, %s", store.url(), self.model, self.check_inputs
        )

    def execute(self, context: Any) -> dict[str, Any]:
        self.use_run_context(context)
        self.verify_inputs()
        spec = self.build_job_spec(self.result_ticket(context))
        runner = self.runner
        if isinstance(runner, AttachingRunner):
            # A retry after a lost worker waits on the job that try started.
            spec = runner.attach(spec, self.log, context.get("task_state_store"))
        if isinstance(runner, DeferrableRunner) and runner.deferrable:
            started = runner.start(spec, self.log)
            if not isinstance(started, JobResult):
                # The ticket travels with the deferral: the resumed task must read the
                # record of the job it started, not mint a new attempt id.
                ticket = spec.result.to_dict() if spec.result is not None else None
                self.defer(
                    trigger=started,
                    method_name="execute_complete",
                    kwargs={"result": ticket},
                    timeout=self.execution_timeout,
                )
            return self.handle_result(spec, started)
        return self.handle_result(spec, runner.run(spec, self.log))

    def execute_complete(
        self,
        context: Any,
        event: dict[str, Any] | None = None,
        result: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Resume after the runner's trigger fired: map the job's outcome like :meth:`execute`.

        :param event: the trigger's event.
        :param result: the result ticket :meth:`execute` deferred with.
        """
        self.use_run_context(context)
        runner = self.runner
        if not isinstance(runner, DeferrableRunner):
            raise AirflowException(f"{type(runner).__name__} cannot resume a deferred task")
        ticket = None
        if result is not None:
            from embedfresh.core.results import ResultTicket

            ticket = ResultTicket.from_dict(result)
        return self.handle_result(self.build_job_spec(ticket), runner.resume(event, self.log))

    def handle_result(self, spec: JobSpec, result: JobResult) -> dict[str, Any]:
        """Map a job's exit code to Airflow's reaction: the one place that does it.

        On exit 0, the XCom is the summary in the job's result record (:meth:`read_result`).
        """
        code = result.exit_code
        if result.details:
            self.log.info("%s ran as %s", spec.module, dict(result.details))
        if result.cost is not None:
            self.write_cost_record(spec, result.cost)
        if code == ExitCode.OK:
            return self.read_result(spec)
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

    def write_cost_record(self, spec: JobSpec, cost: Mapping[str, Any]) -> None:
        """Keep the runner's cost record of this execution in the run's reports
        (``reports/cost/<result name>/<attempt id>.json``), whether the job succeeded or
        not: every try that ran costs, failed ones too.

        A report, not the job's outcome: a store that refuses it is logged, and the task
        goes on to the job's own result.
        """
        from embedfresh.core import layout
        from embedfresh.core.storage import ArtifactStore

        if spec.result is None:
            return  # no execution identity to file it under (a spec built outside a task)
        record = {"task": spec.result.name, "attempt_id": spec.result.attempt_id, **cost}
        try:
            store = ArtifactStore(self.artifact_root)
            rel = layout.cost(
                str(self.model), str(self.run_id), spec.result.name, spec.result.attempt_id
            )
            store.write_json(rel, record)
        except Exception as e:
            self.log.warning("Could not write the cost record of %s: %s", spec.module, e)
            return
        self.log.info(
            "Cost of %s: %.1f s over %d attempt(s), estimated $%.6f as %s: %s",
            spec.module, record.get("seconds", 0), len(record.get("attempts") or []),
            record.get("estimated_cost_usd", 0), record.get("instance_type"), store.url(rel),
        )  # fmt: skip

    def read_result(self, spec: JobSpec) -> dict[str, Any]:
        """The summary in the result record of the execution ``spec`` describes.

        Read through :mod:`embedfresh.core.results` (the artifact store; boto3 only inside
        it, for ``s3://``).

        :raises AirflowException: no record, a record another execution left, one that
            cannot be read, or a summary that is not a JSON object; all retryable, and
            the message names the record's URL.
        """
        from embedfresh.core.exit_codes import BadInputError, TransientError
        from embedfresh.core.results import ResultError, read_result

        if spec.result is None:
            raise AirflowException(
                f"{spec.module} exited 0 but was started without a result name and attempt "
                "id, so its result record cannot be told from another execution's"
            )
        try:
            record, url = read_result(spec.settings, spec.result, spec.job)
        except ResultError as e:
            raise AirflowException(str(e)) from e
        except (TransientError, BadInputError) as e:
            raise AirflowException(
                f"{spec.module} exited 0 but its result record {spec.result.name!r} could "
                f"not be read: {e}"
            ) from e
        if not isinstance(record.summary, dict):
            raise AirflowException(
                f"result record {url} holds a {type(record.summary).__name__} summary, "
                "not the JSON object an operator returns"
            )
        self.log.info(
            "Result record %s: %s attempt %s finished at %s on %s",
            url, record.job, record.attempt_id, record.finished_at.isoformat(),
            record.execution,
        )  # fmt: skip
        return record.summary

    def on_kill(self) -> None:
        # Only a runner that was built can have started anything.
        if "runner" in self.__dict__:
            self.runner.kill()
