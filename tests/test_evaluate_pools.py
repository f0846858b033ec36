"""recall@10 over a fixed candidate pool per query (``EvaluateConfig.recall_pool``).

The pools depend on the eval set and (POOL_SEED, query id) only, never on the model, so
two models are ranked over the same pools and the gate's per-query outcomes stay paired;
the pooled metric is checked against a brute-force sort; a pool at least as large as the
eval products falls back to all products with a warning in the report; the gate refuses a
candidate and a reference evaluated with different pool definitions (exit 2).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from embedfresh.core import layout
from embedfresh.core.config import EvaluateConfig, GateConfig
from embedfresh.core.exit_codes import BadInputError, ExitCode
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs.evaluate import evaluate
from embedfresh.jobs.gate import run_gate
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.evaluation import ALL_PRODUCTS, POOL_SEED, EvalSet, recall_at_k, recall_pools
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from embedfresh.ml.model.tokenizer import TextTokenizer
from tests.conftest import run_job
from tests.test_gate_job import one_torch_thread  # noqa: F401 - autouse: one torch thread

MODEL = "tiny"


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


# --- the evaluate job ----------------------------------------------------------------------


@pytest.fixture
def root(data_template: Path, tmp_path: Path) -> str:
    dest = tmp_path / "artifacts"
    shutil.copytree(data_template, dest)
    store = ArtifactStore(f"file://{dest}")
    spec = get_spec(MODEL)
    for name, seed in (("model-a", 0), ("model-b", 1)):
        net = versions.build_model(spec, seed)
        versions.publish(store, spec, name, cpu_state_dict(net), {})
    return f"file://{dest}"


def _report(store: ArtifactStore, run_id: str, name: str = "eval") -> dict:
    return store.read_json(layout.report(MODEL, run_id, name))


def _recalls(store: ArtifactStore, report: dict) -> tuple[np.ndarray, np.ndarray]:
    rel = report["outcomes"]["queries"].removeprefix(store.url("")).lstrip("/")
    with store.open_read(rel) as f:
        t = pq.read_table(f)
    return t.column("query_id").to_numpy(), t.column("recall_at_10").to_numpy()


def test_two_models_are_ranked_over_the_same_pools(root: str):
    store = ArtifactStore(root)
    pools = []
    for name in ("model-a", "model-b"):
        version = versions.load(store, MODEL, name)
        tokenizer = TextTokenizer(version.tokenizer_json, version.spec.max_length)
        pools.append(EvalSet.load(store, "products", tokenizer, 50))
    a, b = pools
    assert a.recall_pool == b.recall_pool == {"size": 50, "seed": POOL_SEED}
    assert np.array_equal(a.query_ids, b.query_ids)
    assert len(a.pools) == len(a.query_ids) and len(a.product_ids) > 50
    assert all(np.array_equal(x, y) for x, y in zip(a.pools, b.pools, strict=True))

    for name in ("model-a", "model-b"):
        evaluate(EvaluateConfig(artifact_root=root, run_id=name, recall_pool=50))
    rep_a, rep_b = _report(store, "model-a"), _report(store, "model-b")
    assert rep_a["recall_pool"] == rep_b["recall_pool"] == {"size": 50, "seed": POOL_SEED}
    assert rep_a["warnings"] == []
    (qa, ra), (qb, rb) = _recalls(store, rep_a), _recalls(store, rep_b)
    assert np.array_equal(qa, qb)  # paired per query
    assert not np.array_equal(ra, rb)  # two different models, two different rankings


def test_a_pool_larger_than_the_products_falls_back_to_all_with_a_warning(root: str):
    store = ArtifactStore(root)
    evaluate(EvaluateConfig(artifact_root=root, run_id="all", version="model-a", recall_pool=None))
    everything = _report(store, "all")
    assert everything["recall_pool"] == ALL_PRODUCTS and everything["warnings"] == []
    too_big = everything["n_products"] + 1
    evaluate(
        EvaluateConfig(artifact_root=root, run_id="big", version="model-a", recall_pool=too_big)
    )
    fallback = _report(store, "big")
    assert fallback["recall_pool"] == ALL_PRODUCTS
    (warning,) = fallback["warnings"]
    assert f"recall_pool={too_big}" in warning and "all products" in warning
    assert fallback["metrics"] == everything["metrics"]
    np.testing.assert_array_equal(_recalls(store, fallback)[1], _recalls(store, everything)[1])


def test_a_pool_too_small_for_recall_at_10_is_bad_input(root: str):
    proc = run_job(
        "evaluate", f"artifact_root={root}", "run_id=x", "version=model-a", "recall_pool=10"
    )
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-2000:]
    assert "recall_pool" in proc.stderr
    assert not ArtifactStore(root).exists(layout.report(MODEL, "x", "eval"))


# --- the gate ------------------------------------------------------------------------------


def test_the_gate_evaluates_the_reference_with_the_candidates_pool(root: str):
    store = ArtifactStore(root)
    evaluate(EvaluateConfig(artifact_root=root, run_id="run", version="model-b", recall_pool=50))
    cfg = GateConfig(artifact_root=root, run_id="run", version="model-b", reference="model-b")
    assert run_gate(cfg)["verdict"] == "PASS"  # the same model on the same pools: d = 0
    assert _report(store, "run", "eval-reference")["recall_pool"] == {"size": 50, "seed": 0}
    assert _report(store, "run", "gate")["recall_pool"] == {"size": 50, "seed": 0}


def test_the_gate_refuses_candidate_and_reference_on_different_pools(root: str):
    store = ArtifactStore(root)
    sets = ("run_id=run", "version=model-b")
    evaluate(EvaluateConfig(artifact_root=root, run_id="run", version="model-b", recall_pool=50))
    proc = run_job("gate", f"artifact_root={root}", *sets, "reference=model-a")
    assert proc.returncode in (ExitCode.OK, ExitCode.GATE_REFUSED), proc.stderr[-2000:]
    gate_before = store.read_bytes(layout.report(MODEL, "run", "gate"))

    # The candidate is evaluated again with another pool: the reference cached in the run
    # (pool 50) no longer pairs with it.
    evaluate(EvaluateConfig(artifact_root=root, run_id="run", version="model-b", recall_pool=200))
    proc = run_job("gate", f"artifact_root={root}", *sets, "reference=model-a")
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-2000:]
    assert "recall@10 pools differ" in proc.stderr
    assert "'size': 200" in proc.stderr and "'size': 50" in proc.stderr
    assert store.read_bytes(layout.report(MODEL, "run", "gate")) == gate_before
    with pytest.raises(BadInputError, match="remove eval-reference.json"):
        run_gate(
            GateConfig(artifact_root=root, run_id="run", version="model-b", reference="model-a")
        )
