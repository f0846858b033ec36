"""Corpus change sets: upserts and deletes by id, landed between full snapshots (torch-free).

A corpus is its snapshot (``corpora/{corpus}/part-NNNNN.parquet``) followed by its change
sets, ``corpora/{corpus}/changes/{name}.parquet``, applied in the order of their names:
a producer names them so that they sort in landing order (a UTC time,
``2026-12-06T10-30-00Z``). Each holds ``op`` (``upsert`` or ``delete``), ``id`` (the
corpus's id type) and ``text`` (an upsert's new text; null for a delete), every id at
most once. A change set is written once, whole (one object), and never changed: the
corpus sync records its sha256 and refuses one that changed after it was applied.

Replaying a change set onto a table that already holds it leaves the table as it was
(the last operation on an id decides), so a producer may fold change sets into a new
snapshot at any time: docs/SEARCH.md "Corpus changes".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.index import VectorIndex
from embedfresh.core.parquet import read_parquet_bytes
from embedfresh.core.storage import ArtifactStore, sha256_bytes

log = logging.getLogger(__name__)

UPSERT, DELETE = "upsert", "delete"
SUFFIX = ".parquet"


@dataclass(frozen=True)
class ChangeSet:
    """One change set, validated: what to embed and write, and what to delete."""

    name: str
    sha256: str
    upsert_ids: np.ndarray
    upsert_texts: list[str]
    delete_ids: np.ndarray
    etag: str | None = None  # the store's tag of these bytes (None: replaced while read)

    @property
    def rows(self) -> int:
        return len(self.upsert_ids) + len(self.delete_ids)


def change_set_names(store: ArtifactStore, corpus: str) -> list[str]:
    """The corpus's change sets, in the order they apply (their names, sorted)."""
    names = store.listdir(layout.corpus_changes(corpus))
    return sorted(n.removesuffix(SUFFIX) for n in names if n.endswith(SUFFIX))


def read_change_set(store: ArtifactStore, corpus: str, name: str, id_type: str) -> ChangeSet:
    """Read and validate one change set; ``id_type`` is the corpus's (``int64`` or
    ``string``).

    :raises BadInputError: naming the file, the column and a row: not Parquet, a missing
        column, an ``op`` other than upsert/delete, an id of another type, null or empty,
        an id twice, an upsert without text or with empty text.
    """
    rel = layout.change_set(corpus, name)
    url = store.url(rel)
    etag = store.etag(rel)
    data = store.read_bytes(rel)
    sha256 = sha256_bytes(data)
    if etag != sha256 and store.etag(rel) != etag:  # replaced while read: no tag to trust
        etag = None
    table = read_parquet_bytes(data, url)
    missing = [c for c in ("op", "id", "text") if c not in table.column_names]
    if missing:
        raise BadInputError(
            f"change set {url}: missing columns {missing} (has {table.column_names})"
        )
    op = _strings(table, "op", url)
    ids = _ids(table, id_type, url)
    text = _strings(table, "text", url)
    bad = np.flatnonzero(~np.isin(op, [UPSERT, DELETE]))
    if len(bad):
        raise BadInputError(
            f"change set {url}: column op is {op[bad[0]]!r} at row {bad[0]}, expected "
            f"{UPSERT!r} or {DELETE!r}"
        )
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        twice = unique[counts > 1].tolist()
        row = int(np.flatnonzero(ids == twice[0])[1])
        raise BadInputError(
            f"change set {url}: column id has {twice[0]!r} more than once (again at row {row}): "
            "one operation per id in a change set"
        )
    upsert = op == UPSERT
    empty = np.flatnonzero(upsert & np.asarray([not t for t in text], dtype=bool))
    if len(empty):
        raise BadInputError(
            f"change set {url}: column text is {'null' if text[empty[0]] is None else 'empty'} "
            f"at row {empty[0]}, an upsert of id {ids[empty[0]].item()!r}: an upsert carries its text"
        )
    return ChangeSet(
        name=name,
        sha256=sha256,
        upsert_ids=ids[upsert],
        upsert_texts=[t for t, u in zip(text, upsert, strict=True) if u],
        delete_ids=ids[~upsert],
        etag=etag,
    )


