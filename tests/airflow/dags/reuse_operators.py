"""A DAG as another team's repository would write it: the embedfresh operators imported
from the installed package and chained their own way.

Health, then train and evaluate a candidate, then two quality gates on different
metrics side by side (the head's accuracy and AUC; retrieval's recall@10), and no
promote: the candidate embeds two corpora in parallel (one unmapped task each) and each
set is verified. Nothing goes live. Every task's report is its own: two gates and two
embeds of one run never overwrite each other's.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from embedfresh.operators import (
    AcceleratorHealthOperator,
    BatchEmbeddingOperator,
    EmbeddingVerifyOperator,
    EvaluationOperator,
    IncrementalTrainingOperator,
    QualityGateOperator,
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
    head_gate = QualityGateOperator(
        task_id="head_gate", **ARGS, metrics=["accuracy", "auc"], evaluation="evaluate_candidate"
    )
    recall_gate = QualityGateOperator(
        task_id="recall_gate", **ARGS, metrics=["recall_at_10"], evaluation="evaluate_candidate"
    )
    health >> train >> evaluate >> [head_gate, recall_gate]
    for corpus in ("products", "docs"):
        embed = BatchEmbeddingOperator(
            task_id=f"embed_{corpus}", **ARGS, version=RUN_ID, corpus=corpus, token_budget=2048
        )
        verify = EmbeddingVerifyOperator(
            task_id=f"verify_{corpus}", **ARGS, version=RUN_ID, corpus=corpus
        )
        [head_gate, recall_gate] >> embed >> verify
