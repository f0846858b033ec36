"""The refresh's time budget: an Airflow Deadline Alert whose callback records the breach.

A run of ``embedding_model_refresh`` must finish within an interval of being queued
(``DeadlineReference.DAGRUN_QUEUED_AT``). Airflow 3.3 computes the deadline when the run
is queued and takes the interval as a fixed ``timedelta`` or a ``VariableInterval``; it
does not render templates, so the interval cannot come from a Param. It comes from the
environment variable ``EMBEDFRESH_REFRESH_DEADLINE_SECONDS`` read when the DAG file is
parsed (default :data:`DEFAULT_DEADLINE_SECONDS`, 6 hours). A ``VariableInterval`` was
not used: with the Variable missing, Airflow fails to create the run at all.

When the scheduler sees the deadline pass before the run ended, it queues
:func:`record_deadline_breach` on the executor (a ``SyncCallback``: the executor must
support callbacks, as Airflow 3.3.2's LocalExecutor used here and in docker-compose.yaml
does). The breach then shows in four places: Airflow's own
Deadlines view of the run (the ``deadline`` row marked missed), a WARNING line in the
callback's log, ``runs/<model>/<run_id>/reports/deadline.json`` in the artifact store
beside the run's other reports, which the pipeline's own pages and tools read, and the
deployment's e-mail and webhook (:mod:`embedfresh.operators.notify`), when configured.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from airflow.sdk import DeadlineAlert, DeadlineReference, SyncCallback

from embedfresh.operators.params import DEFAULT_MODEL, default_artifact_root
from embedfresh.operators.resources import env_seconds

log = logging.getLogger(__name__)

#: Environment variable with the refresh run's time budget in seconds.
DEADLINE_ENV = "EMBEDFRESH_REFRESH_DEADLINE_SECONDS"
#: Six hours: a daily refresh that has not finished by then will miss its consumers.
DEFAULT_DEADLINE_SECONDS = 6 * 3600


def deadline_interval() -> dt.timedelta:
    """The budget from :data:`DEADLINE_ENV`; a clear error names the variable when bad."""
    return env_seconds(DEADLINE_ENV) or dt.timedelta(seconds=DEFAULT_DEADLINE_SECONDS)


def refresh_deadline_alert(name: str = "refresh time budget") -> DeadlineAlert:
    """A Deadline Alert on the run's queued time, calling :func:`record_deadline_breach`.

    The callback's fallback ``artifact_root`` and ``model`` are the Params' defaults at
    parse time; a run's ``conf`` overrides them (Params other than conf do not reach a
    deadline callback).
    """
    interval = deadline_interval()
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=interval,
        callback=SyncCallback(
            record_deadline_breach,
            kwargs={
                "artifact_root": default_artifact_root(),
                "model": DEFAULT_MODEL,
                "interval_seconds": interval.total_seconds(),
            },
        ),
        name=name,
    )


def record_deadline_breach(
    artifact_root: str,
    model: str,
    interval_seconds: float,
    context: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Log the breach and write ``runs/<model>/<run_id>/reports/deadline.json``.

    :param artifact_root: artifact store root when the run's conf names none.
    :param model: model name when the run's conf names none.
    :param interval_seconds: the budget the run had, from being queued.
    :param context: what Airflow passes a deadline callback: ``dag_run`` (the run as the
        REST API shows it, with ``conf``) and ``deadline`` (``id``, ``deadline_time``).
    :return: the record written.
    """
    from embedfresh.core.layout import report
    from embedfresh.core.storage import ArtifactStore

    context = context or {}
    dag_run = context.get("dag_run") or {}
    conf = dag_run.get("conf") or {}
    root = conf.get("artifact_root") or artifact_root
    model = conf.get("model") or model
    run_id = dag_run.get("run_id") or dag_run.get("dag_run_id") or "unknown-run"
    deadline = context.get("deadline") or {}
    record = {
        "dag_id": dag_run.get("dag_id"),
        "run_id": run_id,
        "state_at_breach": dag_run.get("state"),
        "queued_at": _text(dag_run.get("queued_at")),
        "deadline_time": _text(deadline.get("deadline_time")),
        "interval_seconds": interval_seconds,
        "recorded_at": dt.datetime.now(dt.UTC).isoformat(),
        "deadline_id": _text(deadline.get("id")),
    }
    store = ArtifactStore(root)
    path = report(model, run_id, "deadline")
    log.warning(
        "DEADLINE MISSED: %s run %s was still %s at its deadline %s (%.0f s after it was "
        "queued at %s); recording it in %s",
        record["dag_id"],
        run_id,
        record["state_at_breach"],
        record["deadline_time"],
        interval_seconds,
        record["queued_at"],
        store.url(path),
    )
    store.write_json(path, record)
    from embedfresh.operators.notify import notify_deadline_breach

    # People are told (the deployment's e-mail and webhook, if any); never raises.
    notify_deadline_breach(
        model=model,
        run_id=run_id,
        dag_id=record["dag_id"],
        deadline_time=record["deadline_time"],
        interval_seconds=interval_seconds,
        state=record["state_at_breach"],
        queued_at=record["queued_at"],
        record_url=store.url(path),
    )
    return record


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, dt.datetime) else str(value)
