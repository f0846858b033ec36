"""The quality gate job: ``python -m embedfresh.jobs.gate --config gate.yaml``.

Reads the candidate's per-example eval outcomes, evaluates the reference on the same
held-out examples (the production version, or the baseline before the first
promotion) with the candidate's recall@10 pool definition, refuses to compare reports
whose pool definitions differ, decides PASS / FAIL / INCONCLUSIVE with paired bootstrap intervals
(:mod:`embedfresh.ml.gate.decision`) and writes ``reports/gate.json`` with the Vega-Lite
chart the web UI shows (``reports/gate.vl.json``, :mod:`embedfresh.core.quality_chart`)
and that chart rendered (``reports/gate.svg``, vl-convert); a gate of another name
(``report_name``) writes ``reports/{report_name}.*`` instead. Anything but PASS exits with
code 3, unless ``refusal_exits=false`` in ``no_regression`` mode: then the decision is
the job's outcome (exit 0, the verdict in its summary), which is how the Airflow
operator runs it (a declined candidate is a decision, not an error). The registry is
not touched here (:mod:`embedfresh.jobs.release` moves it, only after a PASS).
"""

from __future__ import annotations

import logging
import math
import time
from statistics import NormalDist
from typing import Any

import numpy as np

from embedfresh.core import layout, quality_chart, run_index
from embedfresh.core.cli import main_for
from embedfresh.core.config import EvaluateConfig, GateConfig
from embedfresh.core.exit_codes import BadInputError, GateRefusedError
from embedfresh.core.inputs import check_version
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.evaluation import HEAD_METRICS, VersionEval, evaluate_version
from embedfresh.ml.gate.decision import (
    GateResult,
    Verdict,
    check_candidate,
    check_parameters,
    gate,
)
from embedfresh.ml.gate.outcomes import load_outcomes
from embedfresh.ml.gate.publish import publish_decision
from embedfresh.ml.gate.sequential import plan_looks
from embedfresh.ml.gate.stats import RANKING_METRICS
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
    candidate = _candidate_report(store, cfg)
    cand_outcomes = load_outcomes(store, candidate)
    check_candidate(cand_outcomes, cfg.metrics)
    ref_version, source = _reference(store, cfg, production)
    untrained = _untrained_side(store, cfg, ref_version, source)
    metrics, skipped = comparable_metrics(cfg.metrics, untrained, ref_version)
    if source == "baseline":
        versions.ensure_baseline(store, cfg.model, cfg.baseline, cfg.seed)
    reference, ref_eval = _reference_report(store, cfg, candidate, ref_version, source)
    looks = Looks(
        cfg, candidate, cand_outcomes, load_outcomes(store, reference), ref_version, ref_eval
    )
    result = looks.decide(metrics)
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
        "n_queries": looks.n,
        "search": candidate["search"],
        "looks": looks.records,
        "sequential": SEQUENTIAL_METHOD,
        "sizing": sizing(result, looks.pool),
        "curve": [{"step": "final", **result.to_dict()}],
    }
    # The chart the web UI shows, written before gate.json (the decision stays the last
    # write): a Vega-Lite spec built from the same numbers.
    chart_rel = layout.gate_chart(cfg.model, cfg.run_id, cfg.report_name)
    spec = quality_chart.gate_chart_spec({**result.to_dict(), **details})
    store.write_json(chart_rel, spec)
    details["chart"] = store.url(chart_rel)
    report_url = publish_decision(
        store,
        cfg.model,
        cfg.run_id,
        quality_chart.render_svg(spec),
        result.to_dict(),
        details,
        started,
        name=cfg.report_name,
    )
    run_index.record(store, cfg.model, cfg.run_id)  # derived data: never fails the gate
    log.info("gate %s after %d look(s), %d queries: %s (report %s)", result.verdict,
             len(looks.records), looks.n, result.reason, report_url)  # fmt: skip
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
    summary = {**result.to_dict(), "metrics_not_compared": skipped, "n_queries": looks.n}
    return decision_summary(cfg, summary, ref_version, report_url)


def _candidate_report(store: ArtifactStore, cfg: GateConfig) -> dict[str, Any]:
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
    if not isinstance(candidate.get("search"), dict):
        raise BadInputError(
            f"the eval report of run {cfg.run_id} predates search on judgments (no 'search'): "
            "run the evaluate job again"
        )
    return candidate


