"""Reads and validates relevance pairs (the train partitions and the eval split) from
the artifact store, by the contract of :mod:`embedfresh.ml.data.schema`.

Every problem with the data is a :class:`BadInputError` naming the partition or file,
the column and a row, found before any training starts: a missing, empty or misnamed
partition, a missing or mistyped column, a null, an empty text, a NaN feature, a label
that is not 0 or 1, a grade outside 0-3, a feature that is not declared or not numeric,
a document the corpus does not hold (past ``max_missing``), a row that occurs twice
(:data:`ROW_KEY`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.parquet import read_parquet
from embedfresh.core.partitions import partition_days
from embedfresh.core.shards import corpus_shards, read_corpus_shard
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data.schema import DOC_TEXT, MAX_GRADE, PAIR_COLUMNS, TRANSFORMS, Features

log = logging.getLogger(__name__)

#: What identifies a row of a training partition or of the eval split: one document
#: (``doc_id``) shown for one search (``query_id``: one query, whose candidates share the
#: id). The same pair twice is one observation counted twice: training weighs it
#: double, and evaluation lists the document twice among the query's candidates, which
#: breaks its ranking metrics. Two searches with the same query text have different ids
#: and are not duplicates.
ROW_KEY = ("query_id", "doc_id")


@dataclass(frozen=True)
class Examples:
    """Columns of validated pairs, features already transformed for the model.

    Ids are int64 keys: an integer id as it is, a string id its 63-bit BLAKE2b.
    ``labels`` is what the pointwise head learns: ``label``, ``grade / 3``, or 1 for
    positive pairs; ``kind`` says which (:data:`~embedfresh.ml.data.schema.LABEL_KINDS`).
    """

    query_ids: np.ndarray  # int64 [n]
    product_ids: np.ndarray  # int64 [n]
    queries: list[str]
    products: list[str]
    features: np.ndarray  # float32 [n, F]
    labels: np.ndarray  # float32 [n], in [0, 1]
    sources: tuple[str, ...]  # URLs of the files read
    kind: str = "binary"
    missing_documents: int = 0
    """Rows left out: their document is not in the corpus and they carry no text."""
    texts_from_corpus: int = 0
    """Rows whose document's text the corpus gave (it may change between two reads)."""

    def __len__(self) -> int:
        return len(self.labels)


def days(start: dt.date, end: dt.date) -> list[dt.date]:
    """The days of the half-open interval [start, end)."""
    if end <= start:
        raise BadInputError(f"empty data interval: end {end} is not after start {start}")
    return [start + dt.timedelta(days=i) for i in range((end - start).days)]


def declared_features(store: ArtifactStore, dataset: str) -> Features:
    """The features ``dataset`` declares in its ``dataset.json`` (``{"features":
    [[column, transform], ...]}``); none (text-only) when it has no declaration."""
    rel = layout.dataset_declaration(dataset)
    if not store.exists(rel):
        return ()
    return check_declaration(store.read_json(rel).get("features") or [], store.url(rel))


def check_declaration(features: object, where: str) -> Features:
    """``features`` as ``((column, transform), ...)``: each a pair, each transform one of
    :data:`TRANSFORMS`, no column twice and none of the contract's own."""
    pairs = list(features) if isinstance(features, (list, tuple)) else None
    if pairs is None or any(not isinstance(p, (list, tuple)) or len(p) != 2 for p in pairs):
        raise BadInputError(
            f"{where}: features must be a list of [column, transform] pairs, got {features!r}"
        )
    names = [str(name) for name, _ in pairs]
    for name, kind in pairs:
        if kind not in TRANSFORMS:
            raise BadInputError(
                f"{where}: feature {name!r}: transform {kind!r} is none of {list(TRANSFORMS)}"
            )
        if name in (*PAIR_COLUMNS, DOC_TEXT, "label", "grade") or names.count(name) > 1:
            raise BadInputError(
                f"{where}: feature {name!r} is declared twice or is a column of the contract"
            )
    return tuple((str(name), str(kind)) for name, kind in pairs)


