"""The base operator every embedfresh job operator derives from.

An operator is a job kind (which ``python -m embedfresh.jobs.<name>`` and its settings) times an
execution mode (which runner, looked up by name in
:mod:`embedfresh.operators.runners.registry`). The runner is built lazily, so ``__init__``
does no I/O and DAG files parse fast; exit codes are mapped to Airflow reactions in one
place, and what a successful job returned is read from its result record
(:mod:`embedfresh.core.results`), the same way whatever runner ran it.

Settings are checked as early as they can be: what is not templated when the DAG file
is parsed (an unknown ``job_settings`` key, a runner setting that does not exist or does
not validate, a forgotten ``model``: a DAG import error), the rest when the task starts,
where a settings error fails the task for good (:class:`AirflowFailException`): no retry
fixes a typo.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from embedfresh.core.exit_codes import BadInputError, ExitCode
from embedfresh.core.layout import safe_id
from embedfresh.core.settings import default_artifact_root
from embedfresh.operators.constants import ExecutionMode
from embedfresh.operators.job_spec import JobSpec
from embedfresh.operators.links import JobExtraLinks
from embedfresh.operators.runners import (
    AttachingRunner,
    DeferrableRunner,
    JobResult,
    LinkingRunner,
    Runner,
    registered_runner,
)
from embedfresh.operators.store import artifact_store, connection_scope

if TYPE_CHECKING:
    from pydantic import BaseModel

    from embedfresh.core.results import ResultTicket
    from embedfresh.operators.lineage import JobLineage
    from embedfresh.operators.runners import RegisteredRunner

#: Exit codes that mean retrying cannot help: fail the task for good.
NO_RETRY_EXIT_CODES: dict[int, str] = {
    ExitCode.BAD_INPUT: "bad input or config",
    ExitCode.GATE_REFUSED: "quality gate refused the model",
    ExitCode.UNHEALTHY: "health check found a faulty device or link",
}


#: Each job's config model in :mod:`embedfresh.core.config`, by job name (the jobs'
#: ``main_for`` calls; a test keeps the two equal): what ``job_settings`` keys are
#: checked against, without importing the jobs.
JOB_CONFIGS: Mapping[str, str] = {
    "health": "HealthConfig",
    "compile": "CompileConfig",
    "train": "TrainConfig",
    "parity": "ParityConfig",
    "evaluate": "EvaluateConfig",
    "gate": "GateConfig",
    "embed": "EmbedConfig",
    "embed_verify": "EmbedConfig",
    "index_load": "IndexLoadConfig",
    "search_check": "SearchCheckConfig",
    "release": "ReleaseConfig",
    "rollback": "RollbackConfig",
    "garbage_collect": "GarbageCollectConfig",
    "corpus_sync": "CorpusSyncConfig",
    "corpus_diff": "CorpusDiffConfig",
    "index_attach": "IndexAttachConfig",
    "search": "SearchConfig",
    "export_st": "ExportConfig",
    "publish_model": "PublishModelConfig",
    "import_labels": "ImportLabelsConfig",
}

#: The AWS connection an operator uses when none is named (the Amazon provider's own).
DEFAULT_AWS_CONN_ID = "aws_default"

#: Operator arguments a runner also takes as a setting of its own (when its settings
#: model has it): the operator passes its value on.
OPERATOR_RUNNER_SETTINGS = ("aws_conn_id", "deferrable")


class SettingsError(AirflowFailException, ValueError):
    """A task's settings are wrong: a ``ValueError`` when the DAG file is parsed (an import
    error naming the task), and an :class:`AirflowFailException` (no retry) when it is
    raised as the task runs: a mapped task's arguments are only checked when it is
    unmapped, and rendered settings only once rendered. No retry fixes a typo."""


class _NotGiven:
    """The default of an argument whose absence differs from every value (``None`` too)."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()


