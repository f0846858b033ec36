"""Rollback: ``python -m embedfresh.jobs.rollback --config rollback.yaml``.

Moves the registry's production pointer back to an earlier production version, by a
person's decision: ``to_version`` must be listed in the registry's history as a former
production version (otherwise exit 2, naming those that are), and every file of it is
verified, streamed, against its COMMIT marker before the pointer moves (a damaged
version: exit 2, production stays). The pointer moves by the same compare-and-swap as a
promotion, and the history records ``action: rollback`` with ``who``, ``why``, the
previous version and the time. Rolling back to the version already in production
writes nothing and exits 0 with ``"already": true``.
"""

from __future__ import annotations

import logging
from typing import Any

from embedfresh.core import run_index
from embedfresh.core.cli import main_for
from embedfresh.core.config import RollbackConfig
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger(__name__)


def rollback(cfg: RollbackConfig) -> dict[str, Any]:
    """Roll the model's production back to an earlier production version."""
    store = ArtifactStore(cfg.artifact_root)
    registry = Registry(store, cfg.model)
    move = registry.rollback(
        cfg.to_version, who=cfg.who, why=cfg.reason, details={"run_id": cfg.run_id}
    )
    if move.already:
        log.info(
            "%s is already production of %s: nothing to do (registry %s)",
            cfg.to_version,
            cfg.model,
            registry.url,
        )
    else:
        log.info(
            "production of %s rolled back from %s to %s by %s: %s",
            cfg.model,
            move.previous,
            cfg.to_version,
            cfg.who,
            cfg.reason,
        )
    run_index.record(store, cfg.model, cfg.run_id)  # derived data: never fails the move
    return {**move.summary(registry.url), "who": cfg.who, "why": cfg.reason}


if __name__ == "__main__":
    main_for("rollback", RollbackConfig, rollback)
