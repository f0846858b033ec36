"""Batch embeddings of a corpus with a model version: resolve -> list shards -> embed -> verify.

Runs whenever the default model's Asset ``embedfresh://models/tiny`` is updated (a
release by ``embedding_model_refresh``), and by hand for any corpus, model and version.
An empty ``version`` means the registry's production version of ``model``. The refresh
embeds its own release's corpora; this DAG embeds any other corpus (offline batch
embedding): its output is a verified embedding set, which goes live only with a release.
The embeddings a kept release carries never change: re-embedding them after their
corpus changed is refused, naming the release.

How the shards fan out is a deployment setting, read when the DAG file is parsed
(the graph differs), from ``EMBEDFRESH_EMBED_FAN_OUT``:

- ``mapped`` (default: the local runner, small corpora): ``list_shards`` and one mapped
  ``embed`` task per ``shards_per_task`` shards; each skips shards already committed,
  so a retry only redoes what is missing. Airflow maps at most ``max_map_length``
  (1,024 by default) tasks, and each holds a worker slot and pays a task start;
- ``array`` (large corpora on AWS Batch): one ``embed`` task
  (``BatchArrayEmbeddingOperator``) plans the shards whose output is not committed and
  current and submits one AWS Batch array job of at most ``max_children`` children
  (Param; Batch's limit is 10,000), each embedding a slice; a re-run submits only what
  is still pending. It needs ``EMBEDFRESH_BATCH_JOB_QUEUE`` and
  ``EMBEDFRESH_BATCH_JOB_DEFINITION`` (or their per-step forms,
  ``EMBEDFRESH_BATCH_EMBED_JOB_QUEUE``...: ``operators/resources.py``);
  ``EMBEDFRESH_EMBED_MAX_CHILDREN`` sets the Param's default (1,000).

Either way ``verify`` (the same operator; on AWS Batch too with ``array``) checks every
shard against the corpus and writes the manifest. docs/SCALING.md says where each one
stops scaling.

The Params' defaults run the embedded demo on CPU (after ``python -m embedfresh.jobs.generate_data``
and a promotion, or with ``version`` set to a published model version).
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from embedfresh.operators import (
    CorpusShardsOperator,
    EmbeddingVerifyOperator,
    ResolveModelVersionOperator,
    ShardEmbeddingOperator,
    model_asset,
)
from embedfresh.operators.embed import BatchArrayEmbeddingOperator
from embedfresh.operators.notify import notifiers
from embedfresh.operators.params import COMMON_JOB_ARGS, DEFAULT_MODEL, common_params
from embedfresh.operators.resources import embed_fan_out, embed_max_children, task_resources

VERSION = "{{ ti.xcom_pull(task_ids='resolve_version') }}"

#: ``mapped`` (default) or ``array``: how the embed step fans out (module docstring).
FAN_OUT = embed_fan_out()


#: The array fan-out runs on AWS Batch whatever the deployment's default runner.
ON_BATCH = "aws_batch" if FAN_OUT == "array" else None


if FAN_OUT == "mapped":
    FAN_OUT_PARAMS = {
        "shards_per_task": Param(
            1, type="integer", minimum=1, description="Corpus shards per mapped embed task"
        ),
    }
else:
    FAN_OUT_PARAMS = {
        "max_children": Param(
            embed_max_children(),
            type="integer",
            minimum=1,
            maximum=10_000,
            description="Most children of the AWS Batch array job (one slice: a plain job)",
        ),
    }

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
        **FAN_OUT_PARAMS,
    },
    tags=["embedfresh"],
    on_failure_callback=notifiers("run_failed"),
) as dag:
    resolve_version = ResolveModelVersionOperator(
        task_id="resolve_version",
        artifact_root="{{ params.artifact_root }}",
        model="{{ params.model }}",
        version="{{ params.version }}",
        corpus="{{ params.corpus }}",
    )
    verify = EmbeddingVerifyOperator(
        task_id="verify",
        **COMMON_JOB_ARGS,
        # With the array fan-out the corpus is large: the verifier, which reads every
        # part, runs where the embeddings were made, not on the Airflow worker.
        **task_resources("verify", ON_BATCH),
        version=VERSION,
        corpus="{{ params.corpus }}",
    )
    if FAN_OUT == "mapped":
        list_shards = CorpusShardsOperator(
            task_id="list_shards",
            artifact_root="{{ params.artifact_root }}",
            corpus="{{ params.corpus }}",
            shards_per_task="{{ params.shards_per_task }}",
        )
        embed = ShardEmbeddingOperator.partial(
            task_id="embed", **COMMON_JOB_ARGS, **task_resources("embed"), version=VERSION
        ).expand_kwargs(list_shards.output)
        resolve_version >> list_shards >> embed >> verify
    else:
        embed_array = BatchArrayEmbeddingOperator(
            task_id="embed",
            **COMMON_JOB_ARGS,
            **task_resources("embed", ON_BATCH),
            version=VERSION,
            corpus="{{ params.corpus }}",
            max_children="{{ params.max_children }}",
        )
        resolve_version >> embed_array >> verify
