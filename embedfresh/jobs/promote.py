"""Promotion: ``python -m embedfresh.jobs.promote --config promote.yaml``.

Moves the registry's production pointer to the run's candidate, only if the run's
``gate.json`` says PASS, by compare-and-swap on the production version the gate
decided against. Two concurrent runs can never both win: the loser gets a conflict
error (exit 2) and the registry keeps the winner. Before the pointer moves, every file
of the candidate is verified, streamed, against its COMMIT marker: a damaged version is
refused (exit 2) and production stays. Promoting again a version this run already
promoted (a retry after a lost worker) writes nothing and exits 0 with ``"already":
true``.
"""

from __future__ import annotations

import logging
from typing import Any

from embedfresh.core import layout, run_index
from embedfresh.core.cli import main_for
from embedfresh.core.config import PromoteConfig
from embedfresh.core.exit_codes import BadInputError, GateRefusedError
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger(__name__)


def promote(cfg: PromoteConfig) -> dict[str, Any]:
    """Promote the run's candidate after a PASS from its quality gate."""
    store = ArtifactStore(cfg.artifact_root)
    rel = layout.report(cfg.model, cfg.run_id, "gate")
    if not store.exists(rel):
        raise BadInputError(f"no gate report {store.url(rel)}: run the gate job first")
    decision = store.read_json(rel)
    if not isinstance(decision, dict):
        raise BadInputError(f"gate report {store.url(rel)} is not a JSON object")
    verdict = decision.get("verdict")
    if verdict != "PASS":
        raise GateRefusedError(
            f"gate verdict is {verdict} for run {cfg.run_id}: production stays as it is"
        )
    try:
        candidate = decision["candidate"]["version"]
        reference = decision["reference"]["version"]
        metrics = {m["metric"]: m.get("d") for m in decision.get("metrics", [])}
    except (KeyError, TypeError, AttributeError) as e:
        raise BadInputError(f"gate report {store.url(rel)} is malformed ({e!r})") from e
    registry = Registry(store, cfg.model)
    move = registry.promote(
        candidate,
        expected_previous=decision.get("production_at_decision"),
        decision={
            "run_id": cfg.run_id,
            "verdict": verdict,
            "mode": decision.get("mode"),
            "reference": reference,
            "d": metrics,
            "gate_report": store.url(rel),
        },
    )
    if move.already:
        log.info(
            "%s is already production of %s, promoted by this run (%s) at %s: nothing to do",
            candidate,
            cfg.model,
            cfg.run_id,
            move.doc["production"].get("promoted_at"),
        )
    else:
        log.info("production of %s moved from %s to %s", cfg.model, move.previous, candidate)
    run_index.record(store, cfg.model, cfg.run_id)  # derived data: never fails the move
    return move.summary(registry.url)


if __name__ == "__main__":
    main_for("promote", PromoteConfig, promote)