def _strings(table: pa.Table, column: str, url: str) -> np.ndarray:
    col = table.column(column)
    if not (
        pa.types.is_string(col.type)
        or pa.types.is_large_string(col.type)
        or col.null_count == len(col)
    ):
        raise BadInputError(f"change set {url}: column {column} is {col.type}, expected string")
    if column == "op" and col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise BadInputError(f"change set {url}: column op is null at row {row}")
    return np.asarray(col.to_pylist(), dtype=object)


def _ids(table: pa.Table, id_type: str, url: str) -> np.ndarray:
    col = table.column("id")
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise BadInputError(f"change set {url}: column id is null at row {row}")
    is_string = pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
    if id_type == "string":
        if not is_string:
            raise BadInputError(
                f"change set {url}: column id is {col.type}, the corpus's ids are strings (row 0)"
            )
        empty = np.flatnonzero(pc.equal(col, "").to_numpy(zero_copy_only=False))
        if len(empty):
            raise BadInputError(f"change set {url}: column id is empty at row {empty[0]}")
        return np.asarray(col.to_pylist(), dtype=str)
    if not pa.types.is_integer(col.type):
        raise BadInputError(
            f"change set {url}: column id is {col.type}, the corpus's ids are int64 (row 0)"
        )
    try:
        return col.cast(pa.int64(), safe=True).to_numpy()
    except pa.ArrowInvalid as e:
        raise BadInputError(f"change set {url}: column id does not fit int64: {e}") from e


def pending_changes(
    store: ArtifactStore, index: VectorIndex, table: str, corpus: str, id_type: str
) -> list[ChangeSet]:
    """The corpus's change sets ``table``'s ledger lacks, in order, each read and
    validated (call it before the first write: a bad one refuses them all). Those the
    ledger holds are checked unchanged by the store's tag, read only when it differs.

    :raises BadInputError: a bad change set (:func:`read_change_set`), or one whose bytes
        differ from those the ledger recorded when it was applied.
    """
    applied = index.applied_changes(table)
    names = change_set_names(store, corpus)
    last = max(applied, default="")
    out = []
    for name in names:
        if name not in applied:
            if name < last:
                raise BadInputError(
                    f"change set {store.url(layout.change_set(corpus, name))} sorts before "
                    f"{last}, which {table} holds already: applied now, it would not apply in "
                    "the corpus's order; land it again under a name after the last one "
                    "(change sets sort by name, in landing order)"
                )
            out.append(read_change_set(store, corpus, name, id_type))
            continue
        rel = layout.change_set(corpus, name)
        tag = store.etag(rel)
        if tag is not None and tag in (applied[name].etag, applied[name].sha256):
            continue  # unchanged, without reading it (file://'s tag is the sha256)
        if (sha := sha256_bytes(store.read_bytes(rel))) != applied[name].sha256:
            raise BadInputError(
                f"change set {store.url(rel)} was applied to {table} with sha256 "
                f"{applied[name].sha256}, it is now {sha}: change sets are immutable; land "
                "the correction as a new change set"
            )
    gone = sorted(set(applied) - set(names))
    if gone:
        log.warning("the ledger of %s records change sets no longer in the store: %s", table,
                    gone[:10])  # fmt: skip
    return out


def ids_after(
    store: ArtifactStore, corpus: str, ids: np.ndarray, names: Iterable[str], id_type: str
) -> np.ndarray:
    """The corpus's ids once the change sets ``names`` (applied in name order) are
    applied on top of the snapshot's ``ids``: what a synced table must hold."""
    current = set(ids.tolist())
    for name in sorted(names):
        if not store.exists(layout.change_set(corpus, name)):
            raise BadInputError(
                f"change set {store.url(layout.change_set(corpus, name))}, which the table "
                "holds, is no longer in the store: the table's ids cannot be checked against "
                "the corpus; load the table again (index_load) from the corpus as it is now"
            )
        change = read_change_set(store, corpus, name, id_type)
        current.difference_update(change.delete_ids.tolist())
        current.update(change.upsert_ids.tolist())
    return np.asarray(sorted(current), dtype=str if id_type == "string" else np.int64)
