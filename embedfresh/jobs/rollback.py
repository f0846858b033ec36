"""Rollback: ``python -m embedfresh.jobs.rollback --set to_release=R --set reason=...``.

Makes an earlier release live again, by a person's decision: its model version, its
embedding sets and its index tables, together. ``to_release`` must be one of the
releases retention keeps (the last ``keep_releases``, the live one included; otherwise
exit 2, naming those that are kept); its model version is verified, streamed, against
its COMMIT marker, and every table it names must still be in the index, complete, before
the pointer moves (anything missing: exit 2, production stays). Its tables then take the
corpus's change sets that landed since they were live (embedded by the target's own
encoder, as the corpus sync does; a bad change set refuses the rollback, exit 2, before
the pointer moves), and once more after the views switch (a change set that landed
meanwhile was synced to the release live until then); the sync record follows. The
pointer moves by the same compare-and-swap as a release, the history records ``action:
rollback`` with ``who``, ``why``, the previous release and the time, and each corpus's
live view is switched back. Rolling back to the live release moves nothing and exits 0 with
``"already": true`` (its views are switched, and its tables caught up, if a kill left
them behind).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from embedfresh.core import run_index
from embedfresh.core.changes import ChangeSet
from embedfresh.core.cli import main_for
from embedfresh.core.config import RollbackConfig
from embedfresh.core.embedding_sets import read_embedding_set
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.index import VectorIndex, open_index
from embedfresh.core.registry import Registry
from embedfresh.core.releases import Release, read_release
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.embedding.sync import (
    Synced,
    catch_up,
    pending_for,
    sync_record,
    write_sync_record,
)

log = logging.getLogger("embedfresh.jobs.rollback")


def rollback(cfg: RollbackConfig) -> dict[str, Any]:
    """Make an earlier release of the model live again, with its tables and embeddings."""
    store = ArtifactStore(cfg.artifact_root)
    registry = Registry(store, cfg.model)
    doc, _ = registry.read()
    registry.check_kept(doc, cfg.to_release, cfg.keep_releases)  # before anything is read
    target = read_release(store, cfg.model, cfg.to_release)
    live = (doc.get("production") or {}).get("release")
    index_or_none = open_index(cfg.artifact_root) if target.corpora else contextlib.nullcontext()
    with index_or_none as index:
        _still_whole(store, cfg, target, index)
        # Before the pointer moves, the target's tables take the change sets that landed
        # since they were live, every one validated first (a bad one refuses the
        # rollback, nothing written): the rolled-back model serves today's corpus.
        caught: dict[str, Synced] = {c: Synced() for c in target.corpora}
        if live != target.release:
            pending = {c: pending_for(store, index, target, c) for c in target.corpora}
            caught = {c: catch_up(store, index, target, c, pending[c]) for c in pending}
        move = registry.rollback(target, who=cfg.who, why=cfg.reason,
                                 details={"run_id": cfg.run_id}, keep=cfg.keep_releases)  # fmt: skip
        if move.already:
            log.info("release %s of %s is live already: nothing to move", cfg.to_release,
                     cfg.model)  # fmt: skip
        else:
            log.info(
                "live release of %s rolled back from %s to %s (version %s) by %s: %s",
                cfg.model, move.doc["production"].get("previous_release") or move.previous,
                cfg.to_release, target.version, cfg.who, cfg.reason,
            )  # fmt: skip
        switched = [c for c, e in target.corpora.items()
                    if index.switch_live(cfg.model, c, e.table)]  # fmt: skip
        for corpus in target.corpora:
            caught[corpus].pending += _after_the_move(store, index, cfg, target, corpus)
    run_index.record(store, cfg.model, cfg.run_id)  # derived data: never fails the move
    return {
        **move.summary(registry.url),
        "who": cfg.who,
        "why": cfg.reason,
        "release_url": target.url,
        "corpora": {
            c: {
                "table": e.table,
                "rows": e.rows,
                "manifest": e.manifest,
                "change_sets_applied_now": [p.name for p in caught[c].pending],
            }
            for c, e in target.corpora.items()
        },  # fmt: skip
        "live_views_switched": switched,
    }


def _after_the_move(
    store: ArtifactStore, index: VectorIndex, cfg: RollbackConfig, target: Release, corpus: str
) -> list[ChangeSet]:
    """What landed while the pointer moved (synced to the release live until then), or
    was left after a kill, applied to the now live table; its sync record written. The
    move is done: a bad change set is said in the log and left to the corpus sync (it
    refuses it the same way, naming it), never a failed rollback."""
    try:
        late = catch_up(store, index, target, corpus)
    except BadInputError as e:
        log.warning("release %s is live, its %r table not caught up: %s (then: python -m "
                    "embedfresh.jobs.corpus_sync --set model=%s --set corpus=%s)", target.release,
                    corpus, e, cfg.model, corpus)  # fmt: skip
        return []
    write_sync_record(store, target, corpus, sync_record(cfg.model, target, corpus, late))
    return late.pending


def _still_whole(
    store: ArtifactStore, cfg: RollbackConfig, target: Release, index: VectorIndex | None
) -> None:
    """The release's embedding sets are still those it names, and its tables are complete.

    :raises BadInputError: a manifest changed or is gone, or a table is missing or short.
    """
    for corpus, entry in target.corpora.items():
        eset = read_embedding_set(store, cfg.model, target.version, corpus)
        if eset.manifest_sha256 != entry.manifest_sha256:
            raise BadInputError(
                f"cannot roll back to release {target.release}: the embeddings of {corpus!r} "
                f"({eset.manifest_url}) changed since it was made"
            )
    if index is None:
        return
    tables = {t.name: t for t in index.tables(cfg.model)}
    for corpus, entry in target.corpora.items():
        info = tables.get(entry.table)
        if info is None or info.rows_loaded != entry.rows or not info.indexed:
            raise BadInputError(
                f"cannot roll back to release {target.release}: its {corpus!r} table "
                f"{entry.table} is not whole in {index.location} (a garbage collection "
                "with fewer kept releases, or the index moved: python -m "
                f"embedfresh.jobs.index_attach --set model={cfg.model} --set "
                f"release={target.release} rebuilds it here); production stays"
            )


if __name__ == "__main__":
    main_for("rollback", RollbackConfig, rollback)