def read_train(
    store: ArtifactStore,
    dataset: str,
    start: dt.date,
    end: dt.date,
    features: Features,
    corpus: str | None = None,
    max_missing: int = 0,
) -> Examples:
    """All training partitions of [start, end); each one must exist and hold rows, the
    partitions' folder must hold no misnamed one (:func:`partition_days`), every column
    must be of the contract or a declared feature, and no row may occur twice."""
    wanted = days(start, end)
    partition_days(store, dataset)
    parts: list[tuple[str, pa.Table]] = []
    for day in wanted:
        directory = layout.dataset_partition(dataset, "train", day)
        parts += _read_directory(store, directory, f"training partition dt={day}")
    return _to_examples(store, parts, "training", features, corpus, max_missing, strict=True)


def has_eval(store: ArtifactStore, dataset: str) -> bool:
    """Whether ``dataset`` has an eval split of pairs (the relevance head's metrics)."""
    return any(n.endswith(".parquet") for n in store.listdir(layout.eval_split(dataset)))


def read_eval(
    store: ArtifactStore,
    dataset: str,
    features: Features,
    corpus: str | None = None,
) -> Examples:
    """The held-out pairs, validated as the training partitions are (no row twice);
    columns a version does not take are not read (the split serves every version)."""
    parts = _read_directory(store, layout.eval_split(dataset), "eval split")
    return _to_examples(store, parts, "eval", features, corpus, 0, strict=False)


def _read_directory(store: ArtifactStore, directory: str, what: str) -> list[tuple[str, pa.Table]]:
    """``(url, table)`` of every ``*.parquet`` file of ``directory``, in name order."""
    names = [n for n in store.listdir(directory) if n.endswith(".parquet")]
    if not names:
        raise BadInputError(
            f"missing {what}: no part-*.parquet under {store.url(directory)} "
            "(generate the data or fix the data interval)"
        )
    parts = [
        (store.url(f"{directory}/{n}"), read_parquet(store, f"{directory}/{n}")) for n in names
    ]
    if sum(t.num_rows for _, t in parts) == 0:
        raise BadInputError(f"empty {what}: {store.url(directory)} has no rows")
    return parts


def label_kind(table: pa.Table, url: str) -> str:
    """``binary``, ``graded`` or ``positive``: what the file's label column says."""
    has = [c for c in ("label", "grade") if c in table.column_names]
    if len(has) == 2:
        raise BadInputError(
            f"{url}: has both label and grade: a file is binary (label 0/1), graded "
            "(grade 0-3) or positive pairs only (neither)"
        )
    return {"label": "binary", "grade": "graded"}.get(has[0], "") if has else "positive"


def _conform(table: pa.Table, url: str, features: Features, strict: bool) -> pa.Table:
    """The contract's columns of one file, checked and cast; every schema problem named
    at once. ``strict``: a column that is neither the contract's nor declared is one."""
    kind = label_kind(table, url)
    label = {"binary": "label", "graded": "grade"}.get(kind)
    wanted = [*PAIR_COLUMNS, *([DOC_TEXT] if DOC_TEXT in table.column_names else []),
              *(name for name, _ in features), *([label] if label else [])]  # fmt: skip
    problems = []
    missing = [c for c in wanted if c not in table.column_names]
    if missing:
        problems.append(f"missing columns {missing}")
    if strict:
        extra = [c for c in table.column_names if c not in wanted]
        if extra:
            problems.append(
                f"columns {extra} are not declared features (declare them in the data set's "
                "dataset.json or the config's features, or drop them)"
            )
    columns = {}
    for name in (c for c in wanted if c not in missing):
        col = table.column(name)
        expected = _expected(name, label)
        if not expected[1](col.type):
            problems.append(f"column {name} is {col.type}, expected {expected[0]}")
            continue
        if col.null_count and name != DOC_TEXT:  # a row without its text: the corpus's
            first = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            problems.append(f"column {name} has {col.null_count} nulls, the first at row {first}")
        columns[name] = col
    if problems:
        if "product_title" in table.column_names:  # the generator's pairs before the contract
            problems.append(
                "written by an earlier generator: write the data again (python -m "
                "embedfresh.jobs.generate_data)"
            )
        raise BadInputError(f"wrong schema in {url}: {'; '.join(problems)} (docs/DATA.md)")
    return pa.table(columns)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _expected(name: str, label: str | None) -> tuple[str, object]:
    if name in ("query_id", "doc_id"):
        return "an integer or a string", lambda t: pa.types.is_integer(t) or _is_text(t)
    if name in ("query", DOC_TEXT):
        return "a string", _is_text
    if name == label:  # whole numbers, checked with the values
        return "an integer", lambda t: pa.types.is_integer(t) or pa.types.is_floating(t)
    return (
        "a number (declared feature)",
        lambda t: pa.types.is_integer(t) or pa.types.is_floating(t),
    )


