"""Graded judgments of an eval split: what search is judged on (docs/DATA.md).

One table per data set, ``datasets/{dataset}/judgments/part-*.parquet``, one row per
judged (query, document) pair: ``query_id`` (integer), ``query`` (its text),
``doc_id`` (the corpus's own id, integer or string) and ``grade`` (0-3, as ESCI's
Irrelevant, Complement, Substitute, Exact). Beside it ``judgments.json`` says whether
the judgments are ``complete`` (every document of ``corpus`` not listed is grade 0: the
generator's, which grades every pair) or not (a team's labels: an unlisted document is
unjudged, and rankings are scored on condensed lists, :mod:`embedfresh.ml.ranking`).

Queries are the pool that evaluations draw from: they come in a fixed order (a hash of
their id, so the order does not depend on how the files are written, and a query added
later does not move the others), and an evaluation of ``n`` queries takes the first
``n``. Only queries with at least one document of grade > 0 can be scored (nDCG is
undefined without one); the others are counted and left out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.parquet import read_parquet
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data.schema import MAX_GRADE

log = logging.getLogger(__name__)

SPEC = "judgments.json"
DEFAULT_CORPUS = "products"
COLUMNS = ("query_id", "query", "doc_id", "grade")


@dataclass(frozen=True)
class Judgments:
    """The judged queries of a data set in pool order, each with its judged documents
    (``doc_ids[offsets[i]:offsets[i + 1]]``, sorted by id, and their ``grades``)."""

    dataset: str
    query_ids: np.ndarray
    texts: list[str]
    offsets: np.ndarray
    doc_ids: np.ndarray
    grades: np.ndarray
    complete: bool
    corpus: str | None
    left_out: int = 0
    """Queries of the files without a document of grade > 0 (not scorable)."""

    def __len__(self) -> int:
        return len(self.query_ids)

    def head(self, n: int) -> Judgments:
        """The first ``n`` queries of the pool."""
        n = min(n, len(self))
        end = int(self.offsets[n])
        return replace(
            self,
            query_ids=self.query_ids[:n],
            texts=self.texts[:n],
            offsets=self.offsets[: n + 1],
            doc_ids=self.doc_ids[:end],
            grades=self.grades[:end],
        )

    def slice(self, start: int, stop: int) -> Judgments:
        """Queries ``start`` to ``stop`` of the pool."""
        a, b = int(self.offsets[start]), int(self.offsets[stop])
        return replace(
            self,
            query_ids=self.query_ids[start:stop],
            texts=self.texts[start:stop],
            offsets=self.offsets[start : stop + 1] - a,
            doc_ids=self.doc_ids[a:b],
            grades=self.grades[a:b],
        )

    def restricted(self, present: np.ndarray) -> tuple[Judgments, int]:
        """Without the documents that are not in ``present`` (a corpus's ids: what is
        not there cannot be found), and without the queries that leaves with no
        relevant document; and how many judged documents that drops (logged)."""
        found = np.isin(self.doc_ids, present)
        if found.all():
            return self, 0
        relevant = np.zeros(len(self.doc_ids) + 1, dtype=np.int64)
        np.cumsum(found & (self.grades > 0), out=relevant[1:])
        keep = np.flatnonzero(relevant[self.offsets[1:]] - relevant[self.offsets[:-1]] > 0)
        rows = [np.arange(self.offsets[i], self.offsets[i + 1]) for i in keep]
        rows = [r[found[r]] for r in rows]
        at = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        dropped = int((~found).sum())
        log.warning(
            "%d judged documents of %r are not in the corpus and are left out (%d queries "
            "left without a relevant one)",
            dropped, self.dataset, len(self) - len(keep),
        )  # fmt: skip
        kept = replace(
            self,
            query_ids=self.query_ids[keep],
            texts=[self.texts[i] for i in keep],
            offsets=np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64),
            doc_ids=self.doc_ids[at],
            grades=self.grades[at],
            left_out=self.left_out + len(self) - len(keep),
        )
        return kept, dropped

    def documents(self) -> np.ndarray:
        """Every judged document id, once."""
        return np.unique(self.doc_ids)

    def of(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Query ``i``'s judged document ids (sorted) and their grades."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.doc_ids[a:b], self.grades[a:b]


def pool_order(query_ids: np.ndarray) -> np.ndarray:
    """The fixed order of a pool: by a 64-bit mix (splitmix64) of each query id, so
    prefixes are random samples of the pool whatever order the files list them in."""
    with np.errstate(over="ignore"):
        z = query_ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return np.lexsort((query_ids, z))


def read_judgments(store: ArtifactStore, dataset: str, id_type: str | None = None) -> Judgments:
    """The data set's judgments, validated.

    :param id_type: the corpus's id type (``int64`` or ``string``); judged ids of the
        other type are refused, naming the file.
    :raises BadInputError: no judgments, a wrong schema, nulls, an empty query text,
        one query id with two texts, a grade outside 0-3, the same (query, document)
        twice, an id of the wrong type, or no query with a relevant document; each
        naming the file and a row.
    """
    directory = layout.judgments(dataset)
    names = sorted(n for n in store.listdir(directory) if n.endswith(".parquet"))
    if not names:
        raise BadInputError(
            f"no judgments for data set {dataset!r}: no part-*.parquet under "
            f"{store.url(directory)} (docs/DATA.md: query_id, query, doc_id, grade)"
        )
    spec_rel = f"{directory}/{SPEC}"
    spec = store.read_json(spec_rel) if store.exists(spec_rel) else {}
    if not isinstance(spec, dict) or not isinstance(spec.get("complete", False), bool):
        raise BadInputError(f"{store.url(spec_rel)}: 'complete' must be true or false")
    tables = [_conform(store, f"{directory}/{n}", id_type) for n in names]
    table = pa.concat_tables(tables)
    return _build(dataset, table, [store.url(f"{directory}/{n}") for n in names], tables, spec)


def check_judgments(
    dataset: str,
    table: pa.Table,
    url: str,
    spec: dict,
    id_type: str | None = None,
    rows: np.ndarray | None = None,
) -> Judgments:
    """The judgments one table holds, checked by the rules :func:`read_judgments`
    applies: what an import validates before its first write. ``url`` names the source
    they came from, ``rows`` the source's row of each row (else the same)."""
    conformed = conform(table, url, id_type, rows)
    return _build(dataset, conformed, [url], [conformed], spec, rows)


