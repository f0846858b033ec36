"""Two human overrides of the live release, each a run of a small DAG.

- ``embedfresh_promote_anyway``: release ``version`` although no quality gate passed it,
  with a required ``reason`` (the one exception to "only PASS releases"). A release is
  never a bare model: the version's embeddings of every corpus of ``corpora`` are made
  (shards already committed are reused), verified, loaded into the release's own index
  tables and search-checked (the index must be faithful; the comparison with the live
  release is reported, not enforced: that is what the person overrides) before the
  release goes live. The version must still be committed and intact.
- ``embedfresh_rollback``: make ``release``, an earlier release that retention keeps
  (the last ``$EMBEDFRESH_KEEP_RELEASES``, default 3), live again with a required
  ``reason``: its model, its embedding sets and its index tables together.

They are DAGs, not buttons that write, so Airflow's own machinery applies: only users who
may trigger the DAG can act (a viewer's trigger is refused by the api-server), every run
is in the DAG's run history and in Airflow's audit log, and the jobs run with the
worker's store credentials, never the browser's. The registry's history records the
user who triggered the run (``who``), the time and the ``reason`` (``why``). The "Model
quality" page links to their Trigger forms for users who may trigger them.

Neither is scheduled; a refusal (a version that is not there or is damaged, a release
past retention, a table no longer whole) fails at once with the reason in the task log,
and the live release stays.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from embedfresh.operators import (
    CorporaOperator,
    CorpusShardsOperator,
    EmbeddingVerifyOperator,
    IndexLoadOperator,
    ReleaseOperator,
    RollbackOperator,
    SearchCheckOperator,
    ShardEmbeddingOperator,
)
from embedfresh.operators.notify import notifiers
from embedfresh.operators.params import (
    INDEX_ARGS,
    artifact_root_param,
    corpora_param,
    model_param,
)
from embedfresh.operators.resources import task_resources

COMMON = {
    "artifact_root": "{{ params.artifact_root }}",
    "model": "{{ params.model }}",
}
VERSION = "{{ params.version }}"
#: A transient store error retries once; a refusal (exit 2) fails at once, production stays.
RETRIES = {"retries": 1, "retry_delay": dt.timedelta(seconds=10)}
ID_PATTERN = r"^[A-Za-z0-9._:+=-]{1,200}$"


def _reason() -> Param:
    return Param(
        type="string",
        minLength=1,
        description="Why (required): recorded in the registry's history with your user name",
    )


with DAG(
    "embedfresh_promote_anyway",
    description="Release a version the quality gate did not pass, with its corpus "
    "embeddings (a person's override, with a reason)",
    doc_md=__doc__,
    schedule=None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    default_args=RETRIES,
    params={
        "artifact_root": artifact_root_param(),
        "model": model_param(),
        "version": Param(
            type="string",
            pattern=ID_PATTERN,
            description="The version to release (models/<model>/versions/<version>)",
        ),
        "corpora": corpora_param(),
        "reason": _reason(),
    },
    tags=["embedfresh", "override"],
    on_failure_callback=notifiers("run_failed"),
):
    corpora = CorporaOperator(
        task_id="corpora",
        artifact_root="{{ params.artifact_root }}",
        corpora="{{ params.corpora | tojson }}",
    )
    list_shards = CorpusShardsOperator(
        task_id="list_shards", artifact_root="{{ params.artifact_root }}", corpora=corpora.output
    )
    embed = ShardEmbeddingOperator.partial(
        task_id="embed", **COMMON, **task_resources("embed"), version=VERSION
    ).expand_kwargs(list_shards.output)
    verify = EmbeddingVerifyOperator.partial(
        task_id="verify", **COMMON, **task_resources("verify"), version=VERSION
    ).expand(corpus=corpora.output)
    load_index = IndexLoadOperator.partial(
        task_id="load_index",
        **COMMON,
        **INDEX_ARGS,
        **task_resources("load_index"),
        version=VERSION,
    ).expand(corpus=corpora.output)
    search_check = SearchCheckOperator.partial(
        task_id="search_check",
        **COMMON,
        **INDEX_ARGS,
        **task_resources("search_check"),
        version=VERSION,
        regression="report",
    ).expand(corpus=corpora.output)
    release = ReleaseOperator(
        task_id="release",
        **COMMON,
        **INDEX_ARGS,
        **task_resources("release"),
        version=VERSION,
        corpora="{{ params.corpora | tojson }}",
        action="promote_anyway",
        reason="{{ params.reason }}",
        on_success_callback=notifiers("promote_anyway"),  # who and why, to people
    )
    corpora >> list_shards >> embed >> verify >> load_index >> search_check >> release

with DAG(
    "embedfresh_rollback",
    description="Make an earlier release live again: its model, embeddings and index tables "
    "(with a reason)",
    doc_md=__doc__,
    schedule=None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    default_args=RETRIES,
    params={
        "artifact_root": artifact_root_param(),
        "model": model_param(),
        "release": Param(
            type="string",
            pattern=ID_PATTERN,
            description="The earlier release to make live again (one retention keeps: "
            "listed on the Model quality page)",
        ),
        "reason": _reason(),
    },
    tags=["embedfresh", "override"],
    on_failure_callback=notifiers("run_failed"),
):
    RollbackOperator(
        task_id="move", **COMMON, **INDEX_ARGS, **task_resources("rollback"),
        release="{{ params.release }}",
        reason="{{ params.reason }}",
        on_success_callback=notifiers("rollback"),  # who and why, to people
    )  # fmt: skip
