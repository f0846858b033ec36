"""Tests of the synthetic data generator: determinism, schemas, and label semantics.

The semantic tests read categories back from the text alone (the nouns of
``generate.CATEGORIES``), so they check what a model will see, not generator internals.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs import generate_data
from embedfresh.ml.data import generate
from embedfresh.ml.data.schema import CORPUS_SCHEMA, demo_pair_schema

DAY = dt.date(2026, 1, 1)
BUDGET = re.compile(r"\b(cheap|budget|affordable|inexpensive)\b|under \$")
PREMIUM = re.compile(r"\b(best|premium|top rated|high end)\b")


def _noun_pattern() -> tuple[re.Pattern[str], dict[str, int]]:
    owner = {
        noun.lower(): index
        for index, category in enumerate(generate.CATEGORIES)
        for noun in (*category.nouns, *category.query_nouns)
    }
    # Longest first, so "tablet pc" wins over "tablet" at the same position.
    alternatives = sorted(owner, key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(map(re.escape, alternatives)) + r")\b"), owner


def _categories_from_text(texts: list[str]) -> np.ndarray:
    """The category each text names: its longest category noun, -1 when none."""
    pattern, owner = _noun_pattern()
    cache: dict[str, int] = {}
    out = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        if text not in cache:
            found = pattern.findall(text.lower())
            cache[text] = owner[max(found, key=len)] if found else -1
        out[i] = cache[text]
    return out


@pytest.fixture(scope="module")
def big() -> dict[str, np.ndarray]:
    table = generate.generate_partition(3, DAY, 24_000)
    queries = table.column("query").to_pylist()
    cat = generate._catalogue(3)  # each pair's title: its product's in the catalogue
    at = np.searchsorted(cat.ids, table.column("doc_id").to_numpy())
    assert (cat.ids[at] == table.column("doc_id").to_numpy()).all()
    titles = np.array(cat.titles.to_pylist(), dtype=object)[at].tolist()
    return {
        "query": np.array(queries, dtype=object),
        "title": np.array(titles, dtype=object),
        "query_category": _categories_from_text(queries),
        "product_category": _categories_from_text(titles),
        "label": table.column("label").to_numpy(),
        "price": table.column("price").to_numpy(),
        "rating": table.column("rating").to_numpy(),
        "in_stock": table.column("in_stock").to_numpy(),
    }


# -- determinism and schema ----------------------------------------------------------


def test_partition_bytes_are_reproducible_and_vary_by_day_and_seed() -> None:
    first = generate.parquet_bytes(generate.generate_partition(0, DAY, 4000))
    generate._catalogue.cache_clear()  # the catalogue must be rebuilt identically too
    again = generate.parquet_bytes(generate.generate_partition(0, DAY, 4000))
    next_day = generate.parquet_bytes(generate.generate_partition(0, DAY + dt.timedelta(1), 4000))
    other_seed = generate.parquet_bytes(generate.generate_partition(1, DAY, 4000))
    assert first == again
    assert first != next_day
    assert first != other_seed


@pytest.mark.parametrize("rows", [1, 1001, 4000])
def test_partition_has_exact_rows_and_schema(rows: int) -> None:
    table = generate.generate_partition(0, DAY, rows)
    assert table.num_rows == rows
    assert table.schema.equals(demo_pair_schema())
    back = pq.read_table(io.BytesIO(generate.parquet_bytes(table)))
    assert back.schema.equals(demo_pair_schema())
    assert back.equals(table)


def test_features_are_in_their_documented_ranges() -> None:
    table = generate.generate_partition(0, DAY, 4000)
    col = {name: table.column(name).to_numpy() for name in table.column_names}
    assert (col["price"] > 0).all()
    assert ((col["rating"] >= 1) & (col["rating"] <= 5)).all()
    assert (col["review_count"] >= 0).all()
    assert (col["review_count"] == np.floor(col["review_count"])).all()
    assert ((col["discount"] >= 0) & (col["discount"] <= 0.6 + 1e-6)).all()
    assert set(np.unique(col["in_stock"])) <= {0.0, 1.0}
    assert set(np.unique(col["label"])) == {0, 1}
    # No product is offered twice for the same query.
    pairs = col["query_id"].astype(object) * 10**9 + col["doc_id"]
    assert len(set(pairs)) == len(pairs)


def test_eval_is_fixed_and_disjoint_from_train() -> None:
    first = generate.generate_eval(0, 3000)
    assert first.schema.equals(demo_pair_schema())
    assert first.num_rows == 3000
    assert generate.parquet_bytes(first) == generate.parquet_bytes(generate.generate_eval(0, 3000))
    eval_ids = set(first.column("query_id").to_pylist())
    for offset in range(3):
        train = generate.generate_partition(0, DAY + dt.timedelta(offset), 3000)
        assert eval_ids.isdisjoint(train.column("query_id").to_pylist())


def test_bad_arguments_raise_bad_input() -> None:
    with pytest.raises(BadInputError):
        generate.generate_partition(0, DAY, 0)
    with pytest.raises(BadInputError):
        generate.generate_partition(-1, DAY, 10)
    with pytest.raises(BadInputError):
        generate.generate_corpus(0, 0)


# -- labels --------------------------------------------------------------------------


def test_positive_rate_is_in_range(big: dict[str, np.ndarray]) -> None:
    assert 0.30 <= big["label"].mean() <= 0.45


def test_text_names_a_category_and_queries_use_synonyms(big: dict[str, np.ndarray]) -> None:
    assert (big["query_category"] >= 0).all()
    assert (big["product_category"] >= 0).all()
    same = big["query_category"] == big["product_category"]
    title_nouns = {n.lower() for c in generate.CATEGORIES for n in c.nouns}
    reworded = np.array(
        [
            not any(n in t.lower() and n in q for n in title_nouns)
            for q, t in zip(big["query"][same], big["title"][same], strict=True)
        ]
    )
    # A model has to match wordings, not copy strings: most relevant pairs share no noun.
    assert reworded.mean() > 0.5
    assert big["label"][same][reworded].mean() > 0.45


def test_labels_follow_category_semantics(big: dict[str, np.ndarray]) -> None:
    same = big["query_category"] == big["product_category"]
    assert 0.3 < same.mean() < 0.8
    same_rate, cross_rate = big["label"][same].mean(), big["label"][~same].mean()
    assert same_rate > 0.5
    assert cross_rate < 0.1
    assert same_rate - cross_rate > 0.4


def test_labels_follow_attribute_semantics(big: dict[str, np.ndarray]) -> None:
    colors = {v.lower() for c in generate.CATEGORIES for v in c.colors}
    color_pattern = re.compile(r"\b(" + "|".join(sorted(colors, key=len, reverse=True)) + r")\b")
    same = big["query_category"] == big["product_category"]
    matched, mismatched = [], []
    for i in np.flatnonzero(same):
        asked = color_pattern.match(BUDGET.sub("", PREMIUM.sub("", big["query"][i])).strip())
        if not asked:
            continue
        title_color = big["title"][i].rsplit(", ", 1)[-1].lower()
        (matched if title_color == asked.group(1) else mismatched).append(big["label"][i])
    assert len(matched) > 200 and len(mismatched) > 200
    assert np.mean(matched) - np.mean(mismatched) > 0.3


def _relative_price(big: dict[str, np.ndarray]) -> np.ndarray:
    category = big["product_category"]
    medians = {c: np.median(big["price"][category == c]) for c in np.unique(category)}
    return big["price"] / np.array([medians[c] for c in category])


def test_budget_intent_interacts_with_price(big: dict[str, np.ndarray]) -> None:
    same = big["query_category"] == big["product_category"]
    budget = np.array([bool(BUDGET.search(q)) for q in big["query"]])
    premium = np.array([bool(PREMIUM.search(q)) for q in big["query"]])
    rel = _relative_price(big)
    cheap, dear = rel < 0.7, rel > 1.4

    def gap(mask: np.ndarray) -> float:
        return big["label"][mask & cheap].mean() - big["label"][mask & dear].mean()

    # Expensive items are irrelevant for budget queries, not for queries without intent.
    assert gap(same & budget) > 0.35
    assert abs(gap(same & ~budget & ~premium)) < 0.15


def test_premium_intent_interacts_with_rating(big: dict[str, np.ndarray]) -> None:
    same = big["query_category"] == big["product_category"]
    premium = np.array([bool(PREMIUM.search(q)) for q in big["query"]])
    high, low = big["rating"] >= 4.5, big["rating"] < 3.8

    def gap(mask: np.ndarray) -> float:
        return big["label"][mask & high].mean() - big["label"][mask & low].mean()

    assert gap(same & premium) > 0.4
    assert gap(same & premium) > gap(same & ~premium) + 0.15


def test_out_of_stock_lowers_relevance(big: dict[str, np.ndarray]) -> None:
    same = big["query_category"] == big["product_category"]
    in_stock = big["in_stock"] == 1
    assert big["label"][same & in_stock].mean() - big["label"][same & ~in_stock].mean() > 0.15


# -- corpus --------------------------------------------------------------------------


def test_corpus_rows_ids_and_batching() -> None:
    rows = generate.CATALOGUE_SIZE + 70_000  # crosses an internal block boundary
    whole = generate.generate_corpus(0, rows)
    assert whole.schema.equals(CORPUS_SCHEMA)
    assert whole.num_rows == rows
    ids = whole.column("id").to_numpy()
    assert len(np.unique(ids)) == rows
    batches = list(generate.iter_corpus_batches(0, rows, 7_777))
    assert [b.num_rows for b in batches[:-1]] == [7_777] * (len(batches) - 1)
    assert pa.Table.from_batches(batches).equals(whole)
    assert len(set(whole.column("text").to_pylist())) > 0.5 * rows


def test_a_pair_carries_its_corpus_text() -> None:
    corpus = generate.generate_corpus(0, generate.CATALOGUE_SIZE)
    ids, texts = corpus.column("id").to_pylist(), corpus.column("text").to_pylist()
    text_by_id = dict(zip(ids, texts, strict=True))
    train = generate.generate_partition(0, DAY, 500).to_pylist()
    for row in train:
        assert text_by_id[row["doc_id"]] == row["doc_text"]


# -- writing -------------------------------------------------------------------------


def _write(store: ArtifactStore, corpus_rows: int = 2_500) -> dict:
    return generate.write_dataset(
        store,
        "products",
        seed=0,
        start=DAY,
        days=2,
        train_rows=500,
        eval_rows=300,
        corpus_name="products",
        corpus_rows=corpus_rows,
        corpus_shard_rows=1000,
    )


def test_write_dataset_writes_the_layout(tmp_path) -> None:
    store = ArtifactStore(f"file://{tmp_path}")
    summary = _write(store)
    rels = [
        f"{layout.dataset_partition('products', 'train', DAY)}/{layout.part_name(0)}",
        f"{layout.dataset_partition('products', 'train', DAY + dt.timedelta(1))}/"
        f"{layout.part_name(0)}",
        f"{layout.eval_split('products')}/{layout.part_name(0)}",
        *[f"{layout.corpus('products')}/{layout.part_name(i)}" for i in range(3)],
    ]
    before = {rel: store.read_bytes(rel) for rel in rels}
    assert [t["url"] for t in summary["train"]] == [store.url(r) for r in rels[:2]]
    assert summary["eval"]["url"] == store.url(rels[2])
    assert summary["corpus"]["shards"] == [store.url(r) for r in rels[3:]]
    assert summary["train_rows"] == 1000 and summary["eval"]["rows"] == 300
    assert 0.2 < summary["positive_rate"] < 0.55
    shard_rows = [pq.read_table(io.BytesIO(before[r])).num_rows for r in rels[3:]]
    assert shard_rows == [1000, 1000, 500]
    day_one = pq.read_table(io.BytesIO(before[rels[0]]))
    assert day_one.equals(generate.generate_partition(0, DAY, 500))

    _write(store)
    assert {rel: store.read_bytes(rel) for rel in rels} == before


def test_write_dataset_drops_stale_corpus_shards(tmp_path) -> None:
    store = ArtifactStore(f"file://{tmp_path}")
    _write(store, corpus_rows=2_500)
    _write(store, corpus_rows=1_500)
    assert store.listdir(layout.corpus("products")) == [layout.part_name(0), layout.part_name(1)]


def test_write_dataset_rejects_bad_names(tmp_path) -> None:
    store = ArtifactStore(f"file://{tmp_path}")
    with pytest.raises(BadInputError):
        generate.write_dataset(store, "../x", 0, DAY, 1, 10, 10, "c", 10, 10)
    assert store.listdir("") == []


# -- command line --------------------------------------------------------------------


def test_cli_prints_the_summary(tmp_path, capsys) -> None:
    code = generate_data.main(
        [
            "--root",
            f"file://{tmp_path}",
            "--dataset",
            "products",
            "--seed",
            "0",
            "--start",
            "2026-01-01",
            "--days",
            "1",
            "--train-rows",
            "200",
            "--eval-rows",
            "100",
            "--corpus",
            "products",
            "--corpus-rows",
            "300",
            "--corpus-shard-rows",
            "100",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["train"][0]["rows"] == 200
    assert len(summary["corpus"]["shards"]) == 3


@pytest.mark.parametrize(
    "bad",
    [
        ["--days", "0"],
        ["--start", "2026-02-30"],
        ["--dataset", "a/b"],
        ["--seed", "x"],
        ["--unknown", "1"],
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(tmp_path, capsys, bad: list[str]) -> None:
    args = [
        "--root",
        f"file://{tmp_path}",
        "--dataset",
        "products",
        "--start",
        "2026-01-01",
        "--corpus",
        "products",
        "--corpus-rows",
        "10",
    ]
    code = generate_data.main(args + bad)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("generate_data: error: ")
    assert err.count("\n") == 1


def test_cli_defaults_are_the_demo_data_set(tmp_path, capsys, monkeypatch) -> None:
    """Only sizes given: data set and corpus ``products``, two days from 2026-01-01 (what
    ``make demo`` and the DAGs' Params expect), into the jobs' default artifact root."""
    monkeypatch.setenv("EMBEDFRESH_ARTIFACT_ROOT", f"file://{tmp_path}")
    sizes = ["--train-rows", "50", "--eval-rows", "40", "--corpus-rows", "30"]
    assert generate_data.main(sizes) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [p["day"] for p in summary["train"]] == ["2026-01-01", "2026-01-02"]
    store = ArtifactStore(f"file://{tmp_path}")
    assert store.listdir(layout.train_partitions("products")) == [
        "dt=2026-01-01",
        "dt=2026-01-02",
    ]
    assert store.listdir(layout.corpus("products")) == [layout.part_name(0)]