def _conform(store: ArtifactStore, rel: str, id_type: str | None) -> pa.Table:
    return conform(read_parquet(store, rel, read_dictionary=["query"]), store.url(rel), id_type)


def conform(
    table: pa.Table, url: str, id_type: str | None, rows: np.ndarray | None = None
) -> pa.Table:
    """One file's four columns, checked and cast; the query texts dictionary-encoded (a
    few distinct texts repeated on every judged document of their query)."""
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise BadInputError(
            f"wrong judgments schema in {url}: missing columns {missing} (has "
            f"{table.column_names}); docs/DATA.md"
        )
    for name in COLUMNS:
        col = table.column(name)
        if col.null_count:
            first = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise BadInputError(
                f"{url}: {col.null_count} null values in {name}, the first at row "
                f"{_row(first, rows)}"
            )
    qid, query, doc, grade = (table.column(c) for c in COLUMNS)
    if not pa.types.is_integer(qid.type):
        raise BadInputError(f"{url}: query_id is {qid.type}, expected an integer")
    query = _texts(query, url, rows)
    if not pa.types.is_integer(grade.type):
        raise BadInputError(f"{url}: grade is {grade.type}, expected an integer 0-{MAX_GRADE}")
    g = grade.to_numpy()
    bad = (g < 0) | (g > MAX_GRADE)
    if bad.any():
        first = int(np.argmax(bad))
        raise BadInputError(
            f"{url}: grade {int(g[first])} at row {_row(first, rows)} is outside 0-{MAX_GRADE} "
            f"({int(bad.sum())} such rows)"
        )
    is_str = pa.types.is_string(doc.type) or pa.types.is_large_string(doc.type)
    if not (is_str or pa.types.is_integer(doc.type)):
        raise BadInputError(f"{url}: doc_id is {doc.type}, expected an integer or a string")
    kind = "string" if is_str else "int64"
    if id_type is not None and kind != id_type:
        raise BadInputError(
            f"{url}: doc_id is {doc.type} but the corpus's ids are {id_type}: write the "
            "corpus's own ids (row 0 holds " + repr(doc[0].as_py()) + ")"
        )
    return pa.table(
        {
            "query_id": qid.cast(pa.int64()),
            "query": query,
            "doc_id": doc.cast(pa.string() if is_str else pa.int64()),
            "grade": grade.cast(pa.int8()),
        }
    )


def _row(row: int, rows: np.ndarray | None) -> int:
    """The source's row of a table's row (``rows``: the source row of each)."""
    return row if rows is None else int(rows[row])


def _texts(query: pa.ChunkedArray, url: str, rows: np.ndarray | None = None) -> pa.ChunkedArray:
    """The query column as dictionary-encoded strings, none empty."""
    value_type = query.type.value_type if pa.types.is_dictionary(query.type) else query.type
    if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)):
        raise BadInputError(f"{url}: query is {value_type}, expected string")
    if not pa.types.is_dictionary(query.type):
        query = query.dictionary_encode()
    query = query.cast(pa.dictionary(pa.int32(), pa.string()))
    for chunk_start, chunk in _chunks(query):
        blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(chunk.dictionary)), 0)
        empty = np.isin(chunk.indices.to_numpy(zero_copy_only=False),
                        np.flatnonzero(blank.to_numpy(zero_copy_only=False)))  # fmt: skip
        if empty.any():
            row = chunk_start + int(np.argmax(empty))
            raise BadInputError(f"{url}: an empty query text at row {_row(row, rows)}")
    return query


def _chunks(column: pa.ChunkedArray) -> list[tuple[int, pa.Array]]:
    out, start = [], 0
    for chunk in column.chunks:
        out.append((start, chunk))
        start += len(chunk)
    return out