class _Rows:
    """Where row ``i`` of the concatenated files is: its file and its row there."""

    def __init__(self, parts: Sequence[tuple[str, pa.Table]]) -> None:
        self.urls = [url for url, _ in parts]
        self.starts = np.cumsum([0] + [t.num_rows for _, t in parts])

    def at(self, i: int) -> str:
        """``row R of URL``, R counted from 0 within the file."""
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return f"row {int(i - self.starts[k])} of {self.urls[k]}"


def _transform(name: str, kind: str, values: np.ndarray, rows: _Rows) -> np.ndarray:
    bad = ~np.isfinite(values)
    if bad.any():
        raise BadInputError(
            f"feature {name} has {int(bad.sum())} NaN/inf values, the first at "
            f"{rows.at(int(np.argmax(bad)))}"
        )
    if kind == "log1p":
        negative = values < 0
        if negative.any():
            raise BadInputError(
                f"feature {name} has {int(negative.sum())} negative values, the first at "
                f"{rows.at(int(np.argmax(negative)))}; expected >= 0"
            )
        return np.log1p(values)
    if kind == "div5":
        return values / 5.0
    return values


def _check_unique(
    table: pa.Table, keys: tuple[np.ndarray, np.ndarray], rows: _Rows, split: str
) -> None:
    """No :data:`ROW_KEY` twice across the files read (``keys``: its int64 keys); else
    name the first repeat (in read order: day, file, row) and the row it repeats."""
    query_ids, doc_ids = keys
    order = np.lexsort((doc_ids, query_ids))  # stable: a key's rows stay in read order
    q, p = query_ids[order], doc_ids[order]
    repeats = (q[1:] == q[:-1]) & (p[1:] == p[:-1])
    if not repeats.any():
        return
    later, earlier = order[1:][repeats], order[:-1][repeats]
    k = int(np.argmin(later))
    i, j = int(later[k]), int(earlier[k])
    query_id, doc_id = (table.column(c)[i].as_py() for c in ROW_KEY)
    raise BadInputError(
        f"duplicate {split} row: (query_id={query_id!r}, doc_id={doc_id!r}) at {rows.at(i)} "
        f"repeats {rows.at(j)} ({int(repeats.sum())} duplicate rows in all); a row is one "
        "document shown for one search, identified by (query_id, doc_id), so a pair must "
        "occur once: twice, it is "
        + ("trained on twice" if split == "training" else "counted twice by the metrics")
    )


def id_keys(column: pa.ChunkedArray) -> np.ndarray:
    """int64 keys of an id column: integers as they are, strings their BLAKE2b-64 with
    the top bit cleared (the same string, the same key, in every file)."""
    if pa.types.is_integer(column.type):
        try:
            return column.cast(pa.int64()).to_numpy()
        except pa.ArrowInvalid as e:
            raise BadInputError(f"an id does not fit int64 (use a string id): {e}") from e
    return np.array(
        [int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big") >> 1
         for s in column.to_pylist()],
        dtype=np.int64,
    )  # fmt: skip


