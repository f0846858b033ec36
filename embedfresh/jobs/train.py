"""Incremental training: ``python -m embedfresh.jobs.train --config train.yaml``.

Starts from the production model (or the config's base weights), trains on the data
interval's partitions, checkpoints every N steps and resumes bit-exactly from the
newest committed checkpoint of its run id, then writes
``runs/{model}/{run_id}/reports/train.json`` and publishes a model version (its COMMIT
last: a version that exists always has its report). The pieces live in
:mod:`embedfresh.ml.training`; this module tells the story.
"""

from __future__ import annotations

import logging
from typing import Any

from embedfresh.core import layout
from embedfresh.core.cli import main_for
from embedfresh.core.config import TrainConfig
from embedfresh.core.freshness import sizing_line
from embedfresh.core.partitions import partition_days
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.training import TrainingRun

log = logging.getLogger("embedfresh.jobs.train")

#: The summary printed on stdout: these fields of the report, and its URL.
SUMMARY_KEYS = (
    "status",
    "version",
    "version_url",
    "steps",
    "final_loss",
    "samples_per_second",
    "wall_seconds",
    "resumed_from",
    "init",
    "compiles_after_warmup",
    "seconds_to_first_step",
    "compute_hours",
    "estimated_cost_usd",
)


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train incrementally on one data interval and publish a model version."""
    cfg = settle_day(cfg)
    sizing = sizing_line(ArtifactStore(cfg.artifact_root), cfg.model)
    if sizing:  # before training: whether the gate can decide a day that changes little
        log.info("gate sizing: %s", sizing)
    # Store, backend, data and plan: every check passes before the first write; leaving
    # the block, normally or by an error, leaves the process group.
    with TrainingRun.open(cfg) as run:
        published = run.published_report()
        if published is not None:  # a retry after the version was published
            return summary(published, run.report_url)
        # Start weights (cfg.init) or the newest valid checkpoint, then the loop.
        fitted = run.fit()
        weights = run.final_weights(fitted)  # every rank: a sharded model gathers to rank 0
        if not run.backend.is_main:  # rank 0 alone publishes the version and the report
            return {"status": "ok", "rank": run.backend.rank, "steps": run.plan.total}
        # The report goes first: the version's COMMIT is the run's last write, so a run
        # killed between the two is finished by a plain re-run (it resumes and publishes).
        report = run.report(fitted, run.version_url)
        run.store.write_json(run.report_rel, report)
        run.publish(fitted, weights)
        return summary(report, run.report_url)


def settle_day(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its data interval checked against the store's partitions; no
    interval given: the newest partition, read now (a manual run's empty ``day``)."""
    store = ArtifactStore(cfg.artifact_root)
    where = store.url(layout.train_partitions(cfg.dataset))
    return cfg.with_day(partition_days(store, cfg.dataset), where)


def summary(report: dict[str, Any], url: str) -> dict[str, Any]:
    """The job's one-line stdout summary of a train report stored at ``url``."""
    return {**{k: report.get(k) for k in SUMMARY_KEYS}, "report": url}


if __name__ == "__main__":
    main_for("train", TrainConfig, train)
