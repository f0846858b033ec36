"""recall@10 over a fixed candidate pool per query: the fast modes' own quality gate
(int8 or bf16 against fp32 on the eval split's pairs, docs/GATE.md "Fast modes").

Each query's pool is its relevant products plus negatives drawn from the eval products
by a generator seeded with (:data:`POOL_SEED`, query id): it depends only on the eval
set, so both sides of the comparison rank over the same pools.
"""

from __future__ import annotations

import numpy as np

from embedfresh.ml.data.reader import Examples

RECALL_K = 10
POOL_SEED = 0
"""Seeds every query's negative sample together with its id; part of the pool definition."""
POOL_SIZE = 100
"""Products per pool (why 100: docs/GATE.md)."""


def recall_pools(
    query_ids: np.ndarray, relevant: list[np.ndarray], n_products: int, size: int
) -> list[np.ndarray]:
    """Per query, the positions in the product pool of its candidate pool: its relevant
    products first, then ``size - len(relevant)`` distinct negatives drawn uniformly
    from the other eval products by a generator seeded with ``(POOL_SEED, query id)``.

    Depends only on the eval set, never on a model. Needs ``size < n_products``.
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
    out = np.zeros(len(relevant), dtype=np.float64)
    if pools is not None:
        for i, (rel, pool) in enumerate(zip(relevant, pools, strict=True)):
            sims = product_vectors[pool] @ query_vectors[i]
            k_eff = min(k, len(pool))
            top = np.argpartition(-sims, k_eff - 1)[:k_eff]
            out[i] = (top < len(rel)).sum() / len(rel)  # the pool starts with the relevant
        return out
    chunk = 1024  # bounds the similarity matrix to chunk x products
    for start in range(0, len(relevant), chunk):
        sims = query_vectors[start : start + chunk] @ product_vectors.T
        k_eff = min(k, sims.shape[1])
        top = np.argpartition(-sims, k_eff - 1, axis=1)[:, :k_eff]
        for row, hits in enumerate(top):
            rel = relevant[start + row]
            out[start + row] = np.isin(rel, hits).sum() / len(rel)
    return out


def retrieval_sets(
    examples: Examples,
) -> tuple[np.ndarray, list[str], np.ndarray, list[str], list[np.ndarray]]:
    """Unique queries with at least one relevant (label 1, grade 2-3) product, the product pool,
    and the positions in the pool of each query's relevant products."""
    product_ids, first = np.unique(examples.product_ids, return_index=True)
    product_texts = [examples.products[i] for i in first]
    position = {pid: i for i, pid in enumerate(product_ids)}
    relevant: dict[int, list[int]] = {}
    query_text: dict[int, str] = {}
    for qid, pid, label, text in zip(
        examples.query_ids, examples.product_ids, examples.labels, examples.queries, strict=True
    ):
        query_text.setdefault(int(qid), text)
        if label >= 0.5:  # label 1, grade 2-3
            relevant.setdefault(int(qid), []).append(position[pid])
    query_ids = np.array(sorted(relevant), dtype=np.int64)
    return (
        query_ids,
        [query_text[q] for q in query_ids],
        product_ids,
        product_texts,
        [np.unique(np.array(relevant[q])) for q in query_ids],
    )
