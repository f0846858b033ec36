"""Evaluation of a model version on the fixed held-out split (the evaluate job, the gate's
reference and the training curve all use it).

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

import io
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedfresh.core import layout
from embedfresh.core.config import EvaluateConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.progress import Progress
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.backends import Backend, get_backend
from embedfresh.ml.data.reader import Examples, read_eval
from embedfresh.ml.gate.stats import metric_value
from embedfresh.ml.inference import embed, score
from embedfresh.ml.model import versions
from embedfresh.ml.model.relevance import RelevanceModel
from embedfresh.ml.model.tokenizer import TextTokenizer, Tokenized

log = logging.getLogger("embedfresh.ml.evaluation")

RECALL_K = 10
METRICS = ("accuracy", "auc", "log_loss", "recall_at_10")
HEAD_METRICS = ("accuracy", "auc", "log_loss")
"""The relevance head's metrics: meaningless for a version whose head never trained."""
POOL_SEED = 0
"""Seeds every query's negative sample together with its id; part of the pool definition."""
DEFAULT_RECALL_POOL: int | None = EvaluateConfig.model_fields["recall_pool"].default
ALL_PRODUCTS = {"size": None, "seed": None}
"""The pool definition of recall@10 among all eval products (and of reports that predate
``recall_pool``)."""


def recall_pools(
    query_ids: np.ndarray, relevant: list[np.ndarray], n_products: int, size: int
) -> list[np.ndarray]:
    """Per query, the positions in the product pool of its candidate pool: its relevant
    products first, then ``size - len(relevant)`` distinct negatives drawn uniformly
    from the other eval products by a generator seeded with ``(POOL_SEED, query id)``.

    Depends only on the eval set, never on a model: candidate and reference are ranked
    over the same pools. Needs ``size < n_products`` (else use all products).
    """
    pools = []
    for qid, rel in zip(query_ids, relevant, strict=True):
        n_neg = max(size - len(rel), 0)
        rng = np.random.default_rng([POOL_SEED, int(qid)])
        # n_neg + len(rel) distinct draws hold at least n_neg non-relevant ones
        draw = rng.choice(n_products, size=min(n_neg + len(rel), n_products), replace=False)
        negatives = draw[~np.isin(draw, rel)][:n_neg]
        pools.append(np.concatenate([rel, negatives]).astype(np.int64))
    return pools


def recall_at_k(
    query_vectors: np.ndarray,
    product_vectors: np.ndarray,
    relevant: list[np.ndarray],
    k: int = RECALL_K,
    pools: list[np.ndarray] | None = None,
) -> np.ndarray:
    """Per query, the share of its relevant products found in the top ``k`` by cosine,
    among all products or, with ``pools`` (:func:`recall_pools`), among the query's pool."""
    if pools is not None:
        return _pooled_recall_at_k(query_vectors, product_vectors, relevant, pools, k)
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


def _pooled_recall_at_k(
    query_vectors: np.ndarray,
    product_vectors: np.ndarray,
    relevant: list[np.ndarray],
    pools: list[np.ndarray],
    k: int,
) -> np.ndarray:
    out = np.zeros(len(relevant), dtype=np.float64)
    for i, (rel, pool) in enumerate(zip(relevant, pools, strict=True)):
        sims = product_vectors[pool] @ query_vectors[i]
        k_eff = min(k, len(pool))
        top = np.argpartition(-sims, k_eff - 1)[:k_eff]
        out[i] = (top < len(rel)).sum() / len(rel)  # the pool starts with the relevant ones
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
    pools: list[np.ndarray] | None
    recall_pool: dict[str, int | None]
    """The pool definition used (``{"size", "seed"}``; :data:`ALL_PRODUCTS` for none)."""
    warnings: tuple[str, ...] = ()

    @classmethod
    def load(
        cls,
        store: ArtifactStore,
        dataset: str,
        tokenizer: TextTokenizer,
        recall_pool: int | None = DEFAULT_RECALL_POOL,
    ) -> EvalSet:
        """Read and tokenise the split; ``recall_pool`` as :class:`EvaluateConfig`'s. A pool
        at least as large as the eval products falls back to all of them, with a warning."""
        examples = read_eval(store, dataset)
        query_ids, query_texts, product_ids, product_texts, relevant = _retrieval_sets(examples)
        if len(query_ids) == 0:
            raise BadInputError(
                "eval split has no relevant (label 1) pairs: recall@10 is undefined"
            )
        pools, definition, warnings = None, dict(ALL_PRODUCTS), ()
        if recall_pool is not None and recall_pool >= len(product_ids):
            warnings = (
                f"recall_pool={recall_pool} is not smaller than the {len(product_ids)} eval "
                f"products of {dataset!r}: recall@10 is over all products",
            )
            log.warning(warnings[0])
        elif recall_pool is not None:
            pools = recall_pools(query_ids, relevant, len(product_ids), recall_pool)
            definition = {"size": recall_pool, "seed": POOL_SEED}
        return cls(
            examples,
            tokenizer.query(examples.queries),
            tokenizer.document(examples.products),
            query_ids,
            tokenizer.query(query_texts),
            product_ids,
            tokenizer.document(product_texts),
            relevant,
            pools,
            definition,
            warnings,
        )


