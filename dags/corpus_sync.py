"""The live index follows its corpus: each change set that lands is applied to the live
release's table, between releases.

Runs when a corpus's Asset ``embedfresh://corpora/<corpus>`` is updated, and after each
release of the default model that carries the corpus (``embedfresh://embeddings/<model>/
<corpus>``: the new release's table catches up with what landed after its load). The data
producer lands a change set (``corpora/<corpus>/changes/<name>.parquet``: ``op``
upsert/delete, ``id``, ``text``) and then posts an Asset event (REST
``POST /api/v2/assets/events``, or an SQS ``AssetWatcher`` on AWS: docs/SEARCH.md
"Corpus changes"). One task per corpus of ``EMBEDFRESH_SYNC_CORPORA`` (default
``products``) embeds the upserted texts with the live release's own encoder and applies
upserts and deletes to its table, one transaction per change set, recorded in a ledger:
a re-run applies only what is missing. The sync record
``models/<model>/sync/<release>/<corpus>.json`` says which change sets the table holds.
"""

from __future__ import annotations

import datetime as dt
import re

from airflow.sdk import DAG, AssetAny

from embedfresh.operators import CorpusSyncOperator, corpus_asset, embeddings_asset
from embedfresh.operators.notify import notifiers
from embedfresh.operators.params import (
    DEFAULT_MODEL,
    INDEX_ARGS,
    artifact_root_param,
    model_param,
    synced_corpora,
)
from embedfresh.operators.resources import task_resources

CORPORA = synced_corpora()

with DAG(
    "corpus_sync",
    description="Apply a corpus's change sets to the live release's table",
    doc_md=__doc__,
    # A landing, or a release of the default model carrying the corpus (its new table
    # catches up with the change sets that landed after its load).
    schedule=AssetAny(
        *(corpus_asset(c) for c in CORPORA),
        *(embeddings_asset(DEFAULT_MODEL, c) for c in CORPORA),
    ),
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=1)},
    params={"artifact_root": artifact_root_param(), "model": model_param()},
    tags=["embedfresh", "search"],
    on_failure_callback=notifiers("run_failed"),
):
    for corpus in CORPORA:
        CorpusSyncOperator(
            task_id="sync_" + re.sub(r"[^A-Za-z0-9_.-]", "_", corpus),
            artifact_root="{{ params.artifact_root }}",
            model="{{ params.model }}",
            corpus=corpus,
            **INDEX_ARGS,
            **task_resources("corpus_sync"),
        )
