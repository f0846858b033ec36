"""A team's own relevance data through the training contract (docs/DATA.md "Training
data"): string SKUs in six scripts referenced by corpus id, no features, graded labels,
and a click log of positive pairs only (tests/team_data.py).

What the reader makes of them, what it refuses at the door (exit 2, naming the file,
the column and the row; nothing written), and each data set through the refresh DAG end
to end: trained (pointwise on grades, contrastive alone on clicks), evaluated, gated,
embedded, indexed, search-checked, released and searched.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfresh.core import layout
from embedfresh.core.config import TrainConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data.reader import id_keys, read_train
from tests.conftest import run_job
from tests.reliability.test_bad_input import assert_one_line_error, snapshot
from tests.team_data import CORPUS, DAY, TeamData, write_team

NEXT = DAY + dt.timedelta(days=1)


@pytest.fixture(scope="module")
def team_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, TeamData]:
    path = tmp_path_factory.mktemp("team") / "store"
    root = f"file://{path}"
    return root, write_team(ArtifactStore(root), "team", "clicks")


def test_graded_skus_take_their_text_from_the_corpus(team_root) -> None:
    """Graded pairs without ``doc_text``: every row's document text is its SKU's corpus
    text, its label the grade / 3, no features; string query ids key stably."""
    root, team = team_root
    store = ArtifactStore(root)
    ex = read_train(store, "team", DAY, NEXT, (), CORPUS)
    raw = pq.read_table(Path(root.removeprefix("file://")) / _partition("team"))
    assert (ex.kind, len(ex), ex.features.shape) == ("graded", raw.num_rows, (raw.num_rows, 0))
    assert ex.products == [team.text[s] for s in raw.column("doc_id").to_pylist()]
    assert np.array_equal(ex.labels, raw.column("grade").to_numpy() / np.float32(3))
    assert len({t.split()[1][0] for t in ex.products}) >= 6  # six scripts' first letters
    assert np.array_equal(ex.query_ids, id_keys(raw.column("query_id")))
    assert len(np.unique(ex.query_ids)) == len(set(raw.column("query_id").to_pylist()))


def test_inline_text_where_a_row_has_it_the_corpus_s_where_it_is_null(team_root) -> None:
    root, team = team_root
    store = ArtifactStore(root)
    table = pq.read_table(Path(root.removeprefix("file://")) / _partition("team"))
    own = [f"own text {i}" if i % 2 else None for i in range(table.num_rows)]
    _write(store, _partition("mixed"), table.append_column("doc_text", pa.array(own, pa.string())))
    ex = read_train(store, "mixed", DAY, NEXT, (), CORPUS)
    docs = table.column("doc_id").to_pylist()
    assert ex.products == [t or team.text[d] for t, d in zip(own, docs, strict=True)]
    assert ex.texts_from_corpus == sum(t is None for t in own)


def test_a_click_log_is_positive_pairs(team_root) -> None:
    root, team = team_root
    ex = read_train(ArtifactStore(root), "clicks", DAY, NEXT, (), CORPUS)
    assert ex.kind == "positive" and (ex.labels == 1).all() and ex.missing_documents == 0


def test_contrastive_training_on_clicks_resumes_bit_exactly(team_root) -> None:
    """The contrastive objective alone keeps the resume guarantee: a run SIGKILLed mid-way
    and run again ends with the weights of an uninterrupted one."""
    from tests.test_train_resume import train_until_killed, weights_sha

    root, _ = team_root
    sets = ("dataset=clicks", f"data_interval_start={DAY}", "epochs=2", "checkpoint_every=5",
            "log_every=1", "init=base")  # fmt: skip
    whole = run_job("train", f"artifact_root={root}", "run_id=clicks-whole", *sets)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert json.loads(whole.stdout.strip().splitlines()[-1])["steps"] == 36  # 600 / 32 x 2
    train_until_killed(root, "clicks-killed", 17, sets)
    again = run_job("train", f"artifact_root={root}", "run_id=clicks-killed", *sets)
    assert again.returncode == 0, again.stderr[-3000:]
    assert 0 < json.loads(again.stdout.strip().splitlines()[-1])["resumed_from"]["step"] <= 17
    assert weights_sha(root, "clicks-killed") == weights_sha(root, "clicks-whole")
    version = Path(root.removeprefix("file://")) / "models/tiny/versions/clicks-whole"
    meta = json.loads((version / "model.json").read_text())
    assert (meta["labels"], meta["head_trained"]) == ("positive", False)


# -- errors at the door ---------------------------------------------------------------


def _partition(dataset: str) -> str:
    return f"{layout.dataset_partition(dataset, 'train', DAY)}/part-00000.parquet"


def _write(store: ArtifactStore, rel: str, table: pa.Table) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.write_bytes(rel, buf.getvalue())


def _set(table: pa.Table, name: str, values: list | pa.Array) -> pa.Table:
    array = values if isinstance(values, pa.Array) else pa.array(values)
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, array)
    return table.append_column(name, array)


def _edit(row: int, name: str, value: object) -> Callable[[pa.Table], pa.Table]:
    def edit(table: pa.Table) -> pa.Table:
        values = table.column(name).to_pylist()
        values[row] = value
        return _set(table, name, pa.array(values, table.column(name).type))

    return edit


#: case -> (edit of the graded partition, extra TrainConfig settings, words the error has)
BAD: dict[str, tuple[Callable[[pa.Table], pa.Table], dict, list[str]]] = {
    "doc-not-in-corpus": (
        _edit(5, "doc_id", "SKU-XX-9999"),
        {},
        ["column doc_id", "1 training rows", "'SKU-XX-9999'", "at row 5 of", "max_missing"],
    ),
    "grade-outside-0-3": (
        _edit(11, "grade", 4),
        {},
        ["column grade must be 0-3, got 4 at row 11 of"],
    ),
    "declared-feature-missing": (
        lambda t: t,
        {"features": [["price", "log1p"]]},
        ["wrong schema in", "missing columns ['price']"],
    ),
    "declared-feature-not-numeric": (
        lambda t: _set(t, "price", ["cheap"] * t.num_rows),
        {"features": [["price", "log1p"]]},
        ["column price is string, expected a number"],
    ),
    "undeclared-feature": (
        lambda t: _set(t, "margin", [0.5] * t.num_rows),
        {},
        ["columns ['margin'] are not declared features"],
    ),
    "fractional-grade": (
        lambda t: _set(t, "grade", pa.array([2.0] * 20 + [2.5] * (t.num_rows - 20))),
        {},
        ["column grade must be 0-3, got 2.5 at row 20 of"],
    ),
    "empty-query": (_edit(7, "query", "  "), {}, ["column query is empty at row 7 of"]),
    "empty-doc-text": (
        lambda t: _edit(3, "doc_text", "")(_set(t, "doc_text", ["inline text"] * t.num_rows)),
        {},
        ["column doc_text is empty at row 3 of"],
    ),
    "integer-ids-of-a-string-corpus": (
        lambda t: _set(t, "doc_id", pa.array(range(t.num_rows), pa.int64())),
        {},
        ["column doc_id is an integer", "corpus 'skus'", "ids are strings"],
    ),
    "label-and-grade": (
        lambda t: _set(t, "label", pa.array([1] * t.num_rows, pa.int8())),
        {},
        ["has both label and grade"],
    ),
    "unknown-transform": (lambda t: t, {"features": [["price", "sqrt"]]}, ["Input should be"]),
    "positive-pairs-without-contrastive": (
        lambda t: t.drop_columns(["grade"]),
        {"contrastive_weight": 0},
        ["positive pairs only", "contrastive_weight is 0"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_the_contract_is_checked_before_any_write(team_root, case: str) -> None:
    """Each a data set of its own: its partition the graded one, edited. Training refuses
    it (BadInputError: exit 2), naming what is wrong and where, and writes nothing."""
    from embedfresh.jobs.train import train

    root, _ = team_root
    store = ArtifactStore(root)
    edit, settings, words = BAD[case]
    dataset = f"bad-{case}"
    table = pq.read_table(Path(root.removeprefix("file://")) / _partition("team"))
    _write(store, _partition(dataset), edit(table))
    store.write_bytes(
        f"{layout.judgments(dataset)}/judgments.json",
        store.read_bytes(f"{layout.judgments('team')}/judgments.json"),
    )
    before = snapshot(Path(root.removeprefix("file://")))
    with pytest.raises((BadInputError, ValueError)) as caught:
        cfg = TrainConfig(
            artifact_root=root, run_id=dataset, dataset=dataset, data_interval_start=DAY, **settings
        )
        train(cfg)
    message = str(caught.value)
    for word in words:
        assert word in message, message
    if "row" in " ".join(words):
        assert _partition(dataset) in message, message
    assert snapshot(Path(root.removeprefix("file://"))) == before


def test_the_train_job_exits_2_on_a_bad_contract_row(team_root) -> None:
    """The job's own exit code and one-line error for one of them, in a process."""
    root, _ = team_root
    result = run_job(
        "train",
        f"artifact_root={root}",
        "run_id=exit-2",
        "dataset=bad-grade-outside-0-3",
        f"data_interval_start={DAY}",
    )
    assert_one_line_error(result, "train", "column grade must be 0-3", "row 11 of file://")


