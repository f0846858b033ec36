"""Promotion: ``python -m embedfresh.jobs.promote --config promote.yaml``.

Moves the registry's production pointer to the run's candidate, only if the run's
``gate.json`` says PASS, by compare-and-swap on the production version the gate
decided against. Two concurrent runs can never both win: the loser gets a conflict
error (exit 2) and the registry keeps the winner.
"""

from __future__ import annotations

from typing import Any

from embedfresh.core import layout
from embedfresh.core.cli import main_for
from embedfresh.core.config import PromoteConfig
from embedfresh.core.exit_codes import BadInputError, GateRefusedError
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore


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
    doc = registry.promote(
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
    return {"production": doc["production"]["version"], "registry": registry.url}


if __name__ == "__main__":
    main_for("promote", PromoteConfig, promote)
