"""Daily garbage collection: what no kept release references is deleted.

A refresh a day leaves a day's embedding sets, index tables and model versions behind;
``embedfresh_garbage_collection`` keeps what the last ``$EMBEDFRESH_KEEP_RELEASES``
releases (default 3, the live one included) reference, exactly what a rollback can
reach, and deletes the rest: index tables no kept release names, embedding sets of
versions no kept release is of, and the model versions of releases past retention.
Nothing written within ``grace_hours`` is touched, nor anything of a run that holds a
live lease (a refresh writing it now). ``dry_run`` lists without deleting; the job's
report (``runs/<model>/<run id>/reports/gc.json``) says what went and what was spared.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from embedfresh.operators import GarbageCollectOperator
from embedfresh.operators.notify import notifiers
from embedfresh.operators.params import INDEX_ARGS, artifact_root_param, model_param
from embedfresh.operators.resources import task_resources

with DAG(
    "embedfresh_garbage_collection",
    description="Delete the embeddings, index tables and versions no kept release references",
    doc_md=__doc__,
    schedule="@daily",
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": dt.timedelta(minutes=5)},
    params={
        "artifact_root": artifact_root_param(),
        "model": model_param(),
        "grace_hours": Param(
            24, type="number", minimum=0, description="Nothing newer than this is deleted"
        ),
        "dry_run": Param(False, type="boolean", description="List what would go; delete nothing"),
    },
    tags=["embedfresh", "maintenance"],
    on_failure_callback=notifiers("run_failed"),
):
    GarbageCollectOperator(
        task_id="collect",
        artifact_root="{{ params.artifact_root }}",
        model="{{ params.model }}",
        grace_hours="{{ params.grace_hours }}",
        dry_run="{{ params.dry_run }}",
        **INDEX_ARGS,
        **task_resources("garbage_collect"),
    )