# -- end to end through the refresh DAG -----------------------------------------------


@pytest.mark.parametrize("dataset", ["team", "clicks"])
def test_a_team_data_set_through_the_refresh_dag(
    dataset: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The refresh DAG with ``dataset`` and corpus ``skus``: trained from the base
    weights (graded pairs: pointwise and contrastive; clicks: contrastive alone), gated
    against the base with a decision, the SKUs embedded, indexed, search-checked (judged,
    not NOT_MEASURED), released, and searchable by a query in Greek."""
    from embedfresh.core.releases import live_release
    from tests.test_dags import SOURCES, run_dag

    source = next(s for s in SOURCES if s.dag_id == "embedding_model_refresh" and s.file)
    root = f"file://{tmp_path / 'artifacts'}"  # the root run_dag gives a DAG file
    store = ArtifactStore(root)
    team = write_team(store, "team", "clicks")
    conf = {"dataset": dataset, "corpora": [CORPUS], "epochs": 2, "day": DAY.isoformat()}
    run = run_dag(source, tmp_path, request, conf=conf)
    facts, run_id = run.facts, run.facts["run_id"]
    assert all(state == "success" for _, _, state in facts["tasks"]), run.output

    trained = store.read_json(layout.report("tiny", run_id, "train"))
    objective = "contrastive" if dataset == "clicks" else "pointwise"
    assert (trained["objective"], trained["features"]) == (objective, [])
    assert trained["labels"] == ("positive" if dataset == "clicks" else "graded")
    gate = store.read_json(layout.report("tiny", run_id, "gate"))
    assert gate["verdict"] == "PASS" and gate["reference"]["version"] == "baseline"
    (ndcg,) = gate["metrics"]
    assert ndcg["metric"] == "ndcg_at_10"
    if dataset == "clicks":  # learning: contrastive training beats its start, decided
        assert ndcg["ci_low"] > 0, ndcg

    release = live_release(store, "tiny")
    assert release is not None and release.version == run_id
    checked = store.read_json(layout.release("tiny", run_id))["corpora"][CORPUS]["search_check"]
    assert checked["verdict"] == "PASS", checked
    # Judged on the team's own judgments over its SKUs: measured, not NOT_MEASURED.
    assert checked["queries_judged"] == checked["queries"] == 300, json.dumps(checked)
    assert checked["ndcg_at_10"] > 0.5 and checked["ann_recall"] >= checked["min_ann_recall"]

    greek = next(s for s in team.ids if s.startswith("SKU-EL-"))
    query = " ".join(team.words[greek][:2])
    out = run_job("search", f"artifact_root={root}", f"query={query}", "k=5")
    assert out.returncode == 0, out.stderr[-2000:]
    assert greek in out.stdout, out.stdout
