"""A search team's own data set, built in the test and unlike the demo's in every way
the contract allows: string SKUs in several scripts, no numeric features, queries with
string ids, documents referenced by their corpus id (no inline text), graded labels, and
a click log of positive pairs only.

Each document is a product in one script: a Latin brand and four words of its script.
A query names two of its target's words; the judged candidates are the target (grade 3),
documents sharing one of the words (grade 1) and unrelated ones (grade 0). Retrieval is
learnable from it (the words a query shares with its target), and a random encoder
ranks it only roughly.
"""

from __future__ import annotations

import datetime as dt
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedfresh.core import layout
from embedfresh.core.storage import ArtifactStore

#: Alphabets BERT's uncased WordPiece has pieces for (accents are stripped).
SCRIPTS = {
    "de": "abcdefghiklmnoprstuwzäöü",
    "el": "αβγδεζηθικλμνξοπρστυφχψω",
    "ru": "абвгдежзиклмнопрстуфхцчшэюя",
    "ar": "ابتثجحخدذرزسشصضطعغفقكلمنهوي",
    "hi": "कखगघचछजटडणतथदधनपबभमयरलवशसह",
    "zh": "的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年得就那要下以生会自可",
}
BRANDS = ["Acme", "Zenit", "Orbis", "Nordlys", "Kappa", "Helios"]
WORDS_PER_SCRIPT = 40
WORDS_PER_DOC = 4
CORPUS = "skus"
DAY = dt.date(2026, 1, 1)


def _words(rng: np.random.Generator, alphabet: str, n: int) -> list[str]:
    out: set[str] = set()
    while len(out) < n:
        size = int(rng.integers(2, 4)) if alphabet == SCRIPTS["zh"] else int(rng.integers(4, 8))
        out.add("".join(rng.choice(list(alphabet), size)))
    return sorted(out)


class TeamData:
    """The corpus (``docs``: id -> text, ``words``: id -> its words) and query sampling."""

    def __init__(self, seed: int = 0, docs_per_script: int = 100) -> None:
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.ids: list[str] = []
        self.text: dict[str, str] = {}
        self.words: dict[str, list[str]] = {}
        for script, alphabet in SCRIPTS.items():
            vocab = _words(rng, alphabet, WORDS_PER_SCRIPT)
            for i in range(docs_per_script):
                sku = f"SKU-{script.upper()}-{i:04d}-{vocab[i % len(vocab)][:2]}"
                words = list(rng.choice(vocab, WORDS_PER_DOC, replace=False))
                brand = BRANDS[int(rng.integers(len(BRANDS)))]
                self.ids.append(sku)
                self.words[sku] = words
                self.text[sku] = f"{brand} {' '.join(words)}"
        self.by_word: dict[str, list[str]] = {}
        for sku, words in self.words.items():
            for w in words:
                self.by_word.setdefault(w, []).append(sku)

    def query(self, target: str) -> str:
        return " ".join(self.rng.choice(self.words[target], 2, replace=False))

    def judged(self, target: str, query: str) -> list[tuple[str, int]]:
        """The target (grade 3), up to three documents sharing a query word (grade 1),
        three unrelated ones (grade 0)."""
        words = query.split()
        near = sorted({s for w in words for s in self.by_word[w]} - {target})
        near = list(self.rng.permutation(near)[:3]) if near else []
        far = [s for s in self.rng.permutation(self.ids)[:12] if s != target and s not in near]
        return [(target, 3), *[(s, 1) for s in near], *[(s, 0) for s in far[:3]]]


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def write_team(store: ArtifactStore, dataset: str, clicks: str, seed: int = 0) -> TeamData:
    """Write corpus :data:`CORPUS` (two shards), ``dataset`` (graded training pairs of
    :data:`DAY`, judgments naming the corpus) and ``clicks`` (the click log's positive
    pairs of :data:`DAY`, the same judgments)."""
    from embedfresh.ml.data.judgments import write_spec

    team = TeamData(seed)
    half = len(team.ids) // 2
    for index, part in enumerate((team.ids[:half], team.ids[half:])):
        table = pa.table({"id": part, "text": [team.text[s] for s in part]})
        store.write_bytes(f"{layout.corpus(CORPUS)}/{layout.part_name(index)}", _parquet(table))

    order = [str(s) for s in team.rng.permutation(team.ids)]
    evaluated, trained = order[:300], order[300:]
    rows = []
    for n, target in enumerate(evaluated):
        q = team.query(target)
        rows += [(n, q, sku, grade) for sku, grade in team.judged(target, q)]
    judgments = pa.table(
        {
            "query_id": pa.array([r[0] for r in rows], pa.int64()),
            "query": [r[1] for r in rows],
            "doc_id": [r[2] for r in rows],
            "grade": pa.array([r[3] for r in rows], pa.int8()),
        }
    )
    for name in (dataset, clicks):
        store.write_bytes(f"{layout.judgments(name)}/{layout.part_name(0)}", _parquet(judgments))
        write_spec(store, name, False, CORPUS)

    graded, clicked = [], []
    for n, target in enumerate(trained * 2):  # each target twice, by other words
        q = team.query(target)
        qid = f"q-{n:05d}-{target[-2:]}"
        graded += [(qid, q, sku, grade) for sku, grade in team.judged(target, q)]
        clicked.append((qid, q, target))
    train = pa.table(
        {
            "query_id": [r[0] for r in graded],
            "query": [r[1] for r in graded],
            "doc_id": [r[2] for r in graded],
            "grade": pa.array([r[3] for r in graded], pa.int8()),
        }
    )
    store.write_bytes(
        f"{layout.dataset_partition(dataset, 'train', DAY)}/part-00000.parquet", _parquet(train)
    )
    log = pa.table(
        {k: [r[i] for r in clicked] for i, k in enumerate(("query_id", "query", "doc_id"))}
    )
    store.write_bytes(
        f"{layout.dataset_partition(clicks, 'train', DAY)}/part-00000.parquet", _parquet(log)
    )
    return team
