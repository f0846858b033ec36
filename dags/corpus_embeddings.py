"""Batch embeddings of a corpus with a model version: resolve -> list shards -> embed -> verify.

Runs whenever the default model's Asset ``embedfresh://models/tiny`` is updated (a
promotion by ``embedding_model_refresh``), and by hand for any corpus, model and version.
An empty ``version`` means the registry's production version of ``model``.

The corpus's shards fan out with dynamic task mapping (``shards_per_task`` shards per
mapped ``embed`` task); each skips shards already committed, so a retry only redoes what
is missing. ``verify`` checks every shard against the corpus, writes the manifest and
updates the Asset ``embedfresh://embeddings/<model>/<corpus>``.

The Params' defaults run the embedded demo on CPU (after ``python -m embedfresh.jobs.generate_data``
and a promotion, or with ``version`` set to a published model version).
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from embedfresh.operators import (
    BatchEmbeddingOperator,
    CorpusShardsOperator,
    EmbeddingVerifyOperator,
    ResolveModelVersionOperator,
    model_asset,
)
from embedfresh.operators.params import COMMON_JOB_ARGS, DEFAULT_MODEL, common_params

VERSION = "{{ ti.xcom_pull(task_ids='resolve_version') }}"

with DAG(
    "corpus_embeddings",
    description="Embeddings of a corpus with a model version, fanned out over its shards",
    doc_md=__doc__,
    schedule=[model_asset(DEFAULT_MODEL)],
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": dt.timedelta(seconds=30)},
    params={
        **common_params(),
        "corpus": Param("products", type="string", description="Corpus name under corpora/"),
        "version": Param(
            "", type="string", description="Model version; empty: the production version"
        ),
        "shards_per_task": Param(
            1, type="integer", minimum=1, description="Corpus shards per mapped embed task"
        ),
    },
    tags=["embedfresh"],
) as dag:
    resolve_version = ResolveModelVersionOperator(
        task_id="resolve_version",
        artifact_root="{{ params.artifact_root }}",
        model="{{ params.model }}",
        version="{{ params.version }}",
        corpus="{{ params.corpus }}",
    )
    list_shards = CorpusShardsOperator(
        task_id="list_shards",
        artifact_root="{{ params.artifact_root }}",
        corpus="{{ params.corpus }}",
        shards_per_task="{{ params.shards_per_task }}",
    )
    embed = BatchEmbeddingOperator.partial(
        task_id="embed", **COMMON_JOB_ARGS, version=VERSION, corpus="{{ params.corpus }}"
    ).expand(shards=list_shards.output)
    verify = EmbeddingVerifyOperator(
        task_id="verify", **COMMON_JOB_ARGS, version=VERSION, corpus="{{ params.corpus }}"
    )

    resolve_version >> list_shards >> embed >> verify