def _check_types(parts: Sequence[tuple[str, pa.Table]]) -> None:
    """One type per id column across the files, and one kind of label."""
    kinds = {label_kind(t, url) for url, t in parts}
    if len(kinds) > 1:
        raise BadInputError(
            f"the files of one read mix label kinds {sorted(kinds)}: "
            + "; ".join(f"{url} is {label_kind(t, url)}" for url, t in parts)
        )
    for name in ("query_id", "doc_id"):
        types = {_is_text(t.column(name).type) for _, t in parts}
        if len(types) > 1:
            raise BadInputError(
                f"column {name} is a string in some files and an integer in others: "
                + ", ".join(f"{url}: {t.column(name).type}" for url, t in parts)
            )


def _check_texts(table: pa.Table, rows: _Rows) -> None:
    """No empty query text, and no empty ``doc_text``."""
    for name in ("query", DOC_TEXT):
        if name not in table.column_names:
            continue
        col = table.column(name)
        empty = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(col)), 0)
        if pc.any(empty).as_py():
            first = int(np.flatnonzero(empty.to_numpy(zero_copy_only=False))[0])
            raise BadInputError(f"column {name} is empty at {rows.at(first)}")


def _labels(table: pa.Table, kind: str, rows: _Rows) -> np.ndarray:
    """What the head learns: the 0/1 label, the grade / 3, or 1 for positive pairs."""
    if kind == "positive":
        return np.ones(table.num_rows, np.float32)
    name, top = ("label", 1) if kind == "binary" else ("grade", MAX_GRADE)
    raw = table.column(name).to_numpy().astype(np.float64)
    values = np.where(np.isfinite(raw), raw, -1)
    bad = (values < 0) | (values > top) | (values != np.floor(values))
    if bad.any():
        first = int(np.argmax(bad))
        raise BadInputError(
            f"column {name} must be {'0 or 1' if top == 1 else f'0-{top}'}, got "
            f"{raw[first]:g} at {rows.at(first)} ({int(bad.sum())} such rows)"
        )
    return (values / top).astype(np.float32)


def _to_examples(
    store: ArtifactStore,
    raw: Sequence[tuple[str, pa.Table]],
    split: str,
    features: Features,
    corpus: str | None,
    max_missing: int,
    strict: bool,
) -> Examples:
    """The files' pairs as :class:`Examples`; rows without ``doc_text`` take their
    document's text from the corpus (:func:`_documents`)."""
    parts = [(url, _conform(t, url, features, strict)) for url, t in raw]
    kind = label_kind(raw[0][1], raw[0][0])
    _check_types(raw)
    rows = _Rows(parts)
    table = pa.concat_tables([t for _, t in parts], promote_options="permissive")
    _check_texts(table, rows)
    labels = _labels(table, kind, rows)
    transformed = [
        _transform(name, how, table.column(name).to_numpy().astype(np.float64), rows)
        for name, how in features
    ]
    query_ids, doc_keys = id_keys(table.column("query_id")), id_keys(table.column("doc_id"))
    _check_unique(table, (query_ids, doc_keys), rows, split)
    texts, keep = _documents(store, table, rows, corpus, max_missing, split)
    n = table.num_rows
    inline = n - table.column(DOC_TEXT).null_count if DOC_TEXT in table.column_names else 0
    return Examples(
        query_ids=query_ids[keep],
        product_ids=doc_keys[keep],
        queries=[q for q, k in zip(table.column("query").to_pylist(), keep, strict=True) if k],
        products=[t for t, k in zip(texts, keep, strict=True) if k],
        features=(np.stack(transformed, axis=1) if transformed else np.zeros((n, 0)))[keep].astype(
            np.float32
        ),
        labels=labels[keep],
        sources=tuple(rows.urls),
        kind=kind,
        missing_documents=int(n - keep.sum()),
        texts_from_corpus=int(keep.sum()) - inline,
    )


