"""Judgments as data (docs/DATA.md) and the ranking metrics scored on them.

The metrics are checked against values worked out by hand, complete judgments against
condensed lists; the reader refuses each malformed table naming the file and a row; the
pool's order does not depend on how the files list the queries; the generator's complete
judgments are its own relevance model, pair by pair.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data import generate
from embedfresh.ml.data.generate import parquet_bytes
from embedfresh.ml.data.judgments import pool_order, read_judgments, write_spec
from embedfresh.ml.ranking import score_rankings


def _write(store: ArtifactStore, rows: dict, complete: bool, name: str = "part-00000.parquet"):
    store.write_bytes(f"{layout.judgments('d')}/{name}", parquet_bytes(pa.table(rows)))
    write_spec(store, "d", complete, "c")


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(f"file://{tmp_path}")


def test_ndcg_recall_mrr_by_hand_on_complete_judgments(store: ArtifactStore) -> None:
    # One query, documents "a" (3), "b" (1), "c" (2); everything else grade 0.
    _write(store, {"query_id": [7, 7, 7], "query": ["q"] * 3, "doc_id": ["a", "b", "c"],
                   "grade": [3, 1, 2]}, complete=True)  # fmt: skip
    j = read_judgments(store, "d", "string")
    assert j.complete and j.corpus == "c" and list(j.query_ids) == [7]
    ranked = [np.array(["x", "c", "a", "y"])]  # 0, 2, 3, 0
    m = score_rankings(j, ranked=ranked)
    dcg = 2 / math.log2(3) + 3 / math.log2(4)
    ideal = 3 + 2 / math.log2(3) + 1 / math.log2(4)
    assert m["ndcg_at_10"][0] == pytest.approx(dcg / ideal)
    assert m["recall_at_10"][0] == pytest.approx(2 / 3)
    assert m["recall_at_100"][0] == pytest.approx(2 / 3)
    assert m["mrr_at_10"][0] == pytest.approx(1 / 2)
    assert m["judged_at_10"][0] == 1.0
    perfect = score_rankings(j, ranked=[np.array(["a", "c", "b"])])
    assert perfect["ndcg_at_10"][0] == pytest.approx(1.0)


def test_incomplete_judgments_score_the_condensed_list(store: ArtifactStore) -> None:
    """Unjudged documents are removed before scoring: the model's order of what was
    judged decides, and judged@10 says how much of its top 10 was judged."""
    _write(store, {"query_id": [1, 1, 1], "query": ["q"] * 3, "doc_id": [10, 20, 30],
                   "grade": [0, 2, 0]}, complete=False)  # fmt: skip
    j = read_judgments(store, "d", "int64")
    docs, grades = j.of(0)
    assert docs.tolist() == [10, 20, 30] and grades.tolist() == [0, 2, 0]
    # Scores in the order of docs: 20 ranks second among the judged ones.
    m = score_rankings(
        j, ranked=[np.array([99, 10, 98, 20])], judged_scores=[np.array([0.9, 0.5, 0.1])]
    )
    assert m["ndcg_at_10"][0] == pytest.approx((2 / math.log2(3)) / 2)
    assert m["mrr_at_10"][0] == pytest.approx(1 / 2)
    assert m["judged_at_10"][0] == pytest.approx(2 / 4)
    with pytest.raises(ValueError, match="condensed"):
        score_rankings(j, ranked=[np.array([10])])


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ({"query_id": [1, 1], "query": ["q", "q"], "doc_id": [5, 5], "grade": [1, 2]},
         r"\(query_id=1, doc_id=5\) is judged twice \(row 1 of file://"),
        ({"query_id": [1, 1], "query": ["q", "r"], "doc_id": [5, 6], "grade": [1, 2]},
         r"query_id 1 has two texts \('r' at row 1 of file://"),
        ({"query_id": [1], "query": ["q"], "doc_id": [5], "grade": [4]},
         r"part-00000.parquet: grade 4 at row 0 is outside 0-3"),
        ({"query_id": [1, 2], "query": ["q", "  "], "doc_id": [5, 6], "grade": [1, 1]},
         r"part-00000.parquet: an empty query text at row 1"),
        ({"query_id": [1], "query": ["q"], "doc_id": ["sku-5"], "grade": [1]},
         r"part-00000.parquet: doc_id is string but the corpus's ids are int64"),
        ({"query_id": [1], "query": ["q"], "doc_id": [5]},
         r"missing columns \['grade'\]"),
        ({"query_id": [1, 2], "query": ["q", None], "doc_id": [5, 6], "grade": [1, 1]},
         r"1 null values in query, the first at row 1"),
        ({"query_id": [1], "query": ["q"], "doc_id": [5], "grade": [0]},
         r"no query has a document of grade > 0"),
    ],
)  # fmt: skip
def test_malformed_judgments_are_refused_naming_the_file_and_row(
    store: ArtifactStore, rows: dict, message: str
) -> None:
    _write(store, rows, complete=False)
    with pytest.raises(BadInputError, match=message):
        read_judgments(store, "d", "int64")


def test_the_pool_order_is_the_ids_hash_not_the_files(store: ArtifactStore) -> None:
    ids = np.arange(1000, 1200, dtype=np.int64)
    rows = {"query_id": ids, "query": [f"q{i}" for i in ids], "doc_id": ids, "grade": [1] * 200}
    _write(store, rows, complete=True)
    forward = read_judgments(store, "d").query_ids
    store.remove(f"{layout.judgments('d')}/part-00000.parquet")
    rev = {k: list(v)[::-1] for k, v in rows.items()}
    _write(store, {k: v[:100] for k, v in rev.items()}, complete=True, name="part-00000.parquet")
    _write(store, {k: v[100:] for k, v in rev.items()}, complete=True, name="part-00001.parquet")
    assert np.array_equal(read_judgments(store, "d").query_ids, forward)
    assert not np.array_equal(forward, np.sort(forward))  # shuffled, not sorted by id
    # A query added later leaves the others' order as it was.
    extended = pool_order(np.concatenate([ids, [5000]]))
    assert [i for i in np.concatenate([ids, [5000]])[extended] if i != 5000] == forward.tolist()


def test_complete_judgments_are_the_generators_relevance_model_pair_by_pair() -> None:
    table = generate.generate_judgments(0, 40, 300)
    qid, doc, grade = (table.column(c).to_numpy() for c in ("query_id", "doc_id", "grade"))
    assert grade.min() >= 1 and grade.max() <= 3  # grade-0 rows are not stored
    # Every product of the corpus graded for every query, by the same expected logit the
    # labels are drawn from: recompute a few pairs one by one.
    q = generate._sample_queries(generate._rng(0, "judged"), 40, np.ones(generate._N_CAT))
    cat = generate._catalogue(0)
    rng = np.random.default_rng(5)
    for i, p in zip(rng.integers(0, 40, 60), rng.integers(0, 300, 60), strict=True):
        one = generate._subset(cat.products, np.array([p]))
        logit = generate._expected_logit(one, q, np.array([i]), np.zeros(generate._N_CAT, bool))
        want = int(generate.grade_of(generate._sigmoid(logit))[0])
        hit = (qid == generate._JUDGED_QUERY_ID_BASE + i) & (doc == cat.ids[p])
        assert (int(grade[hit][0]) if hit.any() else 0) == want
    # The same arguments, the same bytes.
    assert parquet_bytes(table) == parquet_bytes(generate.generate_judgments(0, 40, 300))
