"""Daily refresh of the production embedding model: train -> evaluate -> gate -> promote -> embed.

Each run trains the production model incrementally on the data interval's partition
(resuming from its last checkpoint on a retry), evaluates it on the fixed held-out set,
lets it through only if the quality gate says PASS (the 0.1% SLA) and then moves the
production pointer, which updates the model's Asset ``embedfresh://models/<model>``.
Then it embeds the ``products`` corpus with the promoted version, one mapped ``embed``
task per corpus shard, and ``verify`` writes the manifest and updates the Asset
``embedfresh://embeddings/<model>/products``.

The Params' defaults run the embedded demo on CPU: generate data into the artifact root
first (``python -m jobs.generate_data --root <artifact_root>``), then trigger.

The schedule is an explicit ``CronDataIntervalTimetable``: with a bare ``"@daily"``
Airflow 3 uses ``CronTriggerTimetable``, whose runs have an empty data interval
(start == end), which would leave the training job no partition to read. A run's data
interval is the day before its run time (for a manual run, before its logical date):
the run of 2026-01-02 00:00 trains on partition ``dt=2026-01-01``.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from airflow.sdk import DAG, CronDataIntervalTimetable, Param

from operators import (
    BatchEmbeddingOperator,
    CorpusShardsOperator,
    EmbeddingVerifyOperator,
    EvaluationOperator,
    IncrementalTrainingOperator,
    PromoteModelOperator,
    QualityGateOperator,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ARTIFACT_ROOT = os.environ.get("EMBEDFRESH_ARTIFACT_ROOT") or (
    f"file://{REPO / 'artifacts' / 'airflow'}"
)

COMMON = {
    "artifact_root": "{{ params.artifact_root }}",
    "model": "{{ params.model }}",
    "backend": "{{ params.backend }}",
}
CORPUS = "products"
PROMOTED = "{{ ti.xcom_pull(task_ids='promote')['production'] }}"

with DAG(
    "embedding_model_refresh",
    description="Incremental refresh of the production embedding model behind a quality gate",
    doc_md=__doc__,
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": dt.timedelta(seconds=30)},
    params={
        "artifact_root": Param(
            DEFAULT_ARTIFACT_ROOT,
            type="string",
            description="Artifact store root URL: file:///... or s3://bucket/prefix",
        ),
        "model": Param("tiny", enum=["tiny", "minilm"], description="Model config name"),
        "backend": Param(
            "cpu", enum=["auto", "cpu", "cuda", "xla", "neuron"], description="Accelerator backend"
        ),
        "epochs": Param(3, type="integer", minimum=1, description="Training epochs"),
    },
    tags=["embedfresh"],
) as dag:
    train = IncrementalTrainingOperator(
        task_id="train",
        **COMMON,
        epochs="{{ params.epochs }}",
        retries=2,
        retry_delay=dt.timedelta(seconds=10),
        retry_exponential_backoff=2.0,
    )
    evaluate = EvaluationOperator(task_id="evaluate", **COMMON)
    gate = QualityGateOperator(task_id="gate", **COMMON, retries=0)
    promote = PromoteModelOperator(task_id="promote", **COMMON)

    list_shards = CorpusShardsOperator(
        task_id="list_shards", artifact_root="{{ params.artifact_root }}", corpus=CORPUS
    )
    embed = BatchEmbeddingOperator.partial(
        task_id="embed", **COMMON, version=PROMOTED, corpus=CORPUS
    ).expand(shards=list_shards.output)
    verify = EmbeddingVerifyOperator(task_id="verify", **COMMON, version=PROMOTED, corpus=CORPUS)

    train >> evaluate >> gate >> promote >> list_shards >> embed >> verify