def is_templated(value: Any) -> bool:
    """Whether ``value`` is (or holds) something only known when the task runs: a Jinja
    template, an XCom reference or any other object Airflow resolves then."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if value is None or isinstance(value, (bool, int, float)):
        return False
    if isinstance(value, Mapping):
        return any(is_templated(k) or is_templated(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(is_templated(v) for v in value)
    return True


def job_config(job: str, name: str | None = None) -> type[BaseModel] | None:
    """The config model of job ``job``: the class of :mod:`embedfresh.core.config` named
    ``name``, else :data:`JOB_CONFIGS`'s; ``None`` for a job not listed there."""
    name = name or JOB_CONFIGS.get(job)
    if name is None:
        return None
    import embedfresh.core.config

    return getattr(embedfresh.core.config, name)


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

    The task's extra links (:mod:`embedfresh.operators.links`) open the model's "Model
    quality" page and, on AWS Batch, the job, its queue, its definition and its
    CloudWatch log. With the OpenLineage provider installed, the task reports the
    datasets it read and wrote (:meth:`get_openlineage_facets_on_complete`).

    :param model: model name: a preset (``tiny``, ``minilm``) or a team's own published
        model (templated). Required: a forgotten one is an error, never the demo's.
    :param artifact_root: root URL of the artifact store, ``file://`` or ``s3://``
        (templated); default: the one the jobs and the DAGs' Params use,
        ``$EMBEDFRESH_ARTIFACT_ROOT`` (:func:`~embedfresh.core.settings.default_artifact_root`),
        read when the DAG file is parsed.
    :param backend: accelerator backend, ``auto``, ``cpu`` or ``cuda`` (templated).
    :param run_id: the job's run id, stable across retries so a retry resumes (templated).
    :param job_settings: extra config fields of the job; they override the operator's
        own (templated). Keys are checked against the job's config when the DAG file
        is parsed (a value when the job starts).
    :param env: environment variables for the job (templated).
    :param execution_mode: where the job runs, a registered runner's name
        (:func:`~embedfresh.operators.runners.register_runner`): built in, ``local`` (a
        subprocess of the worker) and ``aws_batch`` (an AWS Batch job; needs its
        settings). An unknown name fails when the DAG file is parsed.
    :param nproc_per_node: processes per node (data parallel under torchrun); an int or a
        template rendering to one, e.g. ``"{{ params.nproc }}"`` (templated).
    :param runner_settings: keyword arguments of the runner; for ``aws_batch`` the
        :class:`~embedfresh.operators.runners.BatchSettings` fields: ``job_definition``,
        ``job_queue``, ``num_nodes``, ``share_identifier``, ...; for ``local`` those of
        :class:`~embedfresh.operators.runners.LocalRunner` (templated). Checked when the
        DAG file is parsed (by name where a value is templated), and when the task starts.
    :param batch: another name for ``runner_settings``, the one the ``aws_batch``
        settings are documented under; give one or the other.
    :param check_inputs: the run's inputs to check in the store before the job starts
        (errors at the door, for a DAG's first task): ``{"corpus": name, "version": name}``,
        either or both (several corpora as ``"a,b"``); when given, ``model`` is checked too (a preset or a model with a
        production version). Empty: nothing checked (templated).
    :param aws_conn_id: Airflow connection for AWS (templated): the AWS Batch runner's
        credentials and region, and the store's when the operator itself reads an
        ``s3://`` store (result records, cost records, ``check_inputs``); ``None``:
        boto3's own. Default ``aws_default`` (a missing connection falls back to boto3's
        own, as the provider's hooks do). Also accepted inside ``batch=`` for
        compatibility; giving both, differently, is an error.
    :param deferrable: wait for a remote job in the triggerer, freeing the worker slot
        (runners that can: ``aws_batch``); default: Airflow's
        ``[operators] default_deferrable``. Also accepted inside ``batch=``, as
        ``aws_conn_id``.
    :raises TypeError: (when the DAG file is parsed) ``model`` not given.
    :raises ValueError: (when the DAG file is parsed) an empty or invalid ``model``, an
        unknown ``execution_mode``, an unknown ``job_settings`` key, runner settings that
        do not validate, ``aws_conn_id`` or ``deferrable`` given twice differently.
    :raises AirflowFailException: exit code 2, 3 or 4 (no retry), a missing input
        named by ``check_inputs`` (with what the store holds), settings that do not
        validate once rendered, or a template that does not render
        (:class:`FailFastTemplatesMixin`).
    :raises AirflowException: exit code 75 or any other failure, or an exit 0 without
        this execution's result record (retried per policy).
    """

    job_name: ClassVar[str]
    #: The job's config model in :mod:`embedfresh.core.config` (its class name), when
    #: :data:`JOB_CONFIGS` does not list :attr:`job_name`: ``job_settings`` keys are
    #: checked against it.
    job_config_name: ClassVar[str | None] = None

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
        "aws_conn_id",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "job_settings": "json",
        "env": "json",
        "runner_settings": "json",
        "check_inputs": "json",
    }
    ui_color = "#e8f4fd"
    operator_extra_links = JobExtraLinks()

    def __init__(
        self,
        *,
        model: str,
        artifact_root: str | None = None,
        backend: str = "cpu",
        run_id: str = "{{ run_id }}",
        job_settings: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        execution_mode: str = ExecutionMode.LOCAL,
        nproc_per_node: int | str = 1,
        runner_settings: dict[str, Any] | None = None,
        batch: dict[str, Any] | None = None,
        check_inputs: dict[str, str] | None = None,
        aws_conn_id: str | None = NOT_GIVEN,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if runner_settings and batch:
            raise SettingsError("give the runner's settings as runner_settings or batch, not both")
        self.artifact_root = default_artifact_root() if artifact_root is None else artifact_root
        self.model = model
        self.backend = backend
        self.run_id = run_id
        self.job_settings = job_settings or {}
        self.env = env or {}
        self.execution_mode = str(execution_mode)
        self.nproc_per_node = nproc_per_node
        self.runner_settings = runner_settings or batch or {}
        self.check_inputs = check_inputs or {}
        self._own_runner_settings(aws_conn_id, deferrable)
        # Checked here, at parse time and without I/O: a typo in a DAG file is an import
        # error, not a task that fails hours later.
        self._check_at_parse_time()

    def _own_runner_settings(self, aws_conn_id: str | None, deferrable: bool | None) -> None:
        """The operator's ``aws_conn_id`` and ``deferrable``: its arguments, else inside
        ``batch=``, else the defaults (``aws_default``; Airflow's ``default_deferrable``)."""
        #: Which of :data:`OPERATOR_RUNNER_SETTINGS` were given as operator arguments
        #: (``aws_conn_id=None`` is given: no connection, boto3's own credentials).
        given = {"aws_conn_id": aws_conn_id is not NOT_GIVEN, "deferrable": deferrable is not None}
        self.given_runner_settings = frozenset(name for name, yes in given.items() if yes)
        from_batch = self.runner_settings if isinstance(self.runner_settings, Mapping) else {}
        self.aws_conn_id = (
            aws_conn_id
            if "aws_conn_id" in self.given_runner_settings
            else from_batch.get("aws_conn_id", DEFAULT_AWS_CONN_ID)
        )
        if "deferrable" in self.given_runner_settings:
            self.deferrable = deferrable
        elif "deferrable" in from_batch:
            self.deferrable = from_batch["deferrable"]
        else:
            from airflow.sdk.configuration import conf

            self.deferrable = conf.getboolean("operators", "default_deferrable", fallback=False)

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:
        """Airflow's ``partial`` (a mapped task's fixed arguments), with ``model`` required
        here already: a mapped task's arguments are checked only when each task is
        unmapped, so a forgotten model would surface as a retried run-time error. (The
        rest of the checks run then as :class:`SettingsError`, without retry.)

        :raises TypeError: no ``model`` given, neither here nor in the DAG's or the
            task's ``default_args``.
        """
        if "model" not in kwargs and "model" not in (kwargs.get("default_args") or {}):
            dag = kwargs.get("dag")
            if dag is None:
                try:
                    from airflow.sdk.definitions._internal.contextmanager import DagContext
                except ImportError:  # another Airflow: leave it to the unmapped task
                    return super().partial(**kwargs)
                dag = DagContext.get_current()
            if "model" not in (getattr(dag, "default_args", None) or {}):
                raise TypeError(
                    f"{cls.__name__}.partial(task_id={kwargs.get('task_id')!r}): missing "
                    "keyword argument 'model' (a mapped job task's model is given to partial)"
                )
        return super().partial(**kwargs)

    def _check_model(self) -> None:
        """``model`` names a model: not empty, and a valid path segment unless templated."""
        if not self.model or not isinstance(self.model, str):
            raise SettingsError(
                f"task {self.task_id}: model must name a model (a preset such as 'minilm', "
                f"or a team's own), got {self.model!r}"
            )
        if not is_templated(self.model):
            try:
                safe_id(self.model, "model name")
            except BadInputError as e:
                raise SettingsError(f"task {self.task_id}: {e}") from None

    def _check_at_parse_time(self) -> None:
        """What can be checked before templates render, with no I/O: ``check_inputs``'
        keys, the model's name, the execution mode, ``job_settings``' keys, and the runner
        settings (by name only where a value is templated).

        :raises SettingsError: the first of those that is wrong.
        """
        unknown = set(self.check_inputs) - {"corpus", "version"}
        if unknown:
            raise SettingsError(f"check_inputs takes corpus and version, not {sorted(unknown)}")
        self._check_model()
        try:
            registered = registered_runner(self.execution_mode)
        except ValueError as e:
            raise SettingsError(f"task {self.task_id}: {e}") from None
        if registered.required_settings and not self.runner_settings:
            raise SettingsError(
                f"execution_mode={self.execution_mode!r} needs its runner settings, "
                f"e.g. {registered.required_settings}"
            )
        if isinstance(self.job_settings, Mapping):
            problem = self.job_settings_problem(self.job_settings)
            if problem:
                raise SettingsError(problem)
        if not isinstance(self.runner_settings, Mapping):
            return  # one template for the whole dict: checked when the task starts
        values = self.runner_values(registered, self.runner_settings)
        try:
            registered.check_settings(values, names_only=is_templated(values))
        except ValueError as e:
            raise SettingsError(f"task {self.task_id}: {e}") from None

    def job_settings_problem(self, settings: Mapping[str, Any]) -> str | None:
        """What is wrong with the names of ``settings`` for this job's config (unknown
        fields), or ``None``; also ``None`` for a job whose config is not known here."""
        config = job_config(self.job_name, self.job_config_name)
        if config is None:
            return None
        unknown = sorted(str(k) for k in settings if k not in config.model_fields)
        if not unknown:
            return None
        return (
            f"task {self.task_id}: unknown settings {unknown} for job {self.job_name!r} "
            f"({config.__name__}); known: {', '.join(sorted(config.model_fields))}"
        )

    def runner_values(
        self, registered: RegisteredRunner, settings: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``settings`` with the operator's own :data:`OPERATOR_RUNNER_SETTINGS` (its
        ``aws_conn_id``, ``deferrable``) for a runner whose settings take them.

        :raises ValueError: one given both as an operator argument and in the runner's
            settings, with different values.
        """
        values = dict(settings)
        for name in OPERATOR_RUNNER_SETTINGS:
            if not registered.accepts(name):
                continue
            mine = getattr(self, name)
            if name in self.given_runner_settings:
                if name in values and values[name] != mine:
                    raise SettingsError(
                        f"task {self.task_id}: {name} given twice, {mine!r} and "
                        f"{values[name]!r} in the runner's settings (batch=); give it once, "
                        f"as the operator's {name}"
                    )
                values[name] = mine
            elif name in values:
                setattr(self, name, values[name])  # the rendered value of batch={}'s own
            else:
                values[name] = mine
        return values

    def check_rendered_settings(self) -> None:
        """Check the rendered settings before anything starts (called by :meth:`execute`).

        :raises AirflowFailException: ``job_settings`` or ``runner_settings`` that are
            not a mapping, carry an unknown name or do not validate: a settings error,
            the same on every retry.
        """
        for name in ("job_settings", "runner_settings"):
            if not isinstance(getattr(self, name), Mapping):
                raise SettingsError(
                    f"task {self.task_id}: {name} must render to a mapping, got "
                    f"{type(getattr(self, name)).__name__}; a settings error, not retrying"
                )
        problem = self.job_settings_problem(self.job_settings)
        if problem:
            raise SettingsError(f"{problem}; a settings error, not retrying")
        registered = registered_runner(self.execution_mode)
        try:
            registered.check_settings(self.runner_values(registered, self.runner_settings))
        except ValueError as e:
            raise SettingsError(f"task {self.task_id}: {e}; a settings error, not retrying") from e

    @cached_property
    def runner(self) -> Runner:
        """The runner for :attr:`execution_mode`, built on first use (after templating),
        with the operator's ``aws_conn_id`` and ``deferrable`` where it takes them."""
        registered = registered_runner(self.execution_mode)
        try:
            return registered.build(self.runner_values(registered, self.runner_settings))
        except ValueError as e:  # settings the runner does not take: a typo, final
            raise SettingsError(f"task {self.task_id}: {e}; a settings error, not retrying") from e

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

        try:
            store = artifact_store(self.artifact_root, self.aws_conn_id)
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
        self.check_rendered_settings()
        self.verify_inputs()
        spec = self.build_job_spec(self.result_ticket(context))
        runner = self.runner
        if isinstance(runner, LinkingRunner):
            runner.link_to(context, self)
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
            return self.announce(context, self.handle_result(spec, started))
        return self.announce(context, self.handle_result(spec, runner.run(spec, self.log)))

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
        if isinstance(runner, LinkingRunner):
            runner.link_to(context, self)
        ticket = None
        if result is not None:
            from embedfresh.core.results import ResultTicket

            ticket = ResultTicket.from_dict(result)
        summary = self.handle_result(self.build_job_spec(ticket), runner.resume(event, self.log))
        return self.announce(context, summary)

    def announce(self, context: Any, summary: dict[str, Any]) -> dict[str, Any]:
        """Once the job has succeeded (in the worker or after a deferral): add this task's
        Asset events for the job's ``summary`` (an operator that announces one overrides
        it); returns the summary, the task's XCom."""
        return summary

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

        if spec.result is None:
            return  # no execution identity to file it under (a spec built outside a task)
        record = {"task": spec.result.name, "attempt_id": spec.result.attempt_id, **cost}
        try:
            store = artifact_store(self.artifact_root, self.aws_conn_id)
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
        it, for ``s3://``, with :attr:`aws_conn_id`'s credentials).

        :raises AirflowException: no record, a record another execution left, one that
            cannot be read, or a summary that is not a JSON object; all retryable, and
            the message names the record's URL.
        """
        from embedfresh.core.exit_codes import TransientError
        from embedfresh.core.results import ResultError, read_result

        if spec.result is None:
            raise AirflowException(
                f"{spec.module} exited 0 but was started without a result name and attempt "
                "id, so its result record cannot be told from another execution's"
            )
        root = str(spec.settings.get("artifact_root") or self.artifact_root)
        try:
            with connection_scope(root, self.aws_conn_id):
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
        self._lineage = self.lineage(spec, record.summary)
        return record.summary

    def lineage(self, spec: JobSpec, summary: Mapping[str, Any] | None = None) -> JobLineage:
        """The datasets the execution ``spec`` describes read and wrote
        (:func:`embedfresh.operators.lineage.job_datasets`), its config's defaults filled
        in for what the spec leaves out; ``summary``: what the job returned."""
        from embedfresh.operators.lineage import job_datasets

        config = job_config(spec.job, self.job_config_name)
        defaults = {}
        if config is not None:
            defaults = {
                name: field.default
                for name, field in config.model_fields.items()
                if not field.is_required() and field.default_factory is None
                and field.default is not None and name != "artifact_root"
            }  # fmt: skip
        return job_datasets(spec.job, {**defaults, **spec.settings}, summary)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage's input and output datasets of the job this task ran (store URLs,
        index tables), for the OpenLineage provider's listener; ``None`` without the
        provider, or when the job did not finish."""
        from embedfresh.operators.lineage import operator_lineage

        found = getattr(self, "_lineage", None)
        return operator_lineage(found) if found is not None else None

    def on_kill(self) -> None:
        # Only a runner that was built can have started anything.
        if "runner" in self.__dict__:
            self.runner.kill()