def _reference(store: ArtifactStore, cfg: GateConfig, production: str | None) -> tuple[str, str]:
    """The reference version and where it comes from (production, baseline, pinned)."""
    if cfg.reference != "production":
        check_version(store, cfg.model, cfg.reference)
        return cfg.reference, "pinned"
    if production is not None:
        return production, "production"
    return cfg.baseline, "baseline"


def _reference_report(
    store: ArtifactStore, cfg: GateConfig, candidate: dict[str, Any], version: str, source: str
) -> tuple[dict[str, Any], VersionEval | None]:
    """The reference's first look on the candidate's definition (the same data set,
    corpus, judgments and queries, its own version's vectors): the run's earlier one if
    it matches (a re-run), else evaluated now. Returns it and, when evaluated here, the
    loaded evaluation (for later looks)."""
    wanted = search_definition(candidate)
    reference = _eval_report(store, cfg, cfg.reference_report)
    if (
        reference is not None
        and reference.get("version") == version
        and reference.get("dataset") == cfg.dataset
        and isinstance(reference.get("search"), dict)
        and search_definition(reference) == wanted
    ):
        return reference, None
    log.info(
        "evaluating the reference, %s version %s (%s), on %s: no evaluation of it on the "
        "candidate's definition under this run yet (%s.json)",
        cfg.model, version, source, cfg.dataset, cfg.reference_report,
    )  # fmt: skip
    reference, _, ref_eval = evaluate_version(look_config(cfg, candidate, version))
    return reference, ref_eval


def look_config(cfg: GateConfig, candidate: dict[str, Any], version: str) -> EvaluateConfig:
    """The evaluation of ``version`` on the candidate's definition
    (:func:`search_definition`): the reference's first look, and either side's later ones."""
    search = candidate["search"]
    return EvaluateConfig(
        artifact_root=cfg.artifact_root,
        model=cfg.model,
        run_id=cfg.run_id,
        backend=cfg.backend,
        dataset=cfg.dataset,
        corpus=search["corpus"],
        version=version,
        queries=candidate["n_queries"],
        batch_size=cfg.batch_size,
        report_name=cfg.reference_report,
        **search.get("embed", {}),
    )


def search_definition(report: dict[str, Any]) -> dict[str, Any]:
    """What makes two evaluations' per-query outcomes paired: the same data set, corpus,
    judgments (their pool) and queries, and the same embed settings."""
    search = report["search"]
    return {
        "dataset": report.get("dataset"),
        "corpus": search.get("corpus"),
        "complete": search.get("complete"),
        "pool": search.get("pool"),
        "n_queries": report.get("n_queries"),
        "embed": search.get("embed"),
    }


SEQUENTIAL_METHOD = (
    "group-sequential: looks at the first look's queries, then twice as many each time up "
    "to the pool (or max_queries); Lan-DeMets alpha spending, Pocock type "
    "alpha(t) = alpha ln(1 + (e - 1) t) per tail, Bonferroni over the looks (docs/GATE.md)"
)


