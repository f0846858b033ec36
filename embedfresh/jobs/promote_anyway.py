"""Promote anyway: ``python -m embedfresh.jobs.promote_anyway --config promote_anyway.yaml``.

A person's override of the quality gate: moves the registry's production pointer to
``version`` although no gate passed it (a FAIL the team accepts, a version gated on
another dataset, an emergency fix). It is the one exception to "only PASS promotes",
so it needs a ``reason``, and the history records ``action: promote_anyway`` with
``who``, ``why``, the previous version and the time. Everything else is a promotion's:
every file of the version is verified, streamed, against its COMMIT marker before the
pointer moves (a damaged or uncommitted version: exit 2, production stays), and the
pointer moves by the same compare-and-swap. A retry of the run that did it writes
nothing and exits 0 with ``"already": true``; a version that already is production is
refused (exit 2: nothing to override).

In Airflow this is a run of the ``embedfresh_promote_anyway`` DAG
(``dags/model_overrides.py``), so who may do it is who may trigger that DAG, and the
user who triggered the run is recorded as ``who``.
"""

from __future__ import annotations

import logging
from typing import Any

from embedfresh.core import run_index
from embedfresh.core.cli import main_for
from embedfresh.core.config import PromoteAnywayConfig
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger(__name__)


def promote_anyway(cfg: PromoteAnywayConfig) -> dict[str, Any]:
    """Make ``cfg.version`` production of ``cfg.model`` without a gate's PASS."""
    store = ArtifactStore(cfg.artifact_root)
    registry = Registry(store, cfg.model)
    move = registry.promote_anyway(
        cfg.version, who=cfg.who, why=cfg.reason, details={"run_id": cfg.run_id}
    )
    if move.already:
        log.info(
            "%s is already production of %s, promoted anyway by this run (%s): nothing to do",
            cfg.version,
            cfg.model,
            cfg.run_id,
        )
    else:
        log.warning(
            "production of %s moved from %s to %s WITHOUT a gate's PASS, by %s: %s",
            cfg.model,
            move.previous,
            cfg.version,
            cfg.who,
            cfg.reason,
        )
    run_index.record(store, cfg.model, cfg.run_id)  # derived data: never fails the move
    return {**move.summary(registry.url), "who": cfg.who, "why": cfg.reason}


if __name__ == "__main__":
    main_for("promote_anyway", PromoteAnywayConfig, promote_anyway)
