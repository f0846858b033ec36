"""A team's labels in the shapes teams have, imported as judgments (issue 47 item 4):
hand-written files of each shape give the expected rows cell by cell, the evaluations'
reader reads them back, and bad inputs exit 2 naming the file and a row, writing nothing.

The job runs in this process through the CLI's own ``run_job`` (argument parsing, exit
codes, result record), as ``python -m embedfresh.jobs.import_labels`` does."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfresh.core import layout
from embedfresh.core.cli import run_job
from embedfresh.core.config import ImportLabelsConfig
from embedfresh.core.shards import read_corpus_shard
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs.import_labels import import_labels
from embedfresh.ml.data.judgments import corpus_of, read_judgments


def run(root: Path, *sets: str) -> int:
    argv = [f"--set=artifact_root={root.as_uri()}", "--set=run_id=imp"]
    return run_job("import_labels", ImportLabelsConfig, import_labels,
                   argv + [f"--set={s}" for s in sets])  # fmt: skip


def written(root: Path, dataset: str) -> list[dict]:
    return pq.read_table(root / layout.judgments(dataset) / "part-00000.parquet").to_pylist()


def h63(ref: str) -> int:
    """The documented id of a string query id: BLAKE2b-64, top bit cleared."""
    return int.from_bytes(hashlib.blake2b(ref.encode(), digest_size=8).digest(), "big") >> 1


def corpus(root: Path, name: str, ids: list, texts: list[str] | None = None) -> None:
    texts = texts or [f"text of {i}" for i in ids]
    (root / layout.corpus(name)).mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": texts}),
                   root / layout.corpus(name) / "part-00000.parquet")  # fmt: skip


def jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "store").mkdir()
    return tmp_path / "store"


def esci_file(tmp_path: Path, **overrides) -> Path:
    rows = {
        "example_id": [0, 1, 2, 3, 4, 5],
        "query": ["zapatos rojos", "zapatos rojos", "赤い靴", "赤い靴", "red shoes", "red shoes"],
        "query_id": [7, 7, 12, 12, 3, 3],
        "product_id": ["B0ZAP1", "B0ZAP2", "B0AKA1", "B0ZAP1", "B0RED1", "B0RED2"],
        "product_locale": ["es", "es", "jp", "jp", "us", "us"],
        "esci_label": ["E", "I", "S", "C", "E", "E"],
        "split": ["test", "test", "test", "test", "test", "train"],
    }
    rows.update(overrides)
    rows = {k: v for k, v in rows.items() if v is not None}
    path = tmp_path / "examples.parquet"
    pq.write_table(pa.table(rows), path)
    return path


def test_esci_judgments_of_a_split_are_graded_e3_s2_c1_i0(root, tmp_path):
    corpus(root, "catalog", ["B0ZAP1", "B0ZAP2", "B0AKA1", "B0RED1", "B0RED2"])
    path = esci_file(tmp_path)
    assert run(root, f"source={path}", "shape=esci", "dataset=esci", "corpus=catalog") == 0
    assert written(root, "esci") == [
        {"query_id": 3, "query": "red shoes", "doc_id": "B0RED1", "grade": 3},
        {"query_id": 7, "query": "zapatos rojos", "doc_id": "B0ZAP1", "grade": 3},
        {"query_id": 7, "query": "zapatos rojos", "doc_id": "B0ZAP2", "grade": 0},
        {"query_id": 12, "query": "赤い靴", "doc_id": "B0AKA1", "grade": 2},
        {"query_id": 12, "query": "赤い靴", "doc_id": "B0ZAP1", "grade": 1},
    ]
    spec = json.loads((root / layout.judgments("esci") / "judgments.json").read_text())
    assert spec == {"complete": False, "corpus": "catalog"}
    judged = read_judgments(ArtifactStore(root.as_uri()), "esci", "string")
    assert sorted(judged.query_ids.tolist()) == [3, 7, 12] and not judged.complete
    report = json.loads((root / "runs/tiny/imp/reports/import-esci.json").read_text())
    assert report["grades"] == {"0": 1, "1": 1, "2": 1, "3": 2}
    assert report["missing_from_corpus"] == 0 and not report["corpus_from_source"]
    # One locale only; a re-import replaces the judgments.
    assert run(root, f"source={path}", "shape=esci", "dataset=esci", "corpus=catalog",
               "locale=jp") == 0  # fmt: skip
    assert [r["doc_id"] for r in written(root, "esci")] == ["B0AKA1", "B0ZAP1"]


def beir_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "nfcorpus"
    jsonl(folder / "corpus.jsonl", [
        {"_id": "MED-10", "title": "Statin use", "text": "Breast cancer survival.", "metadata": {}},
        {"_id": "МЕД-2", "title": "", "text": "Витамин D и здоровье."},
        {"_id": "医-3", "title": "食事", "text": "野菜と果物。"},
    ])  # fmt: skip
    jsonl(folder / "queries.jsonl", [
        {"_id": "PLAIN-2", "text": "Do cholesterol statin drugs cause breast cancer?"},
        {"_id": "PLAIN-12", "text": "витамин d"},
    ])  # fmt: skip
    (folder / "qrels").mkdir()
    (folder / "qrels/test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nPLAIN-2\tMED-10\t2\nPLAIN-2\t医-3\t0\nPLAIN-12\tМЕД-2\t1\n"
    )
    return folder


def test_a_beir_folder_gives_its_corpus_and_judgments_with_string_ids(root, tmp_path):
    folder = beir_folder(tmp_path)
    assert run(root, f"source={folder}", "shape=beir", "dataset=nf", "corpus=nfcorpus") == 0
    ids, texts = read_corpus_shard(
        ArtifactStore(root.as_uri()), "corpora/nfcorpus/part-00000.parquet"
    )
    assert ids.tolist() == ["MED-10", "МЕД-2", "医-3"]
    assert texts == [
        "Statin use. Breast cancer survival.",
        "Витамин D и здоровье.",
        "食事. 野菜と果物。",
    ]
    rows = written(root, "nf")
    expected = [
        {"query_id": h63("PLAIN-2"), "query": "Do cholesterol statin drugs cause breast cancer?",
         "doc_id": "MED-10", "grade": 2, "query_ref": "PLAIN-2"},
        {"query_id": h63("PLAIN-2"), "query": "Do cholesterol statin drugs cause breast cancer?",
         "doc_id": "医-3", "grade": 0, "query_ref": "PLAIN-2"},
        {"query_id": h63("PLAIN-12"), "query": "витамин d", "doc_id": "МЕД-2", "grade": 1,
         "query_ref": "PLAIN-12"},
    ]  # fmt: skip
    assert rows == sorted(expected, key=lambda r: (r["query_id"], r["doc_id"]))
    before = (root / layout.judgments("nf") / "part-00000.parquet").read_bytes()
    # A re-run after a kill that left the corpus's first part only: it finishes the
    # corpus and writes the same judgments.
    assert run(root, f"source={folder}", "shape=beir", "dataset=nf2", "corpus=nf2",
               "corpus_shard_rows=2") == 0  # fmt: skip
    (root / "corpora/nf2/part-00001.parquet").unlink()
    assert run(root, f"source={folder}", "shape=beir", "dataset=nf2", "corpus=nf2",
               "corpus_shard_rows=2") == 0  # fmt: skip
    report = json.loads((root / "runs/tiny/imp/reports/import-nf2.json").read_text())
    assert report["corpus_from_source"] and report["corpus_parts"] == 2
    assert (root / "corpora/nf2/part-00001.parquet").exists()
    assert (root / layout.judgments("nf2") / "part-00000.parquet").read_bytes() == before


def test_integer_ids_written_plainly_stay_integers_and_zero_padded_ones_stay_strings(
    root, tmp_path
):
    folder = tmp_path / "msmarco"
    jsonl(folder / "corpus.jsonl", [{"_id": "0", "text": "a"}, {"_id": "15", "text": "b"}])
    jsonl(folder / "queries.jsonl", [{"_id": "1048585", "text": "what is x"}])
    (folder / "qrels").mkdir()
    (folder / "qrels/dev.tsv").write_text("query-id\tcorpus-id\tscore\n1048585\t15\t1\n")
    assert run(root, f"source={folder}", "shape=beir", "dataset=mm", "corpus=mm", "split=dev") == 0
    assert written(root, "mm") == [{"query_id": 1048585, "query": "what is x", "doc_id": 15,
                                    "grade": 1}]  # fmt: skip
    ids, _ = read_corpus_shard(ArtifactStore(root.as_uri()), "corpora/mm/part-00000.parquet")
    assert ids.dtype == np.int64 and ids.tolist() == [0, 15]
    # "007" is not 7: a corpus of such ids keeps strings.
    jsonl(folder / "corpus.jsonl", [{"_id": "007", "text": "a"}, {"_id": "15", "text": "b"}])
    (folder / "qrels/dev.tsv").write_text("query-id\tcorpus-id\tscore\n1048585\t007\t1\n")
    assert (
        run(root, f"source={folder}", "shape=beir", "dataset=mm2", "corpus=mm2", "split=dev") == 0
    )
    assert written(root, "mm2")[0]["doc_id"] == "007"


def test_each_query_id_is_mapped_alone_so_one_added_later_moves_no_other(root, tmp_path):
    corpus(root, "c", [1, 2, 3])
    log = tmp_path / "c.csv"
    log.write_text("query_id,query,doc_id,event\n42,boots,1,click\n")
    assert run(root, f"source={log}", "shape=clicks", "dataset=d", "corpus=c") == 0
    assert written(root, "d") == [{"query_id": 42, "query": "boots", "doc_id": 1, "grade": 1}]
    log.write_text("query_id,query,doc_id,event\n42,boots,1,click\nq-7,0042,2,purchase\n")
    assert run(root, f"source={log}", "shape=clicks", "dataset=d", "corpus=c") == 0
    assert sorted(
        (r["query_id"], r["query"], r["query_ref"]) for r in written(root, "d")
    ) == sorted([(42, "boots", "42"), (h63("q-7"), "0042", "q-7")])


def test_a_document_a_change_set_added_is_in_the_corpus(root, tmp_path):
    corpus(root, "c", ["a", "b"])
    (root / layout.corpus_changes("c")).mkdir(parents=True)
    pq.write_table(pa.table({"op": ["upsert", "delete"], "id": ["n", "b"], "text": ["new", None]}),
                   root / layout.change_set("c", "2026-12-07T00"))  # fmt: skip
    log = tmp_path / "c.csv"
    log.write_text("query,doc_id,event\nshoes,n,click\nshoes,a,shown\n")
    assert run(root, f"source={log}", "shape=clicks", "dataset=d", "corpus=c") == 0
    log.write_text("query,doc_id,event\nshoes,n,click\nshoes,b,shown\n")
    assert run(root, f"source={log}", "shape=clicks", "dataset=d", "corpus=c") == 2


def test_a_click_log_grades_each_pair_by_its_strongest_event(root, tmp_path):
    corpus(root, "shop", ["sku-1", "sku-2", "sku-3"])
    log = tmp_path / "clicks.csv"
    log.write_text(
        "query,doc_id,event\n"
        "running shoes,sku-1,shown\n"
        "running shoes,sku-1,click\n"
        "running shoes,sku-2,shown\n"
        " running shoes ,sku-1,purchase\n"
        "laufschuhe,sku-3,add_to_cart\n"
        "laufschuhe,sku-3,click\n"
        "laufschuhe,sku-2,Shown\n"
    )
    assert run(root, f"source={log}", "shape=clicks", "dataset=clicks", "corpus=shop") == 0
    expected = [
        {"query_id": h63("running shoes"), "query": "running shoes", "doc_id": "sku-1",
         "grade": 3, "query_ref": "running shoes"},
        {"query_id": h63("running shoes"), "query": "running shoes", "doc_id": "sku-2",
         "grade": 0, "query_ref": "running shoes"},
        {"query_id": h63("laufschuhe"), "query": "laufschuhe", "doc_id": "sku-2", "grade": 0,
         "query_ref": "laufschuhe"},
        {"query_id": h63("laufschuhe"), "query": "laufschuhe", "doc_id": "sku-3", "grade": 2,
         "query_ref": "laufschuhe"},
    ]  # fmt: skip
    assert written(root, "clicks") == sorted(expected, key=lambda r: (r["query_id"], r["doc_id"]))


def test_a_click_log_becomes_a_day_of_training_pairs_graded_or_positive(root, tmp_path):
    """``into=train``: the same labels as one day's training pairs of the contract, the
    source's own query ids kept; ``labels=positive`` keeps the positives without a grade.
    The training reader takes them, their texts from the corpus the data set declares."""
    from embedfresh.ml.data.reader import read_train

    corpus(root, "shop", ["sku-1", "sku-2", "sku-3"], ["Laufschuh rot", "Socke", "Schuh blau"])
    log = tmp_path / "clicks.csv"
    log.write_text(
        "query,doc_id,event\nrunning shoes,sku-1,click\nrunning shoes,sku-2,shown\n"
        "laufschuhe,sku-3,purchase\nlaufschuhe,sku-2,shown\n"
    )
    day = "--set=day=2026-03-01"
    common = [f"source={log}", "shape=clicks", "corpus=shop", "into=train", day[6:]]
    assert run(root, *common, "dataset=graded") == 0
    assert run(root, *common, "dataset=clicks", "labels=positive") == 0
    part = "train/dt=2026-03-01/part-00000.parquet"
    graded = pq.read_table(root / "datasets/graded" / part).to_pylist()
    assert graded == [
        {"query_id": "laufschuhe", "query": "laufschuhe", "doc_id": "sku-2", "grade": 0},
        {"query_id": "laufschuhe", "query": "laufschuhe", "doc_id": "sku-3", "grade": 3},
        {"query_id": "running shoes", "query": "running shoes", "doc_id": "sku-1", "grade": 1},
        {"query_id": "running shoes", "query": "running shoes", "doc_id": "sku-2", "grade": 0},
    ]
    clicked = pq.read_table(root / "datasets/clicks" / part).to_pylist()
    assert clicked == [
        {"query_id": "laufschuhe", "query": "laufschuhe", "doc_id": "sku-3"},
        {"query_id": "running shoes", "query": "running shoes", "doc_id": "sku-1"},
    ]
    assert json.loads((root / "datasets/clicks/dataset.json").read_text()) == {"corpus": "shop"}
    store = ArtifactStore(root.as_uri())
    day0, day1 = dt.date(2026, 3, 1), dt.date(2026, 3, 2)
    pairs = read_train(store, "clicks", day0, day1, (), corpus_of(store, "clicks", None))
    assert (pairs.kind, pairs.products) == ("positive", ["Schuh blau", "Laufschuh rot"])
    pairs = read_train(store, "graded", day0, day1, (), corpus_of(store, "graded", None))
    assert pairs.kind == "graded" and pairs.labels.tolist() == pytest.approx([0, 1, 1 / 3, 0])


def test_training_pairs_of_a_data_set_judged_on_another_corpus_are_refused(root, tmp_path):
    corpus(root, "shop", ["sku-1"])
    corpus(root, "other", ["sku-1"])
    log = tmp_path / "clicks.csv"
    log.write_text("query,doc_id,event\nshoes,sku-1,click\n")
    assert run(root, f"source={log}", "shape=clicks", "dataset=d", "corpus=shop") == 0
    train = [f"source={log}", "shape=clicks", "dataset=d", "into=train", "day=2026-03-01"]
    assert run(root, *train, "corpus=other") == 2
    assert not (root / "datasets/d/train").exists()
    assert run(root, *train[:-1]) == 2  # into=train needs its day
    # and judgments of a data set whose pairs name another corpus's documents
    assert run(root, *train, "corpus=shop", "dataset=e") == 0
    assert run(root, f"source={log}", "shape=clicks", "dataset=e", "corpus=other") == 2
    assert not (root / "datasets/e/judgments").exists()


BAD = {
    "an ESCI label other than E/S/C/I, the file's row named past another split's": (
        "esci",
        lambda t: esci_file(
            t,
            split=["train", "test", "test", "test", "test", "test"],
            esci_label=["E", "I", "X", "C", "E", "E"],
        ),
        r"esci_label 'X' at row 2",
    ),
    "an ESCI locale asked of a file without product_locale": (
        "esci",
        lambda t: esci_file(t, product_locale=None),
        r"locale 'es' asked, but no product_locale column",
    ),
    "an ESCI file without product_id": (
        "esci",
        lambda t: esci_file(t, product_id=None),
        r"missing columns \['product_id'\]",
    ),
    "one ESCI query id with two texts": (
        "esci",
        lambda t: esci_file(t, query=["a", "b", "c", "c", "d", "d"]),
        r"query_id 7 has two texts \('b' at row 1 of .*examples.parquet, 'a' at row 0",
    ),
    "a pair judged twice": (
        "esci",
        lambda t: esci_file(
            t, product_id=["B0ZAP1", "B0ZAP1", "B0AKA1", "B0ZAP1", "B0RED1", "B0RED2"]
        ),
        r"\(query_id=7, doc_id='B0ZAP1'\) is judged twice \(row 1 of .*examples.parquet",
    ),
    "a judged document the corpus lacks, the file's row named past another split's": (
        "esci",
        lambda t: esci_file(
            t,
            split=["train", "test", "test", "test", "test", "test"],
            product_id=["B0ZAP1", "B0ZAP2", "B0AKA1", "B0GONE", "B0RED1", "B0RED2"],
        ),
        r"1 judged documents are not in the corpus, the first 'B0GONE' at row 3",
    ),
    "a click log's pair the corpus lacks, named at its first event": (
        "clicks",
        lambda t: _text(
            t / "c.csv",
            "query,doc_id,event\nshoes,sku-1,click\nshoes,sku-9,shown\nshoes,sku-9,click\n",
        ),
        r"the first 'sku-9' at row 1",
    ),
    "a BEIR corpus with an _id twice": (
        "beir",
        lambda t: _beir_corpus(
            t,
            [
                {"_id": "MED-10", "text": "a"},
                {"_id": "МЕД-2", "text": "b"},
                {"_id": "MED-10", "text": "c"},
            ],
        ),
        r"corpus.jsonl: _id 'MED-10' at rows 0 and 2",
    ),
    "an empty query in a click log": (
        "clicks",
        lambda t: _text(t / "c.csv", "query,doc_id,event\nshoes,sku-1,click\n  ,sku-2,click\n"),
        r"an empty query text at row 1",
    ),
    "an unknown click event": (
        "clicks",
        lambda t: _text(t / "c.csv", "query,doc_id,event\nshoes,sku-1,click\nshoes,sku-2,like\n"),
        r"event 'like' at row 1",
    ),
    "a click log's query id with two texts": (
        "clicks",
        lambda t: _text(
            t / "c.csv", "query_id,query,doc_id,event\n5,shoes,sku-1,click\n5,boots,sku-2,click\n"
        ),
        r"query_id 5 has two texts \('shoes' at row 0, 'boots' at row 1\)",
    ),
    "a BEIR score outside 0-3": (
        "beir",
        lambda t: _beir_qrels(t, "PLAIN-2\tMED-10\t2\nPLAIN-12\tМЕД-2\t4\n"),
        r"test.tsv: score 4 at row 1 is outside 0-3",
    ),
    "a BEIR qrel of a query not in queries.jsonl": (
        "beir",
        lambda t: _beir_qrels(t, "PLAIN-2\tMED-10\t2\nPLAIN-99\tМЕД-2\t1\n"),
        r"test.tsv: query-id 'PLAIN-99' at row 1 is not in .*queries.jsonl",
    ),
    "a file of another format": (
        "clicks",
        lambda t: _text(t / "c.xlsx", "query,doc_id,event\n"),
        r"c.xlsx: expected a .parquet, .csv, .tsv or .jsonl file",
    ),
}


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _beir_corpus(tmp_path: Path, rows: list[dict]) -> Path:
    folder = beir_folder(tmp_path)
    jsonl(folder / "corpus.jsonl", rows)
    return folder


def _beir_qrels(tmp_path: Path, rows: str) -> Path:
    folder = beir_folder(tmp_path)
    (folder / "qrels/test.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows)
    return folder


@pytest.mark.parametrize("case", BAD)
def test_bad_labels_exit_2_naming_the_file_and_row_and_write_nothing(case, root, tmp_path, capsys):
    shape, make, message = BAD[case]
    corpus(root, "shop", ["B0ZAP1", "B0ZAP2", "B0AKA1", "B0RED1", "B0RED2", "sku-1", "sku-2"])
    source = make(tmp_path)
    extra = ["locale=es"] if "locale" in case else []
    code = run(root, f"source={source}", f"shape={shape}", "dataset=d", "corpus=shop", *extra)
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert re.search(message, err), err[-2000:]
    assert not (root / "datasets").exists() and not (root / "runs/tiny/imp").exists()
    assert sorted(p.name for p in (root / "corpora").iterdir()) == ["shop"]


def test_an_id_past_int64_is_refused_naming_its_row(root, tmp_path, capsys):
    corpus(root, "c", [1, 2])
    log = _text(
        tmp_path / "c.csv", "query,doc_id,event\nshoes,1,click\nshoes,9999999999999999999,shown\n"
    )
    assert run(root, f"source={log}", "shape=clicks", "dataset=d", "corpus=c") == 2
    assert (
        "'9999999999999999999' at row 1 is not an integer within int64" in capsys.readouterr().err
    )
