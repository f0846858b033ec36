"""A DAG as another team's repository would write it: the embedfresh operators imported
from the installed package and chained their own way.

Health check, then one unmapped task that embeds every shard of a corpus with a given
model version, then verification (manifest + Asset event). No training, no gate, no
registry look-up, no dynamic task mapping: the operators work as they are outside the
project's own DAGs.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from embedfresh.operators import (
    AcceleratorHealthOperator,
    BatchEmbeddingOperator,
    EmbeddingVerifyOperator,
)

ARGS = {
    "artifact_root": "{{ params.artifact_root }}",
    "model": "{{ params.model }}",
    "backend": "cpu",
    "run_id": "reuse-{{ ds_nodash }}",
}

with DAG(
    "reuse_operators",
    description="Health, then embeddings of a corpus with a pinned model version",
    doc_md=__doc__,
    schedule=None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    params={
        "artifact_root": Param(type="string", description="Artifact store root URL"),
        "model": Param("tiny", type="string"),
        "version": Param(type="string", description="Model version to embed with"),
        "corpus": Param("products", type="string"),
    },
    tags=["test"],
) as dag:
    health = AcceleratorHealthOperator(task_id="health", **ARGS)
    embed_all = BatchEmbeddingOperator(
        task_id="embed_all",
        **ARGS,
        version="{{ params.version }}",
        corpus="{{ params.corpus }}",
        token_budget=2048,
    )
    verify = EmbeddingVerifyOperator(
        task_id="verify", **ARGS, version="{{ params.version }}", corpus="{{ params.corpus }}"
    )
    health >> embed_all >> verify
