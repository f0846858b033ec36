"""Applying a corpus's change sets to an index table with the table's own encoder.

Shared by the corpus sync (a release's table, between releases) and the index load (a
run's table, caught up before its search check): the upserted texts are embedded by
:class:`~embedfresh.ml.embedding.query.ReleaseEncoder` from the embedding set's recorded
settings, so a synced row is the vector a from-scratch embed of the corpus gives it,
and each change set goes in with its ledger row in one transaction
(:meth:`~embedfresh.core.index.base.VectorIndex.apply_changes`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from embedfresh.core.changes import ChangeSet
from embedfresh.core.index import AppliedChange, VectorIndex
from embedfresh.core.progress import Progress
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger(__name__)

SLICE = 8192  # texts embedded between two progress lines (a change set may be large)


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
