"""A team's labels, in the shapes teams have, as judgments (docs/DATA.md "Judgments").

Each converter takes the source's own tables and returns :class:`Converted`: the
judgments' four columns (``query_id``, ``query``, ``doc_id``, ``grade``; ``query_ref``
beside them when a query id was hashed) and, for each row, the source's row it came
from, so every error names a row of the file a person can open:

- :func:`from_esci`: ESCI-style judgments (Amazon's Shopping Queries data set: a
  ``query_id``, ``query``, ``product_id`` and an ``esci_label`` E/S/C/I per row);
- :func:`from_beir`: a BEIR folder's ``queries.jsonl`` and ``qrels/<split>.tsv``
  (MS MARCO, TREC-COVID, NFCorpus and the rest of BEIR come in this layout), and
  :func:`beir_corpus` its ``corpus.jsonl`` as a corpus;
- :func:`from_clicks`: a click log, one row per event on a (query, document), graded by
  the strongest event (:data:`CLICK_GRADES`).

Query ids must be integers in the judgments. Each id is mapped on its own, so an id
added later never renumbers the others: an integer, or a string that is an integer
written plainly (``"42"``, not ``"042"``), is kept; any other string becomes a stable
63-bit integer (its BLAKE2b-64 with the top bit cleared), and the source's own ids are
kept beside them in ``query_ref``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embedfresh.core.exit_codes import BadInputError

#: ESCI's labels and their grades (docs/DATA.md): Exact, Substitute, Complement, Irrelevant.
ESCI_GRADES = {"E": 3, "S": 2, "C": 1, "I": 0}
#: A click log's events and the grade each gives a (query, document): the strongest
#: event over the log wins; a document never shown has no row (unjudged).
CLICK_GRADES = {"shown": 0, "impression": 0, "click": 1, "cart": 2, "add_to_cart": 2,
                "purchase": 3, "order": 3}  # fmt: skip
_PLAIN_INT = re.compile(r"-?(0|[1-9][0-9]{0,18})")
_INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class Converted:
    """Judgments converted from ``where``; ``rows[i]``: the source row of row ``i``."""

    table: pa.Table
    rows: np.ndarray
    where: str


def _strings(column: pa.ChunkedArray | pa.Array) -> list[str]:
    return [str(v) for v in column.to_pylist()]


def _plain_int(value: str) -> int | None:
    """``value`` as an integer when it is one written plainly and within int64."""
    if not _PLAIN_INT.fullmatch(value):
        return None
    number = int(value)
    return number if _INT64[0] <= number <= _INT64[1] else None


def query_ids(refs: list[str], where: str) -> tuple[np.ndarray, bool]:
    """int64 query ids for the source's ids ``refs``, each on its own: a plain integer as
    it is, any other id its BLAKE2b-64 with the top bit cleared; and whether any was
    hashed. Two ids of one integer are refused (never seen at 63 bits, never merged)."""
    mapped: dict[str, int] = {}
    hashed = False
    for ref in dict.fromkeys(refs):
        number = _plain_int(ref)
        if number is None:
            hashed = True
            number = int.from_bytes(hashlib.blake2b(ref.encode(), digest_size=8).digest(), "big")
            number >>= 1
        mapped[ref] = number
    if len(set(mapped.values())) != len(mapped):
        seen: dict[int, str] = {}
        for ref, number in mapped.items():
            if number in seen:
                raise BadInputError(
                    f"{where}: query ids {seen[number]!r} and {ref!r} map to one integer "
                    f"({number}); give integer query ids"
                )
            seen[number] = ref
    return np.array([mapped[r] for r in refs], dtype=np.int64), hashed


def doc_ids(values: list[str], id_type: str | None, where: str, rows: np.ndarray) -> pa.Array:
    """Document ids as the corpus has them: int64 or string; with ``id_type`` None (no
    corpus yet), int64 when every id is an integer written plainly."""
    if id_type == "string":
        return pa.array(values, pa.string())
    numbers = [_plain_int(v) for v in values]
    bad = next((i for i, n in enumerate(numbers) if n is None), None)
    if bad is None:
        return pa.array(numbers, pa.int64())
    if id_type is None:
        return pa.array(values, pa.string())
    raise BadInputError(
        f"{where}: document id {values[bad]!r} at row {int(rows[bad])} is not an integer "
        "within int64, and the corpus's ids are int64"
    )


def _require(table: pa.Table, columns: tuple[str, ...], where: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise BadInputError(f"{where}: missing columns {missing} (has {table.column_names})")
    for name in columns:
        col = table.column(name)
        if col.null_count:
            first = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise BadInputError(f"{where}: a null {name} at row {first}")


def _graded(
    labels: list[str], grades: dict[str, int], column: str, where: str, rows: np.ndarray
) -> np.ndarray:
    out = np.empty(len(labels), dtype=np.int8)
    for i, label in enumerate(labels):
        grade = grades.get(label.strip().lower() if column == "event" else label.strip())
        if grade is None:
            raise BadInputError(
                f"{where}: {column} {label!r} at row {int(rows[i])} is none of {sorted(grades)}"
            )
        out[i] = grade
    return out


def _judgments(
    qids: np.ndarray, queries: list[str], docs: pa.Array, grades: np.ndarray, refs: list[str] | None
) -> pa.Table:
    columns = {
        "query_id": pa.array(qids, pa.int64()),
        "query": pa.array(queries, pa.string()),
        "doc_id": docs,
        "grade": pa.array(grades, pa.int8()),
    }
    if refs is not None:
        columns["query_ref"] = pa.array(refs, pa.string())
    return pa.table(columns)


def from_esci(
    table: pa.Table, where: str, id_type: str | None, split: str | None, locale: str | None
) -> Converted:
    """ESCI rows (``query_id``, ``query``, ``product_id``, ``esci_label``) of ``split``
    (a source without a ``split`` column is read whole) and ``locale`` (which needs the
    ``product_locale`` column), graded E 3, S 2, C 1, I 0."""
    _require(table, ("query_id", "query", "product_id", "esci_label"), where)
    keep = np.ones(table.num_rows, dtype=bool)
    if split is not None and "split" in table.column_names:
        keep &= pc.equal(table.column("split"), split).to_numpy(zero_copy_only=False)
    if locale is not None:
        if "product_locale" not in table.column_names:
            raise BadInputError(f"{where}: locale {locale!r} asked, but no product_locale column")
        keep &= pc.equal(table.column("product_locale"), locale).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(keep)
    if not len(rows):
        raise BadInputError(f"{where}: no rows of split {split!r} and locale {locale!r}")
    table = table.take(pa.array(rows))
    refs = _strings(table.column("query_id"))
    qids, hashed = query_ids(refs, where)
    grades = _graded(_strings(table.column("esci_label")), ESCI_GRADES, "esci_label", where, rows)
    docs = doc_ids(_strings(table.column("product_id")), id_type, where, rows)
    judged = _judgments(
        qids, _strings(table.column("query")), docs, grades, refs if hashed else None
    )
    return Converted(judged, rows, where)


def from_beir(
    queries: pa.Table, qrels: pa.Table, where: tuple[str, str], id_type: str | None
) -> Converted:
    """A BEIR split: ``qrels`` (``query-id``, ``corpus-id``, ``score``) joined to the
    texts of ``queries`` (``_id``, ``text``); a judged query missing from ``queries``
    is refused, naming the qrels row."""
    queries_at, qrels_at = where
    _require(queries, ("_id", "text"), queries_at)
    _require(qrels, ("query-id", "corpus-id", "score"), qrels_at)
    text = dict(zip(_strings(queries.column("_id")), _strings(queries.column("text")), strict=True))
    refs = _strings(qrels.column("query-id"))
    missing = [i for i, ref in enumerate(refs) if ref not in text]
    if missing:
        raise BadInputError(
            f"{qrels_at}: query-id {refs[missing[0]]!r} at row {missing[0]} is not in "
            f"{queries_at} ({len(missing)} such rows)"
        )
    score = qrels.column("score")
    if not pa.types.is_integer(score.type):
        raise BadInputError(f"{qrels_at}: score is {score.type}, expected an integer grade")
    grades = score.to_numpy()
    bad = np.flatnonzero((grades < 0) | (grades > 3))
    if len(bad):
        raise BadInputError(
            f"{qrels_at}: score {int(grades[bad[0]])} at row {int(bad[0])} is outside 0-3 "
            f"({len(bad)} such rows); map the data set's grades to 0-3 first"
        )
    rows = np.arange(qrels.num_rows)
    qids, hashed = query_ids(refs, qrels_at)
    docs = doc_ids(_strings(qrels.column("corpus-id")), id_type, qrels_at, rows)
    judged = _judgments(qids, [text[r] for r in refs], docs, grades, refs if hashed else None)
    return Converted(judged, rows, qrels_at)


def beir_corpus(corpus: pa.Table, where: str) -> pa.Table:
    """A BEIR ``corpus.jsonl`` (``_id``, ``title``, ``text``) as a corpus (``id``,
    ``text``), its title and text joined as the demo's products are (``"title. text"``,
    the text alone without a title), sorted by id; an empty or repeated id is refused."""
    _require(corpus, ("_id", "text"), where)
    ids = _strings(corpus.column("_id"))
    empty = next((i for i, v in enumerate(ids) if not v.strip()), None)
    if empty is not None:
        raise BadInputError(f"{where}: an empty _id at row {empty}")
    first: dict[str, int] = {}
    for row, doc in enumerate(ids):
        if first.setdefault(doc, row) != row:
            raise BadInputError(f"{where}: _id {doc!r} at rows {first[doc]} and {row}")
    body = corpus.column("text").cast(pa.string())
    if "title" in corpus.column_names:
        title = corpus.column("title").cast(pa.string()).fill_null("")
        titled = pc.binary_join_element_wise(title, body, ". ")
        body = pc.if_else(pc.equal(pc.utf8_length(title), 0), body, titled)
    rows = np.arange(corpus.num_rows)
    table = pa.table({"id": doc_ids(ids, None, where, rows), "text": body})
    return table.sort_by("id")


def _one_text_per_query(refs: list[str], queries: list[str], where: str) -> None:
    """A log's rows of one query id say one text (the aggregate keeps one)."""
    first: dict[str, int] = {}
    for row, (ref, query) in enumerate(zip(refs, queries, strict=True)):
        if not query:
            raise BadInputError(f"{where}: an empty query text at row {row}")
        seen = first.setdefault(ref, row)
        if queries[seen] != query:
            raise BadInputError(
                f"{where}: query_id {ref} has two texts ({queries[seen]!r} at row {seen}, "
                f"{query!r} at row {row})"
            )