class Looks:
    """The gate's looks at a growing evaluation (:mod:`embedfresh.ml.gate.sequential`):
    each look gates the first ``n`` queries of both sides at its own confidence; while
    the decision is open on a search metric and the pool has more, both sides are
    evaluated on more queries and the gate looks again."""

    def __init__(
        self,
        cfg: GateConfig,
        candidate: dict[str, Any],
        cand: dict[str, Any],
        ref: dict[str, Any],
        reference_version: str,
        ref_eval: VersionEval | None,
    ) -> None:
        self.cfg, self.candidate = cfg, candidate
        self.pool = int(candidate["search"]["pool"])
        self.n = int(candidate["n_queries"])
        n_max = max(self.n, min(self.pool, cfg.max_queries or self.pool))
        self.plan = plan_looks(self.n, n_max, cfg.confidence)
        self.sides = {"candidate": cand, "reference": ref}
        self.evals: dict[str, VersionEval | None] = {"candidate": None, "reference": ref_eval}
        self.versions = {"reference": reference_version, "candidate": cfg.candidate_version}
        self.records: list[dict[str, Any]] = []

    def decide(self, metrics: list[str]) -> GateResult:
        cfg = self.cfg
        for look in self.plan:
            if look.n > self.n:
                self._grow(look.n)
            cand, ref = (_head(self.sides[k], look.n) for k in ("candidate", "reference"))
            result = gate(
                cand, ref, metrics, cfg.mode, cfg.tolerance,
                look.resamples(cfg.resamples), look.confidence, cfg.seed,
                min_pass_n=cfg.min_queries,
            )  # fmt: skip
            self.records.append(_record(look.n, result))
            log.info("look %d (%d queries, %.4f confidence): %s", len(self.records), look.n,
                     look.confidence, result.reason)  # fmt: skip
            open_ = [m.metric for m in result.metrics if m.verdict == Verdict.INCONCLUSIVE]
            # More queries decide only a search metric, and change no FAIL.
            if result.verdict is not Verdict.INCONCLUSIVE or not set(open_) & set(RANKING_METRICS):
                break
        return result

    def _grow(self, n: int) -> None:
        """Evaluate both sides on queries ``self.n`` to ``n`` and append them."""
        searcher = next((e.searcher for e in self.evals.values() if e is not None), None)
        for side, version in self.versions.items():
            ev = self.evals[side]
            if ev is None:
                ev = VersionEval.load(look_config(self.cfg, self.candidate, version), searcher)
                self.evals[side], searcher = ev, ev.searcher
            retrieval, more = self.sides[side]["retrieval"], ev.more(self.n, n)
            for key in retrieval:  # the per-query arrays the first look's outcomes hold
                retrieval[key] = np.concatenate([retrieval[key][: self.n], more[key]])
        self.n = n


def _head(outcomes: dict[str, Any], n: int) -> dict[str, Any]:
    """Outcomes with the first ``n`` judged queries (the head's pairs whole)."""
    retrieval = {k: v[:n] for k, v in outcomes["retrieval"].items()}
    return {"relevance": outcomes["relevance"], "retrieval": retrieval}


def _record(n: int, result: GateResult) -> dict[str, Any]:
    """One look, as gate.json lists it."""
    return {
        "n_queries": n,
        "confidence": result.confidence,
        "resamples": result.resamples,
        "verdict": str(result.verdict),
        "metrics": {
            m.metric: {k: m.to_dict()[k] for k in ("verdict", "d", "ci_low", "ci_high")}
            for m in result.metrics
        },
    }


def sizing(result: GateResult, pool: int, confidence: float = 0.95) -> list[dict[str, Any]]:
    """Per search metric of the last look: how many judged queries would decide a
    refresh that changes nothing (d = 0) at the tolerance, from this decision's
    per-query spread (the bootstrap's standard error of d, shrunk as 1/sqrt(n)), and
    whether the pool holds that many."""
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    out = []
    for m in result.metrics:
        if m.bootstrap is None or m.metric not in RANKING_METRICS or result.tolerance <= 0:
            continue
        n, se = m.bootstrap.n, m.bootstrap.se
        needed = math.ceil(n * (z * se / result.tolerance) ** 2)
        out.append(
            {"metric": m.metric, "n": n, "se": se, "n_for_no_change": needed, "pool": pool,
             "resolves_no_change": pool >= needed}
        )  # fmt: skip
    return out


def _untrained_side(
    store: ArtifactStore, cfg: GateConfig, reference: str, source: str
) -> str | None:
    """Why either side's relevance head never trained, or None: a reference of a seeded
    random head, or a candidate trained on positive pairs alone, says nothing through
    the head's metrics; the gate compares what both can be measured on."""
    return untrained_head(store, cfg.model, reference, source) or untrained_head(
        store, cfg.model, cfg.candidate_version, "candidate"
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
    if meta.get("head_trained") is False:
        return f"{version} was trained on positive pairs only, which train no relevance head"
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
            f"Gate on a search metric too (--set 'metrics=[\"ndcg_at_10\"]'), or "
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
        "n_queries": decision.get("n_queries"),
        "metrics": [{k: m.get(k) for k in METRIC_FIELDS} for m in decision["metrics"]],
        "metrics_not_compared": decision.get("metrics_not_compared", {}),
        "report": report_url,
    }


if __name__ == "__main__":
    main_for("gate", GateConfig, run_gate)
