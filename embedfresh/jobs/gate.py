"""The quality gate job: ``python -m embedfresh.jobs.gate --config gate.yaml``.

Reads the candidate's per-example eval outcomes, evaluates the reference on the same
held-out examples (the production version, or the baseline before the first
promotion) with the candidate's recall@10 pool definition, refuses to compare reports
whose pool definitions differ, decides PASS / FAIL / INCONCLUSIVE with paired bootstrap intervals
(:mod:`embedfresh.ml.gate.decision`) and writes ``reports/gate.json`` with an SVG of the
intervals against the tolerance band and the Vega-Lite chart the web UI shows
(``reports/gate.vl.json``, :mod:`embedfresh.core.quality_chart`); a gate of another name
(``report_name``) writes ``reports/{report_name}.*`` instead. Anything but PASS exits with
code 3, unless ``refusal_exits=false`` in ``no_regression`` mode: then the decision is
the job's outcome (exit 0, the verdict in its summary), which is how the Airflow
operator runs it (a declined candidate is a decision, not an error). The registry is
not touched here (:mod:`embedfresh.jobs.release` moves it, only after a PASS).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from embedfresh.core import layout, quality_chart, run_index
from embedfresh.core.cli import main_for
from embedfresh.core.config import EvaluateConfig, GateConfig
from embedfresh.core.exit_codes import BadInputError, GateRefusedError
from embedfresh.core.inputs import check_version
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.evaluation import HEAD_METRICS, evaluate_version
from embedfresh.ml.gate.decision import GateResult, check_candidate, check_parameters, gate
from embedfresh.ml.gate.outcomes import load_outcomes, pool_definition
from embedfresh.ml.gate.plot import intervals_svg
from embedfresh.ml.gate.publish import publish_decision
from embedfresh.ml.model import versions

log = logging.getLogger("embedfresh.jobs.gate")


def _eval_report(store: ArtifactStore, cfg: GateConfig, name: str) -> dict[str, Any] | None:
    rel = layout.report(cfg.model, cfg.run_id, name)
    return store.read_json(rel) if store.exists(rel) else None


def run_gate(cfg: GateConfig) -> dict[str, Any]:
    """Gate the run's candidate against its reference; exit 3 unless PASS."""
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    # Every check the gate can make on its own goes before its first write (a baseline
    # published, the reference's evaluation written under the run's reports).
    check_parameters(cfg.metrics, cfg.mode, cfg.tolerance)
    registry = Registry(store, cfg.model)
    production = registry.production_version()  # a corrupted registry is refused here
    candidate = _eval_report(store, cfg, cfg.eval_report)
    if candidate is None or candidate.get("version") != cfg.candidate_version:
        raise BadInputError(
            f"no eval report for version {cfg.candidate_version} in run {cfg.run_id} "
            f"(reports/{cfg.eval_report}.json): run the evaluate job first (its report_name "
            "is the gate's eval_report)"
        )
    if candidate.get("dataset") != cfg.dataset:
        raise BadInputError(
            f"the eval report of run {cfg.run_id} is on data set {candidate.get('dataset')!r}, "
            f"the gate asks for {cfg.dataset!r}: evaluate the candidate on {cfg.dataset!r} first"
        )
    cand_outcomes = load_outcomes(store, candidate)
    check_candidate(cand_outcomes, cfg.metrics)

    if cfg.reference == "production":
        if production is not None:
            ref_version, source = production, "production"
        else:
            ref_version, source = cfg.baseline, "baseline"
    else:
        ref_version, source = cfg.reference, "pinned"
        check_version(store, cfg.model, ref_version)
    # A reference whose relevance head never trained says nothing through the head's
    # metrics (a seeded random init): the gate compares what it can be measured on.
    untrained = untrained_head(store, cfg.model, ref_version, source)
    metrics, skipped = comparable_metrics(cfg.metrics, untrained, ref_version)
    if source == "baseline":
        versions.ensure_baseline(store, cfg.model, cfg.baseline, cfg.seed)

    reference = _eval_report(store, cfg, cfg.reference_report)
    if (
        reference is None
        or reference.get("version") != ref_version
        or reference.get("dataset") != cfg.dataset
    ):
        log.info(
            "evaluating the reference, %s version %s (%s), on %s: no evaluation of it "
            "under this run yet (%s.json)",
            cfg.model, ref_version, source, cfg.dataset, cfg.reference_report,
        )  # fmt: skip
        reference, _ = evaluate_version(
            EvaluateConfig(
                artifact_root=cfg.artifact_root,
                model=cfg.model,
                run_id=cfg.run_id,
                backend=cfg.backend,
                dataset=cfg.dataset,
                version=ref_version,
                batch_size=cfg.batch_size,
                report_name=cfg.reference_report,
                recall_pool=pool_definition(candidate)["size"],
            )
        )
    if reference.get("dataset") != candidate.get("dataset"):
        raise BadInputError("candidate and reference were evaluated on different data sets")
    cand_pool, ref_pool = pool_definition(candidate), pool_definition(reference)
    if cand_pool != ref_pool:
        raise BadInputError(
            f"recall@10 pools differ: the candidate's eval report used {cand_pool}, the "
            f"reference's ({cfg.reference_report}.json, version {ref_version}) {ref_pool}; their "
            "per-query outcomes are not paired. Evaluate the candidate again with the "
            f"reference's recall_pool, or remove {cfg.reference_report}.json so the gate "
            "evaluates the reference with the candidate's"
        )

    result: GateResult = gate(
        cand_outcomes,
        load_outcomes(store, reference),
        metrics,
        cfg.mode,
        cfg.tolerance,
        cfg.resamples,
        cfg.confidence,
        cfg.seed,
    )
    details = {
        "candidate": {"version": cfg.candidate_version, "metrics": candidate["metrics"]},
        "reference": {
            "version": ref_version,
            "source": source,
            "metrics": reference["metrics"],
        },
        # The production version this decision was made against: promotion is a
        # compare-and-swap on it, so a decision against a stale production cannot win.
        "production_at_decision": production,
        # Metrics of the config not compared, and why (a reference's untrained head).
        "metrics_not_compared": skipped,
        "n_examples": candidate["n_examples"],
        "n_queries": candidate["n_queries"],
        "recall_pool": cand_pool,
        "curve": [{"step": "final", **result.to_dict()}],
    }
    # The chart the web UI shows, written before gate.json (the decision stays the last
    # write): a Vega-Lite spec built from the same numbers.
    chart_rel = layout.gate_chart(cfg.model, cfg.run_id, cfg.report_name)
    store.write_json(chart_rel, quality_chart.gate_chart_spec({**result.to_dict(), **details}))
    details["chart"] = store.url(chart_rel)
    report_url = publish_decision(
        store,
        cfg.model,
        cfg.run_id,
        intervals_svg(result),
        result.to_dict(),
        details,
        started,
        name=cfg.report_name,
    )
    run_index.record(store, cfg.model, cfg.run_id)  # derived data: never fails the gate
    log.info("gate %s: %s (report %s)", result.verdict, result.reason, report_url)
    if skipped:
        log.warning(
            "gate %s on %s only: %s not compared (the reference's head was never trained)",
            result.verdict, ", ".join(metrics), ", ".join(skipped),
        )  # fmt: skip
    if not result.passed and (cfg.refusal_exits or cfg.mode == "parity"):
        raise GateRefusedError(
            f"{result.reason} (candidate {cfg.candidate_version} vs "
            f"{source} {ref_version}; report {report_url})"
        )
    if not result.passed:
        log.warning(
            "gate %s: candidate %s is not released; the decision is the outcome (exit 0)",
            result.verdict, cfg.candidate_version,
        )  # fmt: skip
    return decision_summary(
        cfg, {**result.to_dict(), "metrics_not_compared": skipped}, ref_version, report_url
    )


