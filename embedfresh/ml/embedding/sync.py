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
from typing import Any

from embedfresh.core.changes import ChangeSet
from embedfresh.core.index import AppliedChange, VectorIndex
from embedfresh.core.progress import Progress
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger(__name__)


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
        vectors = encoder.documents(change.upsert_texts)
        done = AppliedChange(change.name, change.sha256, len(change.upsert_ids),
                             len(change.delete_ids))  # fmt: skip
        index.apply_changes(table, done, change.upsert_ids, vectors, change.delete_ids)
        log.info("change set %s applied to %s: %d upserts, %d deletes", change.name, table,
                 done.upserts, done.deletes)  # fmt: skip
        progress.advance(change.rows)
    progress.finish()
    return encoder.truncated
