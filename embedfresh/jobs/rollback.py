"""Rollback: ``python -m embedfresh.jobs.rollback --set to_release=R --set reason=...``.

Makes an earlier release live again, by a person's decision: its model version, its
embedding sets and its index tables, together. ``to_release`` must be one of the
releases retention keeps (the last ``keep_releases``, the live one included; otherwise
exit 2, naming those that are kept); its model version is verified, streamed, against
its COMMIT marker, and every table it names must still be in the index, complete, before
the pointer moves (anything missing: exit 2, production stays). The pointer moves by
the same compare-and-swap as a release, the history records ``action: rollback`` with
``who``, ``why``, the previous release and the time, and each corpus's live view is
switched back. Rolling back to the live release writes nothing and exits 0 with
``"already": true`` (its views are switched if a kill left them behind).
"""

from __future__ import annotations

import logging
from typing import Any

from embedfresh.core import run_index
from embedfresh.core.cli import main_for
from embedfresh.core.config import RollbackConfig
from embedfresh.core.embedding_sets import read_embedding_set
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.index import open_index
from embedfresh.core.registry import Registry
from embedfresh.core.releases import Release, read_release
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger("embedfresh.jobs.rollback")


def rollback(cfg: RollbackConfig) -> dict[str, Any]:
    """Make an earlier release of the model live again, with its tables and embeddings."""
    store = ArtifactStore(cfg.artifact_root)
    registry = Registry(store, cfg.model)
    doc, _ = registry.read()
    registry.check_kept(doc, cfg.to_release, cfg.keep_releases)  # before anything is read
    target = read_release(store, cfg.model, cfg.to_release)
    _still_whole(store, cfg, target)
    move = registry.rollback(
        target, who=cfg.who, why=cfg.reason, details={"run_id": cfg.run_id}, keep=cfg.keep_releases
    )
    if move.already:
        log.info("release %s of %s is live already: nothing to move", cfg.to_release, cfg.model)
    else:
        log.info(
            "live release of %s rolled back from %s to %s (version %s) by %s: %s",
            cfg.model, move.doc["production"].get("previous_release") or move.previous,
            cfg.to_release, target.version, cfg.who, cfg.reason,
        )  # fmt: skip
    switched = []
    if target.corpora:
        with open_index(cfg.artifact_root) as index:
            for corpus, entry in target.corpora.items():
                if index.switch_live(cfg.model, corpus, entry.table):
                    switched.append(corpus)
    run_index.record(store, cfg.model, cfg.run_id)  # derived data: never fails the move
    return {
        **move.summary(registry.url),
        "who": cfg.who,
        "why": cfg.reason,
        "release_url": target.url,
        "corpora": {
            c: {"table": e.table, "rows": e.rows, "manifest": e.manifest}
            for c, e in target.corpora.items()
        },  # fmt: skip
        "live_views_switched": switched,
    }


def _still_whole(store: ArtifactStore, cfg: RollbackConfig, target: Release) -> None:
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
    if not target.corpora:
        return
    with open_index(cfg.artifact_root) as index:
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
