"""Freshness: how old production is, and what held it there.

A pipeline that never releases fails its users as surely as one that releases a worse
model. Production's **age** is the days of data it has not trained on: from the end of
the newest data the live release's model trained on (its training run's data interval)
to the end of the data the newest refresh trained on (or, before any, the newest
partition in the store). A refresh that releases brings it back to 0. Past
``stale_after`` days the refresh's ``freshness`` task tells people
(``operators/notify.py``, event ``stale``), naming the decisions that held production:
each run since the live release that did not release, with its gate's and search
checks' verdicts and reasons. Torch-free; the web UI shows the same age.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from typing import Any

from embedfresh.core import layout
from embedfresh.core.partitions import partition_days
from embedfresh.core.registry import Registry
from embedfresh.core.run_index import list_run_ids
from embedfresh.core.storage import ArtifactStore

#: Days of data production may lack before people are told; a deployment setting.
STALE_ENV = "EMBEDFRESH_STALE_AFTER_DAYS"
DEFAULT_STALE_AFTER_DAYS = 3


def stale_after_days(environ: Mapping[str, str] | None = None) -> int:
    """The setting's days (default 3).

    :raises ValueError: not a whole number of days >= 1.
    """
    raw = (environ if environ is not None else os.environ).get(STALE_ENV, "").strip()
    if not raw:
        return DEFAULT_STALE_AFTER_DAYS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{STALE_ENV} must be a whole number of days >= 1, got {raw!r}")
    return int(raw)


def trained_through(store: ArtifactStore, model: str, run_id: str) -> dt.date | None:
    """The end (exclusive) of the data interval run ``run_id`` trained on; None when it
    trained on none (a published base version) or its report is gone."""
    rel = layout.report(model, run_id, "train")
    if not store.exists(rel):
        return None
    interval = store.read_json(rel).get("data_interval")
    if not isinstance(interval, list) or len(interval) != 2:
        return None
    return dt.date.fromisoformat(str(interval[1]))


def production_age(
    store: ArtifactStore,
    model: str,
    version: str | None,
    run_id: str | None = None,
    dataset: str = "products",
) -> tuple[dt.date | None, dt.date | None, int | None]:
    """What production's ``version`` trained through, the newest data (what ``run_id``
    trained through, else the newest partition's end), and the days between them."""
    trained = trained_through(store, model, version) if version else None
    newest = trained_through(store, model, run_id) if run_id else None
    if newest is None:
        days = partition_days(store, dataset)
        newest = max(days) + dt.timedelta(days=1) if days else None
    age = (newest - trained).days if trained and newest else None
    return trained, newest, age


def freshness(
    store: ArtifactStore,
    model: str,
    run_id: str | None,
    dataset: str = "products",
    stale_after: int = DEFAULT_STALE_AFTER_DAYS,
) -> dict[str, Any]:
    """Production's age against what run ``run_id`` trained on (else the newest
    partition), whether that is stale, and the runs since the live release that did not
    release (``held_by``: their gate's and search checks' verdicts and reasons)."""
    doc, _ = Registry(store, model).read()
    production = (doc or {}).get("production") or {}
    version = production.get("version")
    trained, newest, age = production_age(store, model, version, run_id, dataset)
    since = production.get("promoted_at")
    held_by = [] if age in (None, 0) else _held_by(store, model, version, since)
    return {
        "model": model,
        "production": version,
        "release": production.get("release"),
        "trained_through": trained.isoformat() if trained else None,
        "newest_data": newest.isoformat() if newest else None,
        "age_days": age,
        "stale_after_days": stale_after,
        "stale": age is not None and age >= stale_after,
        "held_by": held_by,
    }


def _held_by(
    store: ArtifactStore, model: str, version: str | None, since: str | None
) -> list[dict[str, Any]]:
    """Runs newer than the live release's move that made no release: what decided."""
    out = []
    for run_id in sorted(list_run_ids(store, model)):
        gate_rel = layout.report(model, run_id, "gate")
        if run_id == version or not store.exists(gate_rel):
            continue
        gate = store.read_json(gate_rel)
        created = str(gate.get("created_at") or "")
        if since and created and created <= since:
            continue
        if store.exists(layout.release(model, run_id)):
            continue
        checks = {
            name[len("search-") : -len(".json")]: store.read_json(
                f"{layout.reports(model, run_id)}/{name}"
            )
            for name in store.listdir(layout.reports(model, run_id))
            if name.startswith("search-") and name.endswith(".json")
        }
        out.append(
            {
                "run_id": run_id,
                "gate": gate.get("verdict"),
                "reason": gate.get("reason"),
                "n_queries": gate.get("n_queries"),
                "search_checks": {
                    c: [d.get("verdict"), d.get("reason")] for c, d in checks.items()
                },
                "decided_at": created or None,
            }
        )
    return out


def sizing_line(store: ArtifactStore, model: str) -> str | None:
    """What production's own gate decision says of the eval pool, in words: how many
    judged queries would decide a refresh that changes nothing at the margin, and
    whether the pool holds them (its ``sizing``); None before any such decision."""
    doc, _ = Registry(store, model).read()
    run_id = ((doc or {}).get("production") or {}).get("run_id")
    rel = layout.report(model, run_id, "gate") if run_id else None
    if rel is None or not store.exists(rel):
        return None
    decision = store.read_json(rel)
    if (decision.get("reference") or {}).get("source") == "baseline":
        return None  # against untrained weights: says nothing of two refreshes' spread
    lines = []
    for s in decision.get("sizing") or []:
        verdict = "can" if s.get("resolves_no_change") else "cannot"
        lines.append(
            f"{s['metric']}: a refresh that changes nothing needs about "
            f"{s['n_for_no_change']:,} judged queries to decide at the margin; the pool of "
            f"{s['pool']:,} {verdict} (production's decision, run {run_id}, {s['n']:,} queries)"
        )
    return "; ".join(lines) or None
