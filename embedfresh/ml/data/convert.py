"""A team's labels, in the shapes teams have, as judgments (docs/DATA.md "Judgments").

Each converter takes the source's own tables and returns the judgments' four columns
(``query_id``, ``query``, ``doc_id``, ``grade``), a row for each row of the source (a
click log: for each (query, document) it holds), in the source's order, so a check of
the result names the source's rows:

- :func:`from_esci`: ESCI-style judgments (Amazon's Shopping Queries data set: a
  ``query_id``, ``query``, ``product_id`` and an ``esci_label`` E/S/C/I per row);
- :func:`from_beir`: a BEIR folder's ``queries.jsonl`` and ``qrels/<split>.tsv``
  (MS MARCO, TREC-COVID, NFCorpus and the rest of BEIR come in this layout), and
  :func:`beir_corpus` its ``corpus.jsonl`` as a corpus;
- :func:`from_clicks`: a click log, one row per event on a (query, document), graded by
  the strongest event (:data:`CLICK_GRADES`).

Query ids must be integers in the judgments. Integer ids, and strings that are all
integers written plainly (``"42"``, not ``"042"``), are kept; any other string ids are
mapped to a stable 63-bit integer (:func:`integer_query_ids`, a BLAKE2b hash of the id),
and the source's own id is kept beside it in ``query_ref``.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embedfresh.core.exit_codes import BadInputError
from embedfresh.ml.data.schema import product_text

#: ESCI's labels and their grades (docs/DATA.md): Exact, Substitute, Complement, Irrelevant.
ESCI_GRADES = {"E": 3, "S": 2, "C": 1, "I": 0}
#: A click log's events and the grade each gives a (query, document): the strongest
#: event over the log wins; a document never shown has no row (unjudged).
CLICK_GRADES = {"shown": 0, "impression": 0, "click": 1, "cart": 2, "add_to_cart": 2,
                "purchase": 3, "order": 3}  # fmt: skip
_PLAIN_INT = re.compile(r"-?(0|[1-9][0-9]{0,18})")


def _strings(column: pa.ChunkedArray | pa.Array) -> list[str]:
    return [str(v) for v in column.to_pylist()]


def plain_integers(values: list[str]) -> np.ndarray | None:
    """``values`` as int64 when every one is an integer written plainly (no sign but a
    minus, no leading zero, within int64), else None: ``"007"`` stays a string id."""
    if not all(_PLAIN_INT.fullmatch(v) for v in values):
        return None
    try:
        return np.array([int(v) for v in values], dtype=np.int64)
    except OverflowError:
        return None


def integer_query_ids(refs: list[str], where: str) -> tuple[np.ndarray, bool]:
    """int64 query ids for the source's ids ``refs``, and whether they were hashed: plain
    integers as they are, else each id's BLAKE2b-64 with the top bit cleared (two ids
    of one hash are refused: never seen at 63 bits, but never merged silently)."""
    plain = plain_integers(refs)
    if plain is not None:
        return plain, False
    unique = sorted(set(refs))
    hashed = {
        ref: int.from_bytes(hashlib.blake2b(ref.encode(), digest_size=8).digest(), "big") >> 1
        for ref in unique
    }
    if len(set(hashed.values())) != len(unique):
        raise BadInputError(f"{where}: two query ids hash to one integer; give integer query ids")
    return np.array([hashed[r] for r in refs], dtype=np.int64), True


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


def doc_ids(values: list[str], id_type: str | None, where: str) -> pa.Array:
    """Document ids as the corpus has them: int64 or string; with ``id_type`` None
    (no corpus yet), int64 when every id is a plain integer."""
    if id_type == "string":
        return pa.array(values, pa.string())
    ints = plain_integers(values)
    if ints is not None:
        return pa.array(ints, pa.int64())
    if id_type is None:
        return pa.array(values, pa.string())
    row = next(i for i, v in enumerate(values) if not _PLAIN_INT.fullmatch(v))
    raise BadInputError(
        f"{where}: document id {values[row]!r} at row {row} is not an integer, and the "
        "corpus's ids are int64"
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


def _graded(labels: list[str], grades: dict[str, int], column: str, where: str) -> np.ndarray:
    out = np.empty(len(labels), dtype=np.int8)
    for i, label in enumerate(labels):
        grade = grades.get(label.strip().lower() if column == "event" else label.strip())
        if grade is None:
            raise BadInputError(
                f"{where}: {column} {label!r} at row {i} is none of {sorted(grades)}"
            )
        out[i] = grade
    return out


def from_esci(
    table: pa.Table, where: str, id_type: str | None, split: str | None, locale: str | None
) -> pa.Table:
    """ESCI rows (``query_id``, ``query``, ``product_id``, ``esci_label``), kept to
    ``split`` and ``locale`` when the source has those columns (``split``,
    ``product_locale``), graded E 3, S 2, C 1, I 0."""
    for column, value in (("split", split), ("product_locale", locale)):
        if value is not None and column in table.column_names:
            table = table.filter(pc.equal(table.column(column), value))
    _require(table, ("query_id", "query", "product_id", "esci_label"), where)
    if not table.num_rows:
        raise BadInputError(f"{where}: no rows of split {split!r} and locale {locale!r}")
    qids, hashed = integer_query_ids(_strings(table.column("query_id")), where)
    grades = _graded(_strings(table.column("esci_label")), ESCI_GRADES, "esci_label", where)
    return _judgments(
        qids,
        _strings(table.column("query")),
        doc_ids(_strings(table.column("product_id")), id_type, where),
        grades,
        _strings(table.column("query_id")) if hashed else None,
    )


def from_beir(
    queries: pa.Table, qrels: pa.Table, where: tuple[str, str], id_type: str | None
) -> pa.Table:
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
    qids, hashed = integer_query_ids(refs, qrels_at)
    return _judgments(
        qids,
        [text[r] for r in refs],
        doc_ids(_strings(qrels.column("corpus-id")), id_type, qrels_at),
        grades,
        refs if hashed else None,
    )


def beir_corpus(corpus: pa.Table, where: str, id_type: str | None) -> pa.Table:
    """A BEIR ``corpus.jsonl`` (``_id``, ``title``, ``text``) as a corpus (``id``,
    ``text``): the title and the text as :func:`product_text` joins them."""
    _require(corpus, ("_id", "text"), where)
    titles = (
        _strings(corpus.column("title").fill_null(""))
        if "title" in corpus.column_names
        else [""] * corpus.num_rows
    )
    texts = [
        product_text(t, b) if t else b
        for t, b in zip(titles, _strings(corpus.column("text")), strict=True)
    ]
    table = pa.table({"id": doc_ids(_strings(corpus.column("_id")), id_type, where), "text": texts})
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


def from_clicks(table: pa.Table, where: str, id_type: str | None) -> pa.Table:
    """A click log (``query``, ``doc_id``, ``event``; ``query_id`` optional) graded per
    (query, document) by its strongest event (:data:`CLICK_GRADES`). Without
    ``query_id``, a query is its text (trimmed), and its id that text's hash."""
    _require(table, ("query", "doc_id", "event"), where)
    queries = [q.strip() for q in _strings(table.column("query"))]
    if "query_id" in table.column_names:
        _require(table, ("query_id",), where)
        refs = _strings(table.column("query_id"))
    else:
        refs = queries
    grades = _graded(_strings(table.column("event")), CLICK_GRADES, "event", where)
    docs = doc_ids(_strings(table.column("doc_id")), id_type, where)
    _one_text_per_query(refs, queries, where)
    qids, hashed = integer_query_ids(refs, where)
    events = pa.table({"query_id": qids, "query": queries, "doc_id": docs, "grade": grades})
    if hashed:
        events = events.append_column("query_ref", pa.array(refs, pa.string()))
    keys = ["query_id", "doc_id"]
    best = events.group_by(keys).aggregate([("grade", "max")]).rename_columns([*keys, "grade"])
    first = events.group_by(["query_id"], use_threads=False).aggregate(
        [("query", "first"), *([("query_ref", "first")] if hashed else [])]
    )
    joined = best.join(first, "query_id")
    return _judgments(
        joined.column("query_id").to_numpy(),
        _strings(joined.column("query_first")),
        joined.column("doc_id").combine_chunks(),
        joined.column("grade").to_numpy(),
        _strings(joined.column("query_ref_first")) if hashed else None,
    )
