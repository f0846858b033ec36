"""Evaluation on the fixed held-out split: ``python -m embedfresh.jobs.evaluate --config eval.yaml``.

Relevance head: accuracy, ROC AUC and log-loss over (query, product) pairs. Retrieval:
recall@10 of each query's relevant products, ranked by the cosine of their embeddings
within a fixed-size candidate pool per query (``recall_pool``, default 100): its relevant
products plus negatives sampled from the eval products with a seed derived from
(:data:`POOL_SEED`, query id), so every model evaluated on this eval set meets the same
pools and the gate's per-query outcomes stay paired. Among all eval products
(``recall_pool=None``) recall@10 shrinks as the eval set grows and no eval size let the
gate decide; over a fixed pool more queries narrow the interval (figures: docs/GATE.md).

Writes ``reports/{name}.json`` (with the pool definition used, ``recall_pool``) and, for
the paired bootstrap of the quality gate, the per-example outcomes next to it
(``{name}.examples.parquet``: label and probability per pair;
``{name}.queries.parquet``: recall@10 per query).
"""

from __future__ import annotations

from typing import Any

from embedfresh.core.cli import main_for
from embedfresh.core.config import EvaluateConfig
from embedfresh.ml.evaluation import evaluate_version


def evaluate(cfg: EvaluateConfig) -> dict[str, Any]:
    """Evaluate a model version on the held-out split and write the eval report."""
    report, url = evaluate_version(cfg)
    return {
        "status": "ok",
        "version": report["version"],
        "metrics": report["metrics"],
        "report": url,
    }


if __name__ == "__main__":
    main_for("evaluate", EvaluateConfig, evaluate)