def from_clicks(table: pa.Table, where: str, id_type: str | None) -> Converted:
    """A click log (``query``, ``doc_id``, ``event``; ``query_id`` optional) graded per
    (query, document) by its strongest event (:data:`CLICK_GRADES`); a pair's row is its
    first event's. Without ``query_id``, a query is its text (trimmed), and its id that
    text's."""
    _require(table, ("query", "doc_id", "event"), where)
    queries = [q.strip() for q in _strings(table.column("query"))]
    if "query_id" in table.column_names:
        _require(table, ("query_id",), where)
        refs = _strings(table.column("query_id"))
    else:
        refs = queries
    source_rows = np.arange(table.num_rows)
    grades = _graded(_strings(table.column("event")), CLICK_GRADES, "event", where, source_rows)
    docs = doc_ids(_strings(table.column("doc_id")), id_type, where, source_rows)
    _one_text_per_query(refs, queries, where)
    qids, hashed = query_ids(refs, where)
    events = _judgments(qids, queries, docs, grades, refs if hashed else None)
    events = events.append_column("row", pa.array(source_rows, pa.int64()))
    keys = ["query_id", "doc_id"]
    pairs = events.group_by(keys, use_threads=False).aggregate([("grade", "max"), ("row", "min")])
    # Each pair's first event row, whose query text and reference are the pair's.
    rows = pairs.column("row_min").to_numpy()
    first = events.take(pa.array(rows))
    judged = _judgments(
        first.column("query_id").to_numpy(),
        _strings(first.column("query")),
        first.column("doc_id").combine_chunks(),
        pairs.column("grade_max").to_numpy(),
        _strings(first.column("query_ref")) if hashed else None,
    )
    return Converted(judged, rows, where)