def evaluate_model(
    model: RelevanceModel,
    backend: Backend,
    data: EvalSet,
    batch_size: int,
    progress: str | None = None,
) -> tuple[dict[str, float], dict[str, dict[str, np.ndarray]]]:
    """Metrics and per-example outcome tables of an in-memory model on ``data``.

    Leaves the model in eval mode and draws no random numbers (no dropout in eval mode),
    so the training loop can call it between steps. Batches are padded to a fixed shape
    (:mod:`embedfresh.ml.inference`): on XLA, every evaluation after the first reuses its graphs.
    Returns ``(metrics, {"examples": {...}, "queries": {...}})``, the tables as
    :func:`write_outcomes` stores them. ``progress``: what the log calls this evaluation
    in its progress lines (rows scored and texts embedded, rate and ETA); None: no lines
    (the training loop's evaluation points).
    """
    ex = data.examples
    counter = None
    if progress is not None:
        total = len(ex.features) + len(data.query_ids) + len(data.product_ids)
        counter = Progress(progress, total, unit="rows", log=log)
    probs = score(model, backend, data.queries, data.products, ex.features, batch_size, counter)
    q_vec = embed(model, backend, data.query_tokens, batch_size, counter)
    p_vec = embed(model, backend, data.product_tokens, batch_size, counter)
    if counter is not None:
        counter.finish()
    recalls = recall_at_k(q_vec, p_vec, data.relevant, pools=data.pools)
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
    (the report's ``outcomes``, which :func:`embedfresh.ml.gate.outcomes.load_outcomes` reads)."""
    base = layout.reports(model, run_id)
    urls = {}
    for key in ("examples", "queries"):
        rel = f"{base}/{report_name}.{key}.parquet"
        store.write_bytes(rel, _parquet(tables[key]))
        urls[key] = store.url(rel)
    return urls


def evaluate_version(cfg: EvaluateConfig) -> tuple[dict[str, Any], str]:
    """Evaluate ``cfg``'s version on the held-out split; write its outcomes, then its report
    (``reports/{report_name}.json``, last). Returns the report and its URL."""
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    backend = get_backend(cfg.backend)
    version = versions.load(store, cfg.model, cfg.target_version)
    model = versions.instantiate(version).to(backend.device)
    tokenizer = TextTokenizer(version.tokenizer_json, version.spec.max_length, version.spec.prompts)
    data = EvalSet.load(store, cfg.dataset, tokenizer, cfg.recall_pool)
    log.info(
        "evaluating %s version %s on %s: %d pairs, %d queries, %d products",
        cfg.model, cfg.target_version, cfg.dataset,
        len(data.examples), len(data.query_ids), len(data.product_ids),
    )  # fmt: skip
    what = f"evaluating {cfg.model} {cfg.target_version}"
    metrics, tables = evaluate_model(model, backend, data, cfg.batch_size, progress=what)
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
        "recall_pool": data.recall_pool,
        "warnings": list(data.warnings),
        "outcomes": outcomes,
        "wall_seconds": round(time.perf_counter() - started, 3),
        **backend.metadata(),
    }
    report_rel = layout.report(cfg.model, cfg.run_id, cfg.report_name)
    store.write_json(report_rel, report)  # written last: the outcomes it names exist
    return report, store.url(report_rel)


def _parquet(columns: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table(columns), buf, compression="zstd")
    return buf.getvalue()
