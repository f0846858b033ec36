"""Evaluation on the fixed held-out split: ``python -m jobs.evaluate --config eval.yaml``.

Relevance head: accuracy, ROC AUC and log-loss over (query, product) pairs. Retrieval:
recall@10 of each query's relevant products among all eval products, ranked by the
cosine of their embeddings. Writes ``reports/{name}.json`` and, for the paired
bootstrap of the quality gate, the per-example outcomes next to it
(``{name}.examples.parquet``: label and probability per pair;
``{name}.queries.parquet``: recall@10 per query).
"""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jobs import layout
from jobs.backends import Backend, get_backend
from jobs.cli import main_for
from jobs.config import EvaluateConfig
from jobs.data.reader import Examples, read_eval
from jobs.exit_codes import BadInputError
from jobs.gate.stats import metric_value
from jobs.inference import embed, score
from jobs.model import versions
from jobs.model.relevance import RelevanceModel
from jobs.model.tokenizer import TextTokenizer, Tokenized
from jobs.storage import ArtifactStore

log = logging.getLogger("jobs.evaluate")

RECALL_K = 10
METRICS = ("accuracy", "auc", "log_loss", "recall_at_10")


def recall_at_k(
    query_vectors: np.ndarray,
    product_vectors: np.ndarray,
    relevant: list[np.ndarray],
    k: int = RECALL_K,
) -> np.ndarray:
    """Per query, the share of its relevant products found in the top ``k`` by cosine."""
    out = np.zeros(len(relevant), dtype=np.float64)
    chunk = 1024  # bounds the similarity matrix to chunk x products
    for start in range(0, len(relevant), chunk):
        sims = query_vectors[start : start + chunk] @ product_vectors.T
        k_eff = min(k, sims.shape[1])
        top = np.argpartition(-sims, k_eff - 1, axis=1)[:, :k_eff]
        for row, hits in enumerate(top):
            rel = relevant[start + row]
            out[start + row] = np.isin(rel, hits).sum() / len(rel)
    return out


def _retrieval_sets(
    examples: Examples,
) -> tuple[np.ndarray, list[str], np.ndarray, list[str], list[np.ndarray]]:
    """Unique queries with at least one relevant product, the product pool, and the
    positions in the pool of each query's relevant products."""
    product_ids, first = np.unique(examples.product_ids, return_index=True)
    product_texts = [examples.products[i] for i in first]
    position = {pid: i for i, pid in enumerate(product_ids)}
    relevant: dict[int, list[int]] = {}
    query_text: dict[int, str] = {}
    for qid, pid, label, text in zip(
        examples.query_ids, examples.product_ids, examples.labels, examples.queries, strict=True
    ):
        query_text.setdefault(int(qid), text)
        if label == 1:
            relevant.setdefault(int(qid), []).append(position[pid])
    query_ids = np.array(sorted(relevant), dtype=np.int64)
    return (
        query_ids,
        [query_text[q] for q in query_ids],
        product_ids,
        product_texts,
        [np.unique(np.array(relevant[q])) for q in query_ids],
    )


@dataclass(frozen=True)
class EvalSet:
    """The held-out split, tokenised once: the pairs to score and the retrieval sets."""

    examples: Examples
    queries: Tokenized
    products: Tokenized
    query_ids: np.ndarray
    query_tokens: Tokenized
    product_ids: np.ndarray
    product_tokens: Tokenized
    relevant: list[np.ndarray]

    @classmethod
    def load(cls, store: ArtifactStore, dataset: str, tokenizer: TextTokenizer) -> EvalSet:
        examples = read_eval(store, dataset)
        query_ids, query_texts, product_ids, product_texts, relevant = _retrieval_sets(examples)
        if len(query_ids) == 0:
            raise BadInputError(
                "eval split has no relevant (label 1) pairs: recall@10 is undefined"
            )
        return cls(
            examples,
            tokenizer(examples.queries),
            tokenizer(examples.products),
            query_ids,
            tokenizer(query_texts),
            product_ids,
            tokenizer(product_texts),
            relevant,
        )


