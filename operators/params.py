"""The Params every embedfresh DAG offers, with defaults that run the embedded demo on CPU.

DAG files build their ``params`` from these helpers so the Trigger form in the web UI
shows the same names, choices and descriptions everywhere, and works untouched on a
fresh checkout (local artifact store, ``tiny`` model, ``cpu``).
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping
from typing import Any

from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowFailException

from embedfresh.core.settings import BACKENDS, MODEL_PRESETS, default_artifact_root

MODELS = list(MODEL_PRESETS)
DEFAULT_MODEL = "tiny"

#: Task arguments every job operator takes from the Params above.
COMMON_JOB_ARGS = {
    "artifact_root": "{{ params.artifact_root }}",
    "model": "{{ params.model }}",
    "backend": "{{ params.backend }}",
}


#: A ``day`` Param's value when it is a string: a ``YYYY-MM-DD`` date, or empty.
DAY_PATTERN = r"^(\d{4}-\d{2}-\d{2})?$"

#: The task argument of operators that read a training partition
#: (:class:`~embedfresh.operators.IncrementalTrainingOperator` and its kin). ``or ''``:
#: the Param's default (None) renders as empty, never as the string ``"None"``.
DAY_ARG = {"day": "{{ params.day or '' }}"}

#: Run types whose data interval never names the training partition: Airflow gives a
#: manual run (the Trigger form, a REST trigger, ``dag.test()``) the data interval
#: ending at its logical date, which the form sets to *now*: a day the store does not
#: hold yet.
MANUAL_RUN_TYPES = frozenset({"manual"})


def day_param() -> Param:
    """The training partition a run reads. Empty (None, the default, or ""): a scheduled
    or backfill run's own data interval; a manual run's newest ``dt=`` partition in the
    store, looked up by the job when it starts, never when the DAG file is parsed.

    None rather than "" as the default: the Trigger form takes an empty string field of a
    ``string`` Param for a missing required value and will not submit. ``pattern``
    applies to strings only, so None passes and "" (REST callers) still does.
    """
    return Param(
        None,
        type=["null", "string"],
        pattern=DAY_PATTERN,
        description="Training partition dt=YYYY-MM-DD; empty: a scheduled run's data "
        "interval, a manual run's newest partition in the store (read when the run starts)",
    )


def parse_day(value: Any, name: str = "day") -> dt.date | None:
    """A ``YYYY-MM-DD`` value as a date; empty or None: None.

    :raises AirflowFailException: anything else (``2026-1-3``, ``20260103``,
        ``2026-02-30``): a bad setting never passes on a retry.
    """
    if value is None or value == "":
        return None
    text = str(value).strip()
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        try:
            return dt.date.fromisoformat(text)
        except ValueError:
            pass
    raise AirflowFailException(
        f"{name} must be a date YYYY-MM-DD (empty: the newest partition), got {value!r}"
    )


def run_data_interval(context: Mapping[str, Any]) -> tuple[dt.date, dt.date] | None:
    """The run's own data interval as days, for a run that has one to give: a scheduled or
    backfill run with a non-empty interval.

    None for a manual run (:data:`MANUAL_RUN_TYPES`, read from ``context["dag_run"]``),
    whatever its logical date: its interval ends at the moment it was triggered, not at
    a day of data; None too for a run without data interval or an empty one
    (start == end). A context without a run type (a task called outside a run) counts
    as scheduled.
    """
    if run_type(context) in MANUAL_RUN_TYPES:
        return None
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None or not end > start:
        return None
    first, last = _utc_day(start), _utc_day(end)
    return (first, last) if last > first else None


def run_type(context: Mapping[str, Any]) -> str | None:
    """``context["dag_run"].run_type`` as a plain string (``"manual"``, ``"scheduled"``,
    ``"backfill"``, ...), or None when the context has no run."""
    run = context.get("dag_run")
    kind = run.get("run_type") if isinstance(run, Mapping) else getattr(run, "run_type", None)
    if kind is None:
        return None
    return str(getattr(kind, "value", kind))


def _utc_day(value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
        return value.date()
    return dt.date.fromisoformat(str(value)[:10])


def artifact_root_param() -> Param:
    """The store root; its default (:func:`~embedfresh.core.settings.default_artifact_root`)
    is read when the DAG file is parsed."""
    return Param(
        default_artifact_root(),
        type="string",
        description="Artifact store root URL: file:///... or s3://bucket/prefix",
    )


def model_param() -> Param:
    return Param(
        DEFAULT_MODEL,
        type="string",
        examples=MODELS,
        pattern=r"^[A-Za-z0-9._:+=-]{1,200}$",
        description="Model name: a preset (tiny, minilm) or your own model, published with "
        "python -m embedfresh.jobs.publish_model",
    )


def dataset_param() -> Param:
    """The data set a run trains and is judged on (``datasets/<name>/``): its training
    partitions, eval split and judgments (docs/DATA.md)."""
    return Param(
        "products",
        type="string",
        pattern=r"^[A-Za-z0-9._:+=-]{1,200}$",
        description="Data set trained on and judged by (datasets/<name>/): training "
        "partitions, judgments, eval split (docs/DATA.md)",
    )


def corpora_param() -> Param:
    """The corpora a release carries: each is embedded with the candidate, loaded into the
    vector index and search-checked before the release goes live."""
    return Param(
        ["products"],
        type="array",
        items={"type": "string", "pattern": r"^[A-Za-z0-9._:+=-]{1,200}$"},
        minItems=1,
        uniqueItems=True,
        description="Corpora released with the model (corpora/<name>/): embedded, loaded "
        "into the vector index and search-checked before the release goes live",
    )


def drop_corpora_param() -> Param:
    """Corpora of the live release that this release no longer carries: their live views
    are dropped. A release that leaves out a live corpus without naming it here is
    refused before it writes anything."""
    return Param(
        [],
        type="array",
        items={"type": "string", "pattern": r"^[A-Za-z0-9._:+=-]{1,200}$"},
        uniqueItems=True,
        description="Corpora of the live release this release stops carrying (their live "
        "views are dropped); a live corpus left out of `corpora` and not named here refuses "
        "the release",
    )


def synced_corpora() -> list[str]:
    """The corpora ``corpus_sync`` follows (``EMBEDFRESH_SYNC_CORPORA``, comma-separated;
    default ``products``), read when the DAG file is parsed: one Asset and one task each."""
    raw = os.environ.get("EMBEDFRESH_SYNC_CORPORA", "").strip() or "products"
    names = [n.strip() for n in raw.split(",") if n.strip()]
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9._:+=-]{1,200}", n)]
    if bad:
        raise ValueError(f"EMBEDFRESH_SYNC_CORPORA names invalid corpora {bad}: {raw!r}")
    return list(dict.fromkeys(names))


#: The vector index's Airflow connection, a deployment setting read when a DAG file is
#: parsed (``EMBEDFRESH_INDEX_CONN_ID``): a PostgreSQL with pgvector. Unset: the worker's
#: ``EMBEDFRESH_INDEX_DSN``, else the embedded server (docs/SEARCH.md).
INDEX_ARGS = {"index_conn_id": os.environ.get("EMBEDFRESH_INDEX_CONN_ID") or None}


def gate_metrics_param() -> Param:
    """The metrics that must all pass the quality gate; default: the gate job's own."""
    from embedfresh.core.config import GateConfig

    return Param(
        GateConfig.model_fields["metrics"].default_factory(),
        type="array",
        items={"type": "string"},
        minItems=1,
        description="Metrics that must all pass the quality gate (accuracy, auc, log_loss, "
        "recall_at_10): the ones your model is judged by",
    )


def backend_param(default: str = "cpu", description: str = "Accelerator backend") -> Param:
    return Param(default, enum=list(BACKENDS), description=description)


def common_params() -> dict[str, Param]:
    """``artifact_root``, ``model`` and ``backend``: what :data:`COMMON_JOB_ARGS` reads."""
    return {
        "artifact_root": artifact_root_param(),
        "model": model_param(),
        "backend": backend_param(),
    }
