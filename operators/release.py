"""The release side: load a release's vector index, check search on it, make it live,
roll back to an earlier one, and collect what no kept release needs.

Every job here reaches the vector index (:mod:`embedfresh.core.index`): a PostgreSQL with
pgvector given by an Airflow connection (``index_conn_id``: its URI goes to the job in
the environment variable ``EMBEDFRESH_INDEX_DSN``, never on a command line or in a
rendered field), by ``EMBEDFRESH_INDEX_DSN`` in the worker's own environment, or else the
embedded server under the artifact root. docs/SEARCH.md.

A release and a rollback announce the model's Asset ``embedfresh://models/<model>`` and,
for every corpus of the release now live, ``embedfresh://embeddings/<model>/<corpus>``:
consumers learn of a model and its document vectors together, never of one alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import AssetAlias
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from embedfresh.operators.approval import approved
from embedfresh.operators.assets import (
    EMBEDDING_PUBLICATIONS_ALIAS,
    MODEL_PROMOTIONS_ALIAS,
    embeddings_asset,
    is_templated,
    model_asset,
)
from embedfresh.operators.base import EmbedfreshJobOperator
from embedfresh.operators.constants import ExecutionMode
from embedfresh.operators.embed import corpora_list
from embedfresh.operators.evaluate import QueryCap
from embedfresh.operators.gate import PASS, QualityGateOperator, followed_task
from embedfresh.operators.job_spec import JobSpec
from embedfresh.operators.reports import gate_report_name

if TYPE_CHECKING:
    from embedfresh.core.results import ResultTicket

__all__ = [
    "CorpusSyncOperator",
    "GarbageCollectOperator",
    "IndexLoadOperator",
    "ReleaseOperator",
    "RollbackOperator",
    "SearchCheckOperator",
]

#: Who a person's move is recorded as: the Airflow user who triggered the run (the
#: scheduler's runs have none, which the jobs refuse: an override is a person's act).
TRIGGERING_USER = "{{ dag_run.triggering_user_name or '' }}"


class VectorIndexOperator(EmbedfreshJobOperator):
    """A job operator whose job reaches the vector index.

    :param index_conn_id: an Airflow connection to a PostgreSQL with pgvector (RDS,
        Aurora); its URI reaches the job as ``EMBEDFRESH_INDEX_DSN`` in the environment
        of a local job. None: the worker's own ``EMBEDFRESH_INDEX_DSN``, else the
        embedded server. On AWS Batch the job definition gives the job its DSN from its
        secrets: a connection here is refused (the DSN would be in the job's overrides).
    """

    def __init__(self, *, index_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index_conn_id = index_conn_id

    def build_job_spec(self, result: ResultTicket | None = None) -> JobSpec:
        spec = super().build_job_spec(result)
        if not self.index_conn_id or result is None:
            return spec
        from embedfresh.core.settings import INDEX_DSN_ENV

        if self.execution_mode == ExecutionMode.AWS_BATCH:
            raise AirflowFailException(
                f"index_conn_id={self.index_conn_id!r} on AWS Batch would put the database's "
                "password in the job's container overrides (visible to DescribeJobs): give the "
                f"job definition {INDEX_DSN_ENV} from Secrets Manager (its secrets) instead"
            )
        return dataclasses.replace(spec, env={**spec.env, INDEX_DSN_ENV: self._dsn()})

    def _dsn(self) -> str:
        from airflow.sdk import BaseHook

        return BaseHook.get_connection(
            self.index_conn_id
        ).get_uri()  # postgres://...: libpq reads it


class _CorpusOperator(VectorIndexOperator):
    template_fields: Sequence[str] = (*EmbedfreshJobOperator.template_fields, "version", "corpus")

    def __init__(self, *, corpus: str, version: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.corpus = corpus
        self.version = version

    def job_specific_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {"corpus": self.corpus}
        if self.version:
            settings["version"] = self.version
        return settings


class IndexLoadOperator(_CorpusOperator):
    """Loads the run's verified embeddings of ``corpus`` into the release's table of the
    vector index, then builds its HNSW index (``python -m embedfresh.jobs.index_load``).

    Shard by shard, each exactly once (a ledger in the database): a retry after the
    database went away (exit 75) loads only what is missing. A table of the release's
    name holding other vectors, or one embedfresh did not make, fails the task for good
    (nothing is dropped).

    :param corpus: the corpus (templated).
    :param version: the model version whose embeddings are loaded; empty: the run id,
        what the run's train job published (templated).
    """

    job_name = "index_load"


class SearchCheckOperator(QueryCap, _CorpusOperator):
    """Checks search on the release's table before it goes live
    (``python -m embedfresh.jobs.search_check``): the index is faithful (ANN against exact
    top 10) and search is no worse than the live release's (nDCG@10 of the judged
    queries through the index, paired, the gate's 0.1% rule and looks). Exit 3 (no
    retry, no release) when not.

    :param corpus: the corpus (templated).
    :param version: as :class:`IndexLoadOperator`'s (templated).
    :param regression: ``enforce`` (default) or ``report`` (a person's promote-anyway:
        the comparison is reported, not enforced) (templated).
    :param gate: the run's gate, whose number of judged queries is the check's first
        look; None: the DAG's only gate.
    :param max_queries: the most judged queries its looks use (templated; ``QueryCap``).
    :param ask: an INCONCLUSIVE check succeeds with its verdict as XCom, for a person to
        decide (:class:`~embedfresh.operators.approval.ReleaseApprovalOperator`); FAIL
        always fails the task.
    """

    job_name = "search_check"
    template_fields: Sequence[str] = (*_CorpusOperator.template_fields, "regression", "max_queries")

    def __init__(
        self,
        *,
        regression: str = "enforce",
        gate: str | None = None,
        ask: bool = False,
        max_queries: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_queries = max_queries
        self.regression = regression
        self.gate = followed_task(self, gate, QualityGateOperator, "gate")
        self.ask = ask

    def job_specific_settings(self) -> dict[str, Any]:
        settings = {**super().job_specific_settings(), "regression": self.regression}
        settings.update(self.cap_setting())
        if self.gate:
            settings["gate_report"] = gate_report_name(self.gate)
        if self.ask:  # a person decides an INCONCLUSIVE check (operators/approval.py)
            settings["inconclusive_exits"] = False
        return settings


class _AnnouncesRelease(VectorIndexOperator):
    """Announces the release now live: the model's Asset, and every corpus's embeddings
    Asset (through the alias ``embedfresh-embedding-publications``; the corpora are known
    when the job is done)."""

    def __init__(self, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if "outlets" not in kwargs and model is not None:  # no model: the base says so
            kwargs["outlets"] = [
                AssetAlias(MODEL_PROMOTIONS_ALIAS) if is_templated(model) else model_asset(model),
                AssetAlias(EMBEDDING_PUBLICATIONS_ALIAS),
            ]
        super().__init__(**kwargs)

    def announce(self, context: Any, summary: dict[str, Any]) -> dict[str, Any]:
        model = str(self.model)
        release = summary.get("release")
        model_extra = {
            "release": release,
            "version": summary.get("production"),
            "registry": summary.get("registry"),
        }
        for outlet in self.outlets:
            if isinstance(outlet, AssetAlias) and outlet.name == MODEL_PROMOTIONS_ALIAS:
                context["outlet_events"][outlet].add(model_asset(model), extra=model_extra)
            elif isinstance(outlet, AssetAlias) and outlet.name == EMBEDDING_PUBLICATIONS_ALIAS:
                for corpus, entry in (summary.get("corpora") or {}).items():
                    context["outlet_events"][outlet].add(
                        embeddings_asset(model, corpus),
                        extra={"release": release, "version": summary.get("production"), **entry},
                    )
            elif outlet == model_asset(model):
                context["outlet_events"][outlet].extra = model_extra
        return summary


class ReleaseOperator(_AnnouncesRelease):
    """Makes the run's release live (``python -m embedfresh.jobs.release``): its model
    version with every corpus's verified embeddings, index table and passed search check,
    by compare-and-swap on the registry; then switches the index's live views.

    ``action="promote"`` (default) follows the run's gate: any decision but PASS skips
    the task (a decision, not an error: the run stays green, the live release
    untouched); the job itself refuses a non-PASS gate report (exit 3, no retry).
    ``action="promote_anyway"`` is a person's override and needs a ``reason`` (recorded
    with ``who``).

    :param corpora: the corpora released with the model (templated: a list, or a JSON
        list as a string, e.g. ``"{{ params.corpora | tojson }}"``).
    :param drop_corpora: corpora of the live release this release does not carry (their
        live views are dropped); the job refuses a live corpus in neither list
        (templated, as ``corpora``; empty by default).
    :param version: the model version; empty: the run id (templated).
    :param action: ``promote`` or ``promote_anyway`` (templated).
    :param reason: why (``promote_anyway``) (templated).
    :param who: who (``promote_anyway``); default the user who triggered the run (templated).
    :param gate: the task id of the :class:`~embedfresh.operators.QualityGateOperator`
        the release follows (its decision, its report); None: the DAG's only gate
        (several: refused when the DAG file is parsed), or the run's ``gate.json`` when
        the DAG has none (a gate of another DAG of the same run id).
    :param approval: the task id of a
        :class:`~embedfresh.operators.approval.ReleaseApprovalOperator` before it: when a
        person approved there, the release is theirs (``promote_anyway``, who answered,
        why they said).
    """

    job_name = "release"
    template_fields: Sequence[str] = (
        *EmbedfreshJobOperator.template_fields, "corpora", "drop_corpora", "version", "action",
        "reason", "who",
    )  # fmt: skip

    def __init__(
        self,
        *,
        corpora: Sequence[str] | str = ("products",),
        drop_corpora: Sequence[str] | str = (),
        version: str = "",
        action: str = "promote",
        reason: str = "",
        who: str = TRIGGERING_USER,
        gate: str | None = None,
        approval: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.approval = approval
        # A list, a template, or an XCom of a list: parsed when the job spec is built.
        self.corpora = list(corpora) if isinstance(corpora, list | tuple) else corpora
        self.drop_corpora = (
            list(drop_corpora) if isinstance(drop_corpora, list | tuple) else drop_corpora
        )
        self.version = version
        self.action = action
        self.reason = reason
        self.who = who
        self.gate = followed_task(self, gate, QualityGateOperator, "gate")

    def execute(self, context: Any) -> dict[str, Any]:
        if self.approval and self.action == "promote":
            answer = approved(context["ti"].xcom_pull(task_ids=self.approval))
            if answer is not None:  # a person released what the gate could not decide
                run_id = context["run_id"]
                self.action, self.who = "promote_anyway", answer["who"]
                self.reason = f"approved in run {run_id}: {answer['why']}"
        self.follow_gate(context)
        return super().execute(context)

    def follow_gate(self, context: Any) -> None:
        """Skip unless the gate this release follows said PASS (``promote`` only).

        :raises AirflowSkipException: its decision (XCom) is not PASS.
        :raises AirflowFailException: the DAG has several gates and none is named.
        """
        try:
            self.gate = followed_task(self, self.gate, QualityGateOperator, "gate")
        except ValueError as e:
            raise AirflowFailException(str(e)) from e
        if self.action != "promote" or not self.gate:
            return
        decision = context["ti"].xcom_pull(task_ids=self.gate)
        verdict = decision.get("verdict") if isinstance(decision, dict) else None
        if verdict is not None and verdict != PASS:
            raise AirflowSkipException(
                f"gate {self.gate!r} said {verdict} ({decision.get('reason')}): nothing is "
                f"released, the live release stays as it is; decision {decision.get('report')}"
            )

    def job_specific_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {"corpora": corpora_list(self.corpora), "action": self.action}
        if self.drop_corpora:
            settings["drop_corpora"] = corpora_list(self.drop_corpora)
        if self.gate:
            settings["gate_report"] = gate_report_name(self.gate)
        if self.version:
            settings["version"] = self.version
        if self.action != "promote":
            settings.update(reason=self.reason, who=self.who)
        return settings


class RollbackOperator(_AnnouncesRelease):
    """Makes an earlier release live again (``python -m embedfresh.jobs.rollback``): its
    model, its embedding sets and its index tables. Recorded in the registry's history
    with who triggered it and why. A release past retention, or one whose table is no
    longer whole, is refused (exit 2, no retry).

    :param release: the release to make live again (templated).
    :param reason: why; required (templated).
    :param who: who; default the user who triggered the run (templated).
    """

    job_name = "rollback"
    template_fields: Sequence[str] = (
        *EmbedfreshJobOperator.template_fields, "release", "reason", "who",
    )  # fmt: skip

    def __init__(self, *, release: str, reason: str, who: str = TRIGGERING_USER, **kwargs: Any):
        super().__init__(**kwargs)
        self.release = release
        self.reason = reason
        self.who = who

    def job_specific_settings(self) -> dict[str, Any]:
        return {"to_release": self.release, "reason": self.reason, "who": self.who}


class GarbageCollectOperator(VectorIndexOperator):
    """Deletes what no kept release references (``python -m embedfresh.jobs.garbage_collect``):
    index tables, embedding sets and the model versions of releases past retention;
    nothing a running refresh is writing.

    :param grace_hours: nothing newer than this is deleted (templated).
    :param dry_run: list, delete nothing (templated).
    """

    job_name = "garbage_collect"
    template_fields: Sequence[str] = (
        *EmbedfreshJobOperator.template_fields,
        "grace_hours",
        "dry_run",
    )

    def __init__(
        self, *, grace_hours: float | str = 24, dry_run: bool | str = False, **kwargs: Any
    ):
        super().__init__(**kwargs)
        self.grace_hours = grace_hours
        self.dry_run = dry_run

    def job_specific_settings(self) -> dict[str, Any]:
        return {"grace_hours": self.grace_hours, "dry_run": self.dry_run}


class CorpusSyncOperator(VectorIndexOperator):
    """Applies a corpus's change sets to a release's table (``python -m
    embedfresh.jobs.corpus_sync``): upserts embedded by the release's own encoder, deletes,
    one transaction per change set, a ledger that makes a re-run apply only what is
    missing. docs/SEARCH.md "Corpus changes".

    :param corpus: the corpus whose change sets are applied (templated).
    :param release: the release whose table is synced; empty: the live one (templated).
    """

    job_name = "corpus_sync"
    template_fields: Sequence[str] = (*EmbedfreshJobOperator.template_fields, "corpus", "release")

    def __init__(self, *, corpus: str, release: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.corpus = corpus
        self.release = release

    def job_specific_settings(self) -> dict[str, Any]:
        return {"corpus": self.corpus} | ({"release": self.release} if self.release else {})