def untrained_head(store: ArtifactStore, model: str, version: str, source: str) -> str | None:
    """Why ``version``'s relevance head was never trained, or None when a training run
    trained it: the baseline (the config's base weights) and a version published from a
    model directory (``publish_model``) carry a seeded random head."""
    baseline = f"{version} is the baseline: the base weights with a seeded random relevance head"
    if source == "baseline":
        return baseline
    meta = versions.version_meta(store, model, version)
    if meta.get("baseline"):
        return baseline
    if meta.get("base"):
        return (
            f"{version} was published from {meta.get('source')} by publish_model with a "
            "seeded random relevance head that no training run has trained"
        )
    return None


def comparable_metrics(
    metrics: list[str], untrained: str | None, reference: str
) -> tuple[list[str], dict[str, str]]:
    """The gate's metrics that compare the candidate with this reference, and those left
    out with why: against an ``untrained`` head, only the retrieval metrics.

    :raises BadInputError: nothing is left to compare (exit 2, before any write).
    """
    if untrained is None:
        return list(metrics), {}
    kept = [m for m in metrics if m not in HEAD_METRICS]
    skipped = {m: untrained for m in metrics if m in HEAD_METRICS}
    if not kept:
        raise BadInputError(
            f"the gate's metrics {metrics} are all relevance-head metrics, and the "
            f"reference's head was never trained ({untrained}): a PASS would say nothing. "
            f"Gate on a retrieval metric too (--set 'metrics=[\"recall_at_10\"]'), or "
            "against a trained version (--set reference=<version>)"
        )
    if skipped:
        log.warning(
            "gate: %s not compared against reference %s, whose relevance head was never "
            "trained (%s); the decision rests on %s",
            ", ".join(skipped), reference, untrained, ", ".join(kept),
        )  # fmt: skip
    return kept, skipped


#: The fields of each metric's decision that the summary (the task's XCom) carries.
METRIC_FIELDS = (
    "metric",
    "verdict",
    "d",
    "ci_low",
    "ci_high",
    "confidence",
    "n",
    "m_cand",
    "m_ref",
)


def decision_summary(
    cfg: GateConfig, decision: dict[str, Any], reference: str, report_url: str
) -> dict[str, Any]:
    """What the gate returns (its XCom): the decision, why, what it compared, and each
    metric's relative difference ``d`` with its interval (docs/ARCHITECTURE.md)."""
    return {
        "verdict": str(decision["verdict"]),
        "mode": cfg.mode,
        "reason": decision["reason"],
        "model": cfg.model,
        "run_id": cfg.run_id,
        "candidate": cfg.candidate_version,
        "reference": reference,
        "tolerance": cfg.tolerance,
        "metrics": [{k: m.get(k) for k in METRIC_FIELDS} for m in decision["metrics"]],
        "metrics_not_compared": decision.get("metrics_not_compared", {}),
        "report": report_url,
    }


if __name__ == "__main__":
    main_for("gate", GateConfig, run_gate)
