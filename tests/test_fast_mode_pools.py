"""recall@10 over a fixed candidate pool per query: the fast modes' own gate
(:mod:`embedfresh.ml.embedding.pools`).

The pools depend on the eval set and (POOL_SEED, query id) only, never on the model, so
two models are ranked over the same pools and the gate's per-query outcomes stay paired;
the pooled metric is checked against a brute-force sort.
"""

from __future__ import annotations

import numpy as np

from embedfresh.ml.embedding.pools import POOL_SEED, recall_at_k, recall_pools

# --- the pools and the metric, on synthetic vectors ----------------------------------------


def _relevant(rng: np.random.Generator, n_queries: int, n_products: int) -> list[np.ndarray]:
    return [
        np.unique(rng.choice(n_products, size=rng.integers(1, 4), replace=False))
        for _ in range(n_queries)
    ]


def test_pools_have_the_relevant_products_first_then_distinct_negatives():
    rng = np.random.default_rng(1)
    n_products, size = 500, 50
    query_ids = rng.choice(10_000, size=40, replace=False)
    relevant = _relevant(rng, len(query_ids), n_products)
    pools = recall_pools(query_ids, relevant, n_products, size)
    for rel, pool in zip(relevant, pools, strict=True):
        assert len(pool) == size
        assert len(np.unique(pool)) == size
        assert np.array_equal(pool[: len(rel)], rel)
        assert not np.isin(pool[len(rel) :], rel).any()
        assert pool.min() >= 0 and pool.max() < n_products
    # Different queries draw different negatives.
    assert len({tuple(p[len(r) :]) for r, p in zip(relevant, pools, strict=True)}) == len(pools)


def test_a_querys_pool_depends_only_on_its_id_not_on_the_other_queries():
    rng = np.random.default_rng(2)
    n_products, size = 300, 40
    query_ids = np.arange(100, 160)
    relevant = _relevant(rng, len(query_ids), n_products)
    full = recall_pools(query_ids, relevant, n_products, size)
    subset = recall_pools(query_ids[::-3], relevant[::-3], n_products, size)
    for got, want in zip(subset, full[::-3], strict=True):
        assert np.array_equal(got, want)
    again = recall_pools(query_ids, relevant, n_products, size)
    assert all(np.array_equal(a, b) for a, b in zip(full, again, strict=True))
    # The seed is part of the definition: a generator seeded otherwise draws otherwise.
    other = np.random.default_rng([POOL_SEED + 1, int(query_ids[0])])
    assert not np.array_equal(
        other.choice(n_products, size=size + len(relevant[0]), replace=False)[:size],
        np.random.default_rng([POOL_SEED, int(query_ids[0])]).choice(
            n_products, size=size + len(relevant[0]), replace=False
        )[:size],
    )


def _unit(rng: np.random.Generator, n: int, dim: int = 16) -> np.ndarray:
    v = rng.standard_normal((n, dim))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_pooled_recall_matches_a_brute_force_sort_of_each_pool():
    rng = np.random.default_rng(3)
    n_queries, n_products, size, k = 60, 400, 30, 10
    q, p = _unit(rng, n_queries), _unit(rng, n_products)
    relevant = _relevant(rng, n_queries, n_products)
    pools = recall_pools(np.arange(n_queries), relevant, n_products, size)
    got = recall_at_k(q, p, relevant, k, pools=pools)
    want = []
    for i, (rel, pool) in enumerate(zip(relevant, pools, strict=True)):
        order = pool[np.argsort(-(p[pool] @ q[i]), kind="stable")]
        want.append(np.isin(rel, order[:k]).sum() / len(rel))
    np.testing.assert_allclose(got, want)
    # Random vectors: about k/size of the relevant ones make the top k of a pool, far
    # more than among all products (k/n_products): the pool sets the metric's scale.
    assert 0.15 < got.mean() < 0.55
    assert recall_at_k(q, p, relevant, k).mean() < 0.1


def test_a_pool_of_every_product_ranks_like_no_pool():
    rng = np.random.default_rng(4)
    q, p = _unit(rng, 50), _unit(rng, 80)
    relevant = _relevant(rng, 50, 80)
    everything = [np.concatenate([r, np.setdiff1d(np.arange(80), r)]) for r in relevant]
    np.testing.assert_allclose(
        recall_at_k(q, p, relevant, pools=everything), recall_at_k(q, p, relevant)
    )