def evaluate_model(
    model: RelevanceModel, backend: Backend, data: EvalSet, batch_size: int
) -> tuple[dict[str, float], dict[str, dict[str, np.ndarray]]]:
    """Metrics and per-example outcome tables of an in-memory model on ``data``.

    Leaves the model in eval mode and draws no random numbers (no dropout in eval mode),
    so the training loop can call it between steps. Batches are padded to a fixed shape
    (:mod:`jobs.inference`): on XLA, every evaluation after the first reuses its graphs.
    Returns ``(metrics, {"examples": {...}, "queries": {...}})``, the tables as
    :func:`write_outcomes` stores them.
    """
    ex = data.examples
    probs = score(model, backend, data.queries, data.products, ex.features, batch_size)
    q_vec = embed(model, backend, data.query_tokens, batch_size)
    p_vec = embed(model, backend, data.product_tokens, batch_size)
    recalls = recall_at_k(q_vec, p_vec, data.relevant)
    labels = ex.labels.astype(np.int64)
    outcomes = {"label": labels, "prob": probs, "recall_at_10": recalls}
    metrics = {name: round(metric_value(name, outcomes), 6) for name in METRICS}
    tables = {
        "examples": {
            "query_id": ex.query_ids,
            "product_id": ex.product_ids,
            "label": labels,
            "prob": probs,
        },
        "queries": {"query_id": data.query_ids, "recall_at_10": recalls},
    }
    return metrics, tables


def write_outcomes(
    store: ArtifactStore,
    model: str,
    run_id: str,
    report_name: str,
    tables: dict[str, dict[str, np.ndarray]],
) -> dict[str, str]:
    """Write the outcome tables next to ``reports/{report_name}.json``; returns their URLs
    (the report's ``outcomes``, which :func:`jobs.gate.job.load_outcomes` reads)."""
    base = layout.reports(model, run_id)
    urls = {}
    for key in ("examples", "queries"):
        rel = f"{base}/{report_name}.{key}.parquet"
        store.write_bytes(rel, _parquet(tables[key]))
        urls[key] = store.url(rel)
    return urls


def evaluate(cfg: EvaluateConfig) -> dict[str, Any]:
    """Evaluate a model version on the held-out split and write the eval report."""
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    backend = get_backend(cfg.backend)
    version = versions.load(store, cfg.model, cfg.target_version)
    model = versions.instantiate(version).to(backend.device)
    tokenizer = TextTokenizer(version.tokenizer_json, version.spec.max_length)
    data = EvalSet.load(store, cfg.dataset, tokenizer)
    metrics, tables = evaluate_model(model, backend, data, cfg.batch_size)
    outcomes = write_outcomes(store, cfg.model, cfg.run_id, cfg.report_name, tables)
    report = {
        "status": "ok",
        "model": cfg.model,
        "run_id": cfg.run_id,
        "version": cfg.target_version,
        "version_url": version.url,
        "dataset": cfg.dataset,
        "metrics": metrics,
        "n_examples": len(data.examples),
        "n_queries": len(data.query_ids),
        "n_products": len(data.product_ids),
        "outcomes": outcomes,
        "wall_seconds": round(time.perf_counter() - started, 3),
        **backend.metadata(),
    }
    report_rel = layout.report(cfg.model, cfg.run_id, cfg.report_name)
    store.write_json(report_rel, report)  # written last: the outcomes it names exist
    return {
        "status": "ok",
        "version": cfg.target_version,
        "metrics": metrics,
        "report": store.url(report_rel),
    }


def _parquet(columns: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table(columns), buf, compression="zstd")
    return buf.getvalue()


if __name__ == "__main__":
    main_for("evaluate", EvaluateConfig, evaluate)
