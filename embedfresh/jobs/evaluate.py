"""Evaluation on the fixed held-out split: ``python -m embedfresh.jobs.evaluate --config eval.yaml``.

Search on the data set's judged queries over the corpus (nDCG@10, recall@10/@100,
MRR@10; the first ``queries`` of the pool) and the relevance head's accuracy, ROC AUC and
log-loss, as :mod:`embedfresh.ml.evaluation` defines them (the gate's reference and the
training curve use the same code). Writes ``reports/{name}.json`` and, for the gate's
paired bootstrap, the per-example outcomes next to it.
"""

from __future__ import annotations

from typing import Any

from embedfresh.core.cli import main_for
from embedfresh.core.config import EvaluateConfig
from embedfresh.ml.evaluation import evaluate_version


def evaluate(cfg: EvaluateConfig) -> dict[str, Any]:
    """Evaluate a model version on the held-out split and write the eval report."""
    report, url, _ = evaluate_version(cfg)
    return {
        "status": "ok",
        "version": report["version"],
        "metrics": report["metrics"],
        "n_queries": report["n_queries"],
        "report": url,
    }


if __name__ == "__main__":
    main_for("evaluate", EvaluateConfig, evaluate)
