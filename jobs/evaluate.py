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
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jobs import layout
from jobs.backends import get_backend
from jobs.cli import main_for
from jobs.config import EvaluateConfig
from jobs.data.reader import Examples, read_eval
from jobs.exit_codes import BadInputError
from jobs.gate.stats import metric_value
from jobs.inference import embed, score
from jobs.model import versions
from jobs.model.tokenizer import TextTokenizer
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


def evaluate(cfg: EvaluateConfig) -> dict[str, Any]:
    """Evaluate a model version on the held-out split and write the eval report."""
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    backend = get_backend(cfg.backend)
    version = versions.load(store, cfg.model, cfg.target_version)
    model = versions.instantiate(version).to(backend.device)
    examples = read_eval(store, cfg.dataset)
    tokenizer = TextTokenizer(version.tokenizer_json, version.spec.max_length)

    probs = score(
        model,
        backend,
        tokenizer(examples.queries),
        tokenizer(examples.products),
        examples.features,
        cfg.batch_size,
    )
    query_ids, query_texts, product_ids, product_texts, relevant = _retrieval_sets(examples)
    if len(query_ids) == 0:
        raise BadInputError("eval split has no relevant (label 1) pairs: recall@10 is undefined")
    q_vec = embed(model, backend, tokenizer(query_texts), cfg.batch_size)
    p_vec = embed(model, backend, tokenizer(product_texts), cfg.batch_size)
    recalls = recall_at_k(q_vec, p_vec, relevant)

    outcomes = {"label": examples.labels.astype(np.int64), "prob": probs, "recall_at_10": recalls}
    metrics = {name: round(metric_value(name, outcomes), 6) for name in METRICS}
    base = layout.reports(cfg.model, cfg.run_id)
    examples_rel = f"{base}/{cfg.report_name}.examples.parquet"
    queries_rel = f"{base}/{cfg.report_name}.queries.parquet"
    store.write_bytes(
        examples_rel,
        _parquet(
            {
                "query_id": examples.query_ids,
                "product_id": examples.product_ids,
                "label": outcomes["label"],
                "prob": probs,
            }
        ),
    )
    store.write_bytes(queries_rel, _parquet({"query_id": query_ids, "recall_at_10": recalls}))
    report = {
        "status": "ok",
        "model": cfg.model,
        "run_id": cfg.run_id,
        "version": cfg.target_version,
        "version_url": version.url,
        "dataset": cfg.dataset,
        "metrics": metrics,
        "n_examples": len(examples),
        "n_queries": len(query_ids),
        "n_products": len(product_ids),
        "outcomes": {"examples": store.url(examples_rel), "queries": store.url(queries_rel)},
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