def _where(
    urls: list[str], tables: list[pa.Table], row: int, rows: np.ndarray | None = None
) -> str:
    if rows is not None:
        return f"row {_row(row, rows)} of {urls[0]}"
    for url, table in zip(urls, tables, strict=True):
        if row < table.num_rows:
            return f"row {row} of {url}"
        row -= table.num_rows
    return f"row {row}"


def _build(
    dataset: str,
    table: pa.Table,
    urls: list[str],
    tables: list[pa.Table],
    spec: dict,
    rows: np.ndarray | None = None,
) -> Judgments:
    """The judgments in pool order, every row checked: one grade per (query, document),
    one text per query, a query without a relevant document left out (counted)."""
    table = table.unify_dictionaries().combine_chunks()
    qid = table.column("query_id").to_numpy()
    doc_col = table.column("doc_id")
    doc = (
        np.asarray(doc_col.to_pylist(), dtype=str)
        if pa.types.is_string(doc_col.type)
        else doc_col.to_numpy()
    )
    texts = table.column("query").chunk(0)
    text_at = texts.indices.to_numpy(zero_copy_only=False)
    grade = table.column("grade").to_numpy()
    order = np.lexsort((doc, qid))
    q_sorted, d_sorted, t_sorted = qid[order], doc[order], text_at[order]
    same_query = q_sorted[1:] == q_sorted[:-1]
    twice = same_query & (d_sorted[1:] == d_sorted[:-1])
    if twice.any():
        row = int(order[1:][twice][0])
        raise BadInputError(
            f"judgments of {dataset!r}: (query_id={int(qid[row])}, doc_id={doc[row].item()!r}) "
            f"is judged twice ({_where(urls, tables, row, rows)}); a pair has one grade"
        )
    retold = same_query & (t_sorted[1:] != t_sorted[:-1])
    if retold.any():
        k = int(np.argmax(retold))
        row, other = int(order[k + 1]), int(order[k])
        raise BadInputError(
            f"judgments of {dataset!r}: query_id {int(qid[row])} has two texts "
            f"({texts.dictionary[int(text_at[row])].as_py()!r} at {_where(urls, tables, row, rows)}, "
            f"{texts.dictionary[int(text_at[other])].as_py()!r} at "
            f"{_where(urls, tables, other, rows)})"
        )
    starts = np.flatnonzero(np.concatenate([[True], ~same_query]))
    uq = q_sorted[starts]
    relevant = np.maximum.reduceat((grade[order] > 0).astype(np.int8), starts) > 0
    keep = pool_order(uq)
    keep = keep[relevant[keep]]
    if not len(keep):
        raise BadInputError(
            f"judgments of {dataset!r}: no query has a document of grade > 0; nDCG is "
            "undefined (docs/DATA.md)"
        )
    counts = np.diff(np.concatenate([starts, [len(order)]]))
    rows = np.concatenate([order[starts[i] : starts[i] + counts[i]] for i in keep])
    left_out = len(uq) - len(keep)
    if left_out:
        log.info(
            "%d judged queries of %r have no document of grade > 0 and are left out",
            left_out, dataset,
        )  # fmt: skip
    return Judgments(
        dataset=dataset,
        query_ids=uq[keep],
        texts=texts.dictionary.take(pa.array(t_sorted[starts][keep])).to_pylist(),
        offsets=np.concatenate([[0], np.cumsum(counts[keep])]).astype(np.int64),
        doc_ids=doc[rows],
        grades=grade[rows].astype(np.int8),
        complete=bool(spec.get("complete", False)),
        corpus=spec.get("corpus"),
        left_out=left_out,
    )


def write_spec(store: ArtifactStore, dataset: str, complete: bool, corpus: str) -> None:
    """``judgments.json`` beside the judgments: complete or not, and of which corpus."""
    store.write_json(
        f"{layout.judgments(dataset)}/{SPEC}", {"complete": complete, "corpus": corpus}
    )


def corpus_of(store: ArtifactStore, dataset: str, corpus: str | None) -> str:
    """The corpus a data set's judged queries search: ``corpus``, else the one its
    judgments name, else :func:`pairs_corpus`."""
    return (
        corpus
        or _named(store, f"{layout.judgments(dataset)}/{SPEC}")
        or pairs_corpus(store, dataset)
    )


def pairs_corpus(store: ArtifactStore, dataset: str) -> str:
    """The corpus a data set's pairs name documents of: the one its ``dataset.json``
    names, else the one its judgments name, else :data:`DEFAULT_CORPUS`."""
    return (
        _named(store, layout.dataset_declaration(dataset))
        or _named(store, f"{layout.judgments(dataset)}/{SPEC}")
        or DEFAULT_CORPUS
    )


def _named(store: ArtifactStore, rel: str) -> str | None:
    if not store.exists(rel):
        return None
    spec = store.read_json(rel)
    if not isinstance(spec, dict):
        raise BadInputError(f"{store.url(rel)} must hold a JSON object (docs/DATA.md)")
    return spec.get("corpus")
