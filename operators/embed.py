"""Batch embedding of a corpus with one model version, fanned out over corpus shards.

Two fan-outs, one verify step:

- **mapped tasks** (the local runner, small corpora): ``ResolveModelVersionOperator``
  (which version) -> ``CorpusShardsOperator`` (``{"corpus", "shards"}`` dicts for dynamic
  task mapping) -> ``ShardEmbeddingOperator.partial(...).expand_kwargs(...)``;
- **one AWS Batch array job** (large corpora): ``ResolveModelVersionOperator`` ->
  ``BatchArrayEmbeddingOperator(execution_mode="aws_batch", ...)``, one task that plans
  the pending shards and submits one array job whose children embed a slice each;

then ``EmbeddingVerifyOperator`` (counts against the corpus, manifest) for both.
The listing operators run in the worker itself and stay light: no torch, only the
artifact store. docs/SCALING.md says when to choose which.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from warnings import warn

from airflow.sdk import AssetAlias, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from embedfresh.core.settings import default_artifact_root
from embedfresh.operators.assets import (
    EMBEDDING_SETS_ALIAS,
    embedding_set_asset,
)
from embedfresh.operators.base import (
    DEFAULT_AWS_CONN_ID,
    EmbedfreshJobOperator,
    FailFastTemplatesMixin,
)
from embedfresh.operators.job_spec import JobSpec
from embedfresh.operators.registry import production_version
from embedfresh.operators.runners import AttachingRunner, JobResult
from embedfresh.operators.store import artifact_store, connection_scope

if TYPE_CHECKING:
    from embedfresh.core.embed_plan import EmbedPlan
    from embedfresh.core.results import ResultTicket


class ResolveModelVersionOperator(FailFastTemplatesMixin, BaseOperator):
    """Returns ``version`` if given, else the registry's production version of ``model``;
    as a DAG's first task it checks them (and ``corpus``, if given) in the store, so a
    name that does not exist fails at once, naming what does.

    :param model: model name (templated; required).
    :param artifact_root: root URL of the artifact store; default
        ``$EMBEDFRESH_ARTIFACT_ROOT``, as the jobs (templated).
    :param version: explicit model version; empty means production (templated).
    :param corpus: a corpus the run will read, checked too; empty: none (templated).
    :param aws_conn_id: Airflow connection opening an ``s3://`` store (templated).
    :raises AirflowFailException: no such version or corpus, or no production version.
    """

    template_fields: Sequence[str] = ("artifact_root", "model", "version", "corpus", "aws_conn_id")
    ui_color = "#f0f0f0"

    def __init__(
        self,
        *,
        model: str,
        artifact_root: str | None = None,
        version: str = "",
        corpus: str = "",
        aws_conn_id: str | None = DEFAULT_AWS_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.artifact_root = default_artifact_root() if artifact_root is None else artifact_root
        self.model = model
        self.version = version
        self.corpus = corpus
        self.aws_conn_id = aws_conn_id

    def execute(self, context: Any) -> str:
        from embedfresh.core import inputs
        from embedfresh.core.exit_codes import BadInputError

        with connection_scope(self.artifact_root, self.aws_conn_id):
            version = self.version or production_version(self.artifact_root, self.model)
        self.log.info("version of %s: %s", self.model, version)
        store = artifact_store(self.artifact_root, self.aws_conn_id)
        try:
            inputs.check_version(store, self.model, version)
            if self.corpus:
                inputs.check_corpus(store, self.corpus)
        except BadInputError as e:
            raise AirflowFailException(str(e)) from e
        return version


class CorporaOperator(FailFastTemplatesMixin, BaseOperator):
    """Returns the corpora a run embeds, each checked in the store: what the tasks mapped
    once per corpus expand over (``.expand(corpus=corpora.output)``).

    :param artifact_root: root URL of the artifact store; default
        ``$EMBEDFRESH_ARTIFACT_ROOT`` (templated).
    :param corpora: a list, or its JSON (``"{{ params.corpora | tojson }}"``) (templated).
    :param aws_conn_id: Airflow connection opening an ``s3://`` store (templated).
    :raises AirflowFailException: none named, or one without shards (naming those there are).
    """

    template_fields: Sequence[str] = ("artifact_root", "corpora", "aws_conn_id")
    ui_color = "#f0f0f0"

    def __init__(
        self,
        *,
        corpora: Sequence[str] | str,
        artifact_root: str | None = None,
        aws_conn_id: str | None = DEFAULT_AWS_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.artifact_root = default_artifact_root() if artifact_root is None else artifact_root
        self.corpora = corpora
        self.aws_conn_id = aws_conn_id

    def execute(self, context: Any) -> list[str]:
        from embedfresh.core import inputs
        from embedfresh.core.exit_codes import BadInputError

        names = corpora_list(self.corpora)
        if not names:
            raise AirflowFailException("no corpus named: corpora is empty")
        try:
            store = artifact_store(self.artifact_root, self.aws_conn_id)
            for name in names:
                inputs.check_corpus(store, name)
        except BadInputError as e:
            raise AirflowFailException(str(e)) from e
        return names


class CorpusShardsOperator(FailFastTemplatesMixin, BaseOperator):
    """Lists the shards of one corpus or several, in chunks: the keyword arguments of a
    mapped embed task (``.expand_kwargs(list_shards.output)``).

    Returns e.g. ``[{"corpus": "products", "shards": [0]}, {"corpus": "products",
    "shards": [1]}]`` (``shards_per_task=1``); with two shards a task, ``[0, 1]``.

    :param artifact_root: root URL of the artifact store; default
        ``$EMBEDFRESH_ARTIFACT_ROOT`` (templated).
    :param corpus: one corpus, ``corpora/<corpus>/part-NNNNN.parquet`` (templated).
    :param corpora: several, instead of ``corpus``: a list, its JSON (a templated Param:
        ``"{{ params.corpora | tojson }}"``), or a :class:`CorporaOperator`'s output
        (templated). One of the two is required.
    :param shards_per_task: shards one mapped embed task takes (templated).
    :param aws_conn_id: Airflow connection opening an ``s3://`` store (templated).
    :raises AirflowFailException: a corpus has no shard, or none is named.
    """

    template_fields: Sequence[str] = (
        "artifact_root", "corpus", "corpora", "shards_per_task", "aws_conn_id",
    )  # fmt: skip
    ui_color = "#f0f0f0"

    def __init__(
        self,
        *,
        artifact_root: str | None = None,
        corpus: str | None = None,
        corpora: Sequence[str] | str | None = None,
        shards_per_task: int | str = 1,
        aws_conn_id: str | None = DEFAULT_AWS_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (corpus is None) == (corpora is None):
            raise ValueError(
                f"task {self.task_id}: name the corpus to list, corpus=<name> or corpora=[...] "
                "(one of the two)"
            )
        self.artifact_root = default_artifact_root() if artifact_root is None else artifact_root
        self.corpus = corpus
        self.corpora = corpora
        self.shards_per_task = shards_per_task
        self.aws_conn_id = aws_conn_id

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from embedfresh.core.exit_codes import BadInputError
        from embedfresh.core.shards import corpus_shards

        k = int(self.shards_per_task)
        if k < 1:
            raise AirflowFailException(f"shards_per_task must be >= 1, got {k}")
        names = [self.corpus] if self.corpora is None else corpora_list(self.corpora)
        if not names:
            raise AirflowFailException("no corpus to embed: corpora is empty")
        store = artifact_store(self.artifact_root, self.aws_conn_id)
        chunks = []
        for name in names:
            try:
                indices = list(corpus_shards(store, name))
            except BadInputError as e:
                raise AirflowFailException(str(e)) from e
            chunks += [
                {"corpus": name, "shards": indices[i : i + k]} for i in range(0, len(indices), k)
            ]
            self.log.info("corpus %s: %d shards", name, len(indices))
        self.log.info("%d embed task(s) over %d corpus(es)", len(chunks), len(names))
        return chunks


def corpora_list(value: Sequence[str] | str) -> list[str]:
    """Corpora from a list, its JSON (a rendered Param) or a comma-separated string."""
    if isinstance(value, str):
        import json

        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = [c.strip() for c in value.split(",") if c.strip()]
        value = parsed if isinstance(parsed, list) else [parsed]
    return [str(c) for c in value]


class _EmbedJobOperator(EmbedfreshJobOperator):
    template_fields: Sequence[str] = (*EmbedfreshJobOperator.template_fields, "version", "corpus")

    def __init__(self, *, version: str, corpus: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.version = version
        self.corpus = corpus

    def job_specific_settings(self) -> dict[str, Any]:
        return {"version": self.version, "corpus": self.corpus}


class ShardEmbeddingOperator(_EmbedJobOperator):
    """Embeds corpus shards with one committed model version (``python -m embedfresh.jobs.embed``).

    Skips shards already committed, so a retry only does what is left. Map it over
    shards: ``ShardEmbeddingOperator.partial(...).expand_kwargs(list_shards.output)``.

    :param version: model version to embed with (templated).
    :param corpus: corpus name (templated).
    :param shards: shard indices this task embeds; None: every shard (templated).
    :param token_budget: padded tokens per batch (templated).
    """

    job_name = "embed"
    template_fields: Sequence[str] = (*_EmbedJobOperator.template_fields, "shards", "token_budget")

    def __init__(
        self,
        *,
        shards: list[int] | str | None = None,
        token_budget: int | str = 4096,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.shards = shards
        self.token_budget = token_budget

    def job_specific_settings(self) -> dict[str, Any]:
        settings = {**super().job_specific_settings(), "token_budget": self.token_budget}
        if self.shards is not None:
            settings["shards"] = self.shards
        return settings


class BatchEmbeddingOperator(ShardEmbeddingOperator):
    """Deprecated alias of :class:`ShardEmbeddingOperator`, the name it had before it was
    renamed (it runs on any runner, not only AWS Batch); removed in the next release.

    The same operator, arguments and results; constructing it (or calling ``partial``)
    warns with a :class:`FutureWarning` naming the new name. Its tasks show this
    class name as their task type until the DAG imports the new one.
    """

    def __init__(self, **kwargs: Any) -> None:
        # stacklevel 3: past Airflow's apply_defaults wrapper, to the DAG file's line. This
        # module imports warn, not warnings: Airflow rewrites a module's ``warnings`` to
        # add its own stack levels (fixup_decorator_warning_stack).
        warn(_RENAMED_EMBED_OPERATOR, FutureWarning, stacklevel=3)
        super().__init__(**kwargs)

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:
        """``ShardEmbeddingOperator.partial``, with the deprecation warning at parse time
        (a mapped task is constructed only when it runs)."""
        warn(_RENAMED_EMBED_OPERATOR, FutureWarning, stacklevel=2)
        return super().partial(**kwargs)


_RENAMED_EMBED_OPERATOR = (
    "BatchEmbeddingOperator is deprecated and will be removed in the next release: use "
    "ShardEmbeddingOperator (the same operator, renamed: it runs on any execution_mode, "
    "not only AWS Batch)"
)


class BatchArrayEmbeddingOperator(_EmbedJobOperator):
    """Embeds every pending shard of a corpus in one task: one AWS Batch array job.

    What a mapped ``ShardEmbeddingOperator`` does with one task per shard group, this
    does with one task and one ``SubmitJob``, for corpora of thousands of shards
    (Airflow maps at most ``max_map_length`` = 1,024 tasks, and each mapped task holds a
    worker slot and pays a task start). In order:

    1. **plan**: the embed job in ``mode=plan`` runs on the worker (a subprocess: it
       reads markers and corpus ETags, embeds nothing) and lists the shards whose output
       is not committed and current, by the embed job's own reuse rule; it writes the
       plan (the pending shards and the slice count, ``min(pending, max_children)``) to
       ``runs/<model>/<run_id>/plans/<result name>/<attempt id>.json``
       (:mod:`embedfresh.core.embed_plan`). Nothing pending: the task returns at once,
       nothing is submitted;
    2. **submit** through :attr:`runner` one job with ``array_size`` = the slice count
       (one slice: a plain job), every child told the plan's path and sha256; Batch's
       retry strategy retries a child that exits 75 or loses its host, and the task
       waits (``deferrable`` or polling, the runner's setting);
    3. **collect**: each child writes its result record as ``<result name>+<index>``;
       the task reads every one and returns the combined summary: children by state,
       shards embedded and reused, rows, the children that needed a retry.

    A re-run plans again, so it submits only what is still pending. With any
    ``execution_mode`` but ``aws_batch`` the plan has one slice: one job embeds every
    pending shard. The verify step after it is the same ``EmbeddingVerifyOperator``.

    .. seealso:: docs/SCALING.md (array job or mapped tasks; the limits on the way)

    :param version: model version to embed with (templated).
    :param corpus: corpus name (templated).
    :param max_children: the most array children (2 to 10,000; 1: always a plain job)
        the pending shards are split over (templated).
    :param token_budget: padded tokens per batch (templated).
    :raises AirflowFailException: the plan or a child exited 2, 3 or 4 (bad input).
    :raises AirflowException: the array job failed (a child failed every attempt Batch
        gave it), or a child's record is missing: retried, and the retry plans only the
        shards still pending.
    """

    job_name = "embed"
    template_fields: Sequence[str] = (
        *_EmbedJobOperator.template_fields,
        "max_children",
        "token_budget",
    )

    def __init__(
        self,
        *,
        max_children: int | str = 1000,
        token_budget: int | str = 4096,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_children = max_children
        self.token_budget = token_budget
        self._ticket: ResultTicket | None = None
        self._job_details: dict[str, Any] = {}

    def job_specific_settings(self) -> dict[str, Any]:
        return {**super().job_specific_settings(), "token_budget": self.token_budget}

    # --- planning ---------------------------------------------------------------------

    def _children_allowed(self) -> int:
        from embedfresh.core.embed_plan import MAX_CHILDREN
        from embedfresh.operators.constants import ExecutionMode

        try:
            wanted = int(self.max_children)
        except (TypeError, ValueError):
            raise AirflowFailException(
                f"max_children must be a whole number, got {self.max_children!r}"
            ) from None
        if not 1 <= wanted <= MAX_CHILDREN:
            raise AirflowFailException(
                f"max_children must be 1 to {MAX_CHILDREN} (AWS Batch's array size), got {wanted}"
            )
        if self.execution_mode != ExecutionMode.AWS_BATCH and wanted > 1:
            self.log.warning(
                "execution_mode=%s starts no array jobs: one job embeds every pending shard",
                self.execution_mode,
            )
            return 1
        return wanted

    def _plan_rel(self, ticket: ResultTicket) -> str:
        from embedfresh.core.embed_plan import plan_path

        return plan_path(str(self.model), str(self.run_id), ticket.name, ticket.attempt_id)

    def plan(self, ticket: ResultTicket) -> dict[str, Any]:
        """Run the embed job's planner on the worker; its summary (slices, counts)."""
        from embedfresh.core.results import ResultTicket, new_attempt_id, suffixed_result_name
        from embedfresh.operators.runners import LocalRunner

        base = super().build_job_spec(None)
        settings = {
            **base.settings,
            "mode": "plan",
            "plan": self._plan_rel(ticket),
            "max_children": self._children_allowed(),
        }
        spec = JobSpec(
            job=self.job_name,
            settings=settings,
            env=base.env,
            result=ResultTicket(
                name=suffixed_result_name(ticket.name, "plan"), attempt_id=new_attempt_id()
            ),
        )
        self.log.info("planning: which shards of corpus %s are pending", self.corpus)
        self._plan_runner = LocalRunner()
        summary = self.handle_result(spec, self._plan_runner.run(spec, self.log))
        self.log.info(
            "plan %s: %s shard(s) pending in %s slice(s), %s reused, %s recomputed",
            summary.get("plan_url"),
            summary.get("shards_pending"),
            summary.get("slices"),
            summary.get("shards_reused"),
            summary.get("shards_recomputed"),
        )
        return summary

    def read_plan(self, ticket: ResultTicket) -> tuple[EmbedPlan, str]:
        """The plan execution ``ticket`` wrote, and its sha256."""
        import hashlib

        from embedfresh.core.embed_plan import read_plan
        from embedfresh.core.exit_codes import BadInputError

        store = artifact_store(self.artifact_root, self.aws_conn_id)
        rel = self._plan_rel(ticket)
        try:
            data = store.read_bytes(rel)
            sha = hashlib.sha256(data).hexdigest()
            return read_plan(store, rel, sha), sha
        except FileNotFoundError:
            raise AirflowException(
                f"embed plan {store.url(rel)} is missing: the task is retried and plans again"
            ) from None
        except BadInputError as e:
            raise AirflowException(str(e)) from e

    # --- the job ----------------------------------------------------------------------

    def result_ticket(self, context: Any) -> ResultTicket:
        # The one ticket of this execution: the plan is keyed to it.
        if self._ticket is None:
            self._ticket = super().result_ticket(context)
        return self._ticket

    def build_job_spec(self, result: ResultTicket | None = None) -> JobSpec:
        """The array job: every child gets the plan's path and sha256 and finds its slice
        by ``AWS_BATCH_JOB_ARRAY_INDEX``; ``array_size`` is the plan's slice count (one
        slice: a plain job)."""
        spec = super().build_job_spec(result)
        if result is None:
            return spec
        plan, sha = self.read_plan(result)
        settings = {**spec.settings, "plan": self._plan_rel(result), "plan_sha256": sha}
        return dataclasses.replace(spec, settings=settings, array_size=max(1, plan.slices))

    def execute(self, context: Any) -> dict[str, Any]:
        self.use_run_context(context)
        self.verify_inputs()
        ticket = self.result_ticket(context)
        runner = self.runner
        if isinstance(runner, AttachingRunner):
            # A retry after a lost worker waits on the array its try submitted, with that
            # try's ticket and plan: planning again would list the shards it is embedding.
            probe = super().build_job_spec(ticket)
            attached = runner.attach(probe, self.log, context.get("task_state_store"))
            if attached.result != ticket:
                self._ticket = attached.result
                return super().execute(context)
        planned = self.plan(ticket)
        if not planned.get("slices"):
            self.log.info(
                "every shard of %s is committed and current: nothing to submit", self.corpus
            )
            return self._combined(planned, [], {})
        return super().execute(context)

    def handle_result(self, spec: JobSpec, result: JobResult) -> dict[str, Any]:
        if spec.settings.get("mode") != "plan":
            self._job_details = dict(result.details)
        return super().handle_result(spec, result)

    def read_result(self, spec: JobSpec) -> dict[str, Any]:
        """Every child's result record, combined (the plan's record: the planner's summary)."""
        if spec.settings.get("mode") == "plan" or spec.result is None:
            return super().read_result(spec)
        from embedfresh.core.results import ResultTicket, child_result_name

        plan, _ = self.read_plan(spec.result)
        if plan.slices <= 1:
            names = [spec.result.name]
        else:
            names = [child_result_name(spec.result.name, i) for i in range(plan.slices)]
        summaries = []
        for name in names:
            child = dataclasses.replace(
                spec, result=ResultTicket(name=name, attempt_id=spec.result.attempt_id)
            )
            summaries.append(super().read_result(child))
        planned = {
            "plan_url": self._store_url(self._plan_rel(spec.result)),
            "slices": plan.slices,
            "shards_pending": len(plan.shards),
            "shards_reused": len(plan.reused),
            "rows_reused": plan.reused_rows,
            "truncated_reused": plan.reused_truncated,
            "shards_recomputed": len(plan.recomputed),
        }
        return self._combined(planned, summaries, self._job_details)

    def _store_url(self, rel: str) -> str:
        return artifact_store(self.artifact_root, self.aws_conn_id).url(rel)

    def _combined(
        self,
        planned: dict[str, Any],
        children: list[dict[str, Any]],
        details: dict[str, Any],
    ) -> dict[str, Any]:
        """The task's XCom: what was planned, and what the children did."""
        by_state = details.get("children_by_state") or details.get("children")
        if not isinstance(by_state, dict):
            by_state = {"SUCCEEDED": len(children)} if children else {}
        done = sorted(i for c in children for i in c.get("shards_done", []))
        skipped = sorted(i for c in children for i in c.get("shards_skipped", []))
        retried = sorted(
            int(c["array_index"] or 0)
            for c in children
            if int(c.get("aws_batch_job_attempt") or 1) > 1
        )
        summary = {
            "status": "ok",
            "plan": planned.get("plan_url"),
            "children": len(children),
            "children_by_state": by_state,
            "children_retried": retried,
            "shards_pending": planned.get("shards_pending", 0),
            "shards_embedded": len(done),
            # Reused at planning time, plus any a child found committed when it started
            # (another run's task got there first).
            "shards_reused": int(planned.get("shards_reused", 0)) + len(skipped),
            "shards_recomputed": planned.get("shards_recomputed", 0),
            "rows": sum(int(c.get("rows", 0)) for c in children),
            "truncated": sum(int(c.get("truncated", 0)) for c in children),
            # Texts cut in the shards reused (at planning time, or by a child), from their
            # commit markers: the output holds them too.
            "rows_reused": _reused(planned, children, "rows_reused"),
            "truncated_reused": _reused(planned, children, "truncated_reused"),
            "output": planned.get("output") or (children[0].get("output") if children else None),
            "aws_batch_job_id": details.get("aws_batch_job_id"),
        }
        self.log.info(
            "embedded %d shard(s) (%d rows) in %d child(ren) %s; %d shard(s) reused",
            summary["shards_embedded"],
            summary["rows"],
            summary["children"],
            summary["children_by_state"],
            summary["shards_reused"],
        )
        return summary

    def on_kill(self) -> None:
        planner = getattr(self, "_plan_runner", None)
        if planner is not None:
            planner.kill()
        super().on_kill()


def _reused(planned: dict, children: list[dict], key: str) -> int:
    """``key`` (``rows_reused``, ``truncated_reused``) of the shards the planner found
    committed plus those each child found committed when it started."""
    return int(planned.get(key, 0)) + sum(int(c.get(key, 0)) for c in children)


class EmbeddingVerifyOperator(_EmbedJobOperator):
    """Verifies a corpus's embeddings and writes their manifest (``python -m embedfresh.jobs.embed_verify``).

    Announces the embedding set it verified, ``embedfresh://embedding-sets/<model>/<version>/<corpus>``
    (through the alias ``embedfresh-embedding-sets``; extra: rows, manifest), never the
    live one: ``embedfresh://embeddings/<model>/<corpus>`` is updated only with the
    release that carries it (:class:`~embedfresh.operators.ReleaseOperator`), together
    with its model. A search service schedules on the live Asset; a candidate's set is
    for whoever wants to look at it before it goes live.

    :param version: model version the embeddings come from (templated).
    :param corpus: corpus name (templated).
    """

    job_name = "embed_verify"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", [AssetAlias(EMBEDDING_SETS_ALIAS)])
        super().__init__(**kwargs)

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:
        """As :meth:`__init__`, the alias is an outlet of the mapped task too: Airflow reads
        a mapped task's outlets from ``partial``, never from the unmapped task."""
        kwargs.setdefault("outlets", [AssetAlias(EMBEDDING_SETS_ALIAS)])
        return super().partial(**kwargs)

    def announce(self, context: Any, summary: dict[str, Any]) -> dict[str, Any]:
        """Add the verified set's Asset event to the alias (its name is known only now)."""
        alias = AssetAlias(EMBEDDING_SETS_ALIAS)
        if alias in self.outlets:
            context["outlet_events"][alias].add(
                embedding_set_asset(str(self.model), str(self.version), str(self.corpus)),
                extra={k: summary.get(k) for k in ("rows", "manifest")},
            )
        return summary
