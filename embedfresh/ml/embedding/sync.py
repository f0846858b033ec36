"""Applying a corpus's change sets to an index table with the table's own encoder.

Shared by the corpus sync (a release's table, between releases), the rollback (its
target's tables, before and after the pointer moves) and the index load (a run's table,
caught up before its search check): the upserted texts are embedded by
:class:`~embedfresh.ml.embedding.query.ReleaseEncoder` from the embedding set's recorded
settings, so a synced row is the vector a from-scratch embed of the corpus gives it,
and each change set goes in with its ledger row in one transaction
(:meth:`~embedfresh.core.index.base.VectorIndex.apply_changes`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embedfresh.core import layout
from embedfresh.core.changes import ChangeSet, pending_changes
from embedfresh.core.embedding_sets import id_type, read_embedding_set
from embedfresh.core.index import AppliedChange, VectorIndex
from embedfresh.core.progress import Progress
from embedfresh.core.releases import Release
from embedfresh.core.storage import ArtifactStore, writing_elsewhere

log = logging.getLogger(__name__)

SLICE = 8192  # texts embedded between two progress lines (a change set may be large)


@dataclass
class Synced:
    """What a catch-up did to a release's table (nothing, when the release carries no
    such table): the change sets applied now, their truncated texts, and the ledger and
    row count after."""

    table: str | None = None
    pending: list[ChangeSet] = field(default_factory=list)
    truncated: int = 0
    applied: dict[str, AppliedChange] = field(default_factory=dict)
    rows: int = 0


def pending_for(
    store: ArtifactStore, index: VectorIndex, release: Release, corpus: str
) -> list[ChangeSet]:
    """The change sets the release's table of ``corpus`` lacks, every one read and
    validated (:func:`~embedfresh.core.changes.pending_changes`: a bad one raises
    :class:`~embedfresh.core.exit_codes.BadInputError` before anything is written)."""
    eset = read_embedding_set(store, release.model, release.version, corpus)
    table = release.corpus(corpus).table
    return pending_changes(store, index, table, corpus, id_type(store, eset))


def catch_up(
    store: ArtifactStore,
    index: VectorIndex,
    release: Release,
    corpus: str,
    pending: list[ChangeSet] | None = None,
) -> Synced:
    """The release's table of ``corpus`` brought up to date with the corpus's change
    sets: ``pending``, or those :func:`pending_for` finds now."""
    entry = release.corpus(corpus)
    if pending is None:
        pending = pending_for(store, index, release, corpus)
    if pending:
        writing_elsewhere(store.root)  # the lease, before the first row
    else:
        log.info("table %s holds every change set of %s: nothing to apply", entry.table, corpus)
    truncated = apply_pending(store, index, entry.table, pending, model=release.model,
                              version=release.version, corpus=corpus,
                              settings=entry.settings)  # fmt: skip
    applied = index.applied_changes(entry.table)
    return Synced(entry.table, pending, truncated, applied, index.count(entry.table))


def sync_record(model: str, release: Release | None, corpus: str, synced: Synced) -> dict:
    """The sync record of a release's table: its watermark (the last change set it
    holds), each change set's counts, its rows."""
    return {
        "model": model,
        "release": None if release is None else release.release,
        "version": None if release is None else release.version,
        "corpus": corpus,
        "table": synced.table,
        "watermark": max(synced.applied, default=None),
        "rows": synced.rows,
        "change_sets": [vars(a) for a in synced.applied.values()],
    }


def write_sync_record(store: ArtifactStore, release: Release, corpus: str, record: dict) -> None:
    """``models/{model}/sync/{release}/{corpus}.json``, when it does not read ``record``
    already (a re-run that applied nothing writes nothing)."""
    rel = layout.sync_record(release.model, release.release, corpus)
    if not store.exists(rel) or store.read_json(rel) != record:
        store.write_json(rel, record)


def apply_pending(
    store: ArtifactStore,
    index: VectorIndex,
    table: str,
    pending: list[ChangeSet],
    *,
    model: str,
    version: str,
    corpus: str,
    settings: dict[str, Any],
) -> int:
    """Embed and apply ``pending`` to ``table``, in order; the texts truncated on the way
    (each also logged by the encoder)."""
    if not pending:
        return 0
    from embedfresh.ml.embedding.query import ReleaseEncoder

    encoder = ReleaseEncoder(store, model, version, corpus, settings)
    progress = Progress(f"applying change sets to {table}", sum(c.rows for c in pending), log=log)
    for change in pending:
        parts = [np.zeros((0, encoder.hidden), dtype=np.float32)]
        for start in range(0, len(change.upsert_texts), SLICE):
            parts.append(encoder.documents(change.upsert_texts[start : start + SLICE]))
            progress.advance(len(parts[-1]))
        vectors = np.concatenate(parts)
        done = AppliedChange(change.name, change.sha256, len(change.upsert_ids),
                             len(change.delete_ids), change.etag)  # fmt: skip
        log.info("change set %s: writing %d upserts and %d deletes to %s in one transaction",
                 change.name, done.upserts, done.deletes, table)  # fmt: skip
        started = time.perf_counter()
        index.apply_changes(table, done, change.upsert_ids, vectors, change.delete_ids)
        log.info("change set %s applied to %s in %.1f s", change.name, table,
                 time.perf_counter() - started)  # fmt: skip
        progress.advance(done.deletes)
    progress.finish()
    return encoder.truncated