def _documents(
    store: ArtifactStore,
    table: pa.Table,
    rows: _Rows,
    corpus: str | None,
    max_missing: int,
    split: str,
) -> tuple[list[str | None], np.ndarray]:
    """Each row's document text (:func:`_filled`) and which rows are kept: a document
    the corpus lacks leaves its row out, counted and logged; more than ``max_missing``
    such rows are refused."""
    texts, wanted = _filled(store, table, corpus, rows)
    missing = np.array([t is None for t in texts], bool)
    if missing.sum() > max_missing:
        first = int(np.argmax(missing))
        raise BadInputError(
            f"column doc_id: {int(missing.sum())} {split} rows name documents corpus "
            f"{corpus!r} does not hold, the first {wanted[first].item()!r} at "
            f"{rows.at(first)}; at most {max_missing} may (max_missing_documents), or give "
            f"those rows a {DOC_TEXT}"
        )
    if missing.any():
        log.warning(
            "%d %s rows left out: their documents are not in corpus %s (max_missing_documents %d)",
            int(missing.sum()), split, corpus, max_missing,
        )  # fmt: skip
    return texts, ~missing


def with_texts(store: ArtifactStore, table: pa.Table, corpus: str, url: str) -> pa.Table:
    """``table``'s pairs (file ``url``) with every document's text inline in ``doc_text``
    (:func:`_filled`). A row whose document the corpus lacks is left out, logged (what
    the reader does within ``max_missing_documents``)."""
    texts, _ = _filled(store, table, corpus, _Rows([(url, table)]))
    keep = pa.array([t is not None for t in texts])
    if dropped := table.num_rows - sum(keep.to_pylist()):
        log.warning("%s: %d pairs left out, their documents not in corpus %s", url, dropped, corpus)
    if DOC_TEXT in table.column_names:
        table = table.drop_columns([DOC_TEXT])
    return table.append_column(DOC_TEXT, pa.array(texts, pa.string())).filter(keep)


def _filled(
    store: ArtifactStore, table: pa.Table, corpus: str | None, rows: _Rows
) -> tuple[list[str | None], np.ndarray]:
    """Each row's text: its own ``doc_text``, else its document's in ``corpus`` (None
    where neither has one, the corpus read only when a row needs it); and the doc ids."""
    n = table.num_rows
    texts = table.column(DOC_TEXT).to_pylist() if DOC_TEXT in table.column_names else [None] * n
    doc = table.column("doc_id")
    wanted = np.asarray(doc.to_pylist(), dtype=str if _is_text(doc.type) else np.int64)
    need = [i for i, t in enumerate(texts) if t is None]
    if need and corpus is None:
        raise BadInputError(f"{rows.at(need[0])} has no {DOC_TEXT}, and no corpus was named")
    if need:
        found = _corpus_texts(store, corpus, wanted[need], _is_text(doc.type), rows)
        for i in need:
            texts[i] = found.get(wanted[i].item())
    return texts, wanted


def _corpus_texts(
    store: ArtifactStore, corpus: str, wanted: np.ndarray, strings: bool, rows: _Rows
) -> dict[object, str]:
    """The corpus's text of each ``wanted`` id it holds; the id types must agree."""
    out: dict[object, str] = {}
    for name in corpus_shards(store, corpus).values():
        ids, texts = read_corpus_shard(store, f"{layout.corpus(corpus)}/{name}")
        if (ids.dtype.kind == "U") != strings:
            raise BadInputError(
                f"column doc_id is {'a string' if strings else 'an integer'} at "
                f"{rows.at(0)} but corpus {corpus!r}'s ids are "
                f"{'strings' if ids.dtype.kind == 'U' else 'integers'}: write the corpus's own ids"
            )
        for i in np.flatnonzero(np.isin(ids, wanted)):
            out[ids[i].item()] = texts[i]
    return out
