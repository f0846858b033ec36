"""A DAG as another team's repository would write it: the embedfresh operators imported
from the installed package and chained their own way.

Health, then train and evaluate a candidate, then two quality gates side by side (one
at the 0.1% SLA on recall@10; one at 5% on accuracy and recall@10, of which the
baseline, a random relevance head, can be compared on recall@10 only), and no promote: the candidate embeds two corpora in parallel (one unmapped task each) and each
set is verified. Nothing goes live. Every task's report is its own: two gates and two
embeds of one run never overwrite each other's.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from embedfresh.operators import (
    AcceleratorHealthOperator,
    EmbeddingVerifyOperator,
    EvaluationOperator,
    IncrementalTrainingOperator,
    QualityGateOperator,
    ShardEmbeddingOperator,
)

RUN_ID = "reuse-{{ ds_nodash }}"
ARGS = {
    "artifact_root": "{{ params.artifact_root }}",
    "model": "{{ params.model }}",
    "backend": "cpu",
    "run_id": RUN_ID,
}

with DAG(
    "reuse_operators",
    description="Train, two gates, two corpora embedded from the candidate; no promote",
    doc_md=__doc__,
    schedule=None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    params={
        "artifact_root": Param(type="string", description="Artifact store root URL"),
        "model": Param("tiny", type="string"),
    },
    tags=["test"],
) as dag:
    health = AcceleratorHealthOperator(task_id="health", **ARGS)
    train = IncrementalTrainingOperator(task_id="train", **ARGS, epochs=1)
    evaluate = EvaluationOperator(task_id="evaluate_candidate", **ARGS)
    wide_gate = QualityGateOperator(
        task_id="wide_gate",
        **ARGS,
        metrics=["accuracy", "recall_at_10"],
        tolerance=0.05,
        evaluation="evaluate_candidate",
    )
    recall_gate = QualityGateOperator(
        task_id="recall_gate", **ARGS, metrics=["recall_at_10"], evaluation="evaluate_candidate"
    )
    health >> train >> evaluate >> [wide_gate, recall_gate]
    for corpus in ("products", "docs"):
        embed = ShardEmbeddingOperator(
            task_id=f"embed_{corpus}", **ARGS, version=RUN_ID, corpus=corpus, token_budget=2048
        )
        verify = EmbeddingVerifyOperator(
            task_id=f"verify_{corpus}", **ARGS, version=RUN_ID, corpus=corpus
        )
        [wide_gate, recall_gate] >> embed >> verify
