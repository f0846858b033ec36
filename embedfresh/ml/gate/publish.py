"""Publishing a gate decision: its plot and ``reports/{name}.json`` (``gate.json`` by default)."""

from __future__ import annotations

import datetime as dt
import os
import time
from typing import Any

from embedfresh.core import layout
from embedfresh.core.storage import ArtifactStore


def publish_decision(
    store: ArtifactStore,
    model: str,
    run_id: str,
    svg: str,
    decision: dict[str, Any],
    details: dict[str, Any],
    started: float,
    name: str = "gate",
) -> str:
    """Write a gate decision's plot and ``reports/{name}.json``; return the report's URL.

    Shared by the quality gate and the backend parity job, so every decision carries the
    same identification (model, run, DAG, time) that the web UI lists and links.
    """
    base = layout.reports(model, run_id)
    svg_rel = f"{base}/{layout.safe_id(name, 'report kind')}.svg"
    store.write_bytes(svg_rel, svg.encode())
    report = {
        **decision,
        "model": model,
        "run_id": run_id,
        # Set by Airflow's task runner in the environment the local runner passes on:
        # lets the web UI link the decision to its DAG run.
        "dag_id": os.environ.get("AIRFLOW_CTX_DAG_ID"),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **details,
        "plot": store.url(svg_rel),
        "wall_seconds": round(time.perf_counter() - started, 3),
    }
    report_rel = layout.report(model, run_id, name)
    store.write_json(report_rel, report)
    return store.url(report_rel)
