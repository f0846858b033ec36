"""Corpus sync: ``python -m embedfresh.jobs.corpus_sync --set model=M --set corpus=C [--set release=R]``.

Brings a release's table up to date with its corpus's change sets
(:mod:`embedfresh.core.changes`), so a document added today is found today and one
removed today is not, without waiting for the next release. In order:

1. the release (the live one, or ``release``) and its table for the corpus; the change
   sets the table's ledger lacks, every one read and validated before the first write
   (a bad one: exit 2, naming the file, the column and the row; nothing applied). A
   change set whose bytes differ from those the ledger recorded is refused the same way:
   change sets are immutable;
2. the upserted texts embedded by the release's own encoder
   (:class:`~embedfresh.ml.embedding.query.ReleaseEncoder`: its version, truncation,
   pooling, prompt and fast mode, int8 calibrated on the same texts), so a new row is
   the vector a from-scratch embed of the corpus would give it;
3. each change set applied in one transaction with its ledger row (upserts, deletes):
   a kill between two change sets is finished by a plain re-run, which applies only what
   the ledger lacks; pgvector keeps the HNSW graph as rows arrive;
4. for the live release, its live view: switched to the release's table if a release or
   rollback was killed between its registry move and its view switch (the store's record
   is the truth; the switch is a compare-and-swap that never undoes a newer release's);
5. the sync record ``models/{model}/sync/{release}/{corpus}.json``: the watermark (the
   last change set the table holds), each change set's counts, the table's rows. The
   release document itself never changes; the record is rewritten from the ledger.

Writes ``runs/{model}/{run_id}/reports/sync-{corpus}.json``.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from embedfresh.core import layout
from embedfresh.core.changes import pending_changes
from embedfresh.core.cli import main_for
from embedfresh.core.config import CorpusSyncConfig
from embedfresh.core.embedding_sets import id_type, read_embedding_set
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.index import VectorIndex, open_index
from embedfresh.core.releases import Release, live_release, read_release
from embedfresh.core.storage import ArtifactStore, writing_elsewhere
from embedfresh.ml.embedding.sync import apply_pending

log = logging.getLogger("embedfresh.jobs.corpus_sync")


def corpus_sync(cfg: CorpusSyncConfig) -> dict[str, Any]:
    """Apply the corpus's pending change sets to the release's table."""
    store = ArtifactStore(cfg.artifact_root)
    release = _release(store, cfg)
    entry = release.corpus(cfg.corpus)
    with open_index(cfg.artifact_root) as index:
        eset = read_embedding_set(store, cfg.model, release.version, cfg.corpus)
        pending = pending_changes(store, index, entry.table, cfg.corpus, id_type(store, eset))
        if pending:
            writing_elsewhere(store.root)  # the lease, before the first row
        else:
            log.info("table %s holds every change set of %s: nothing to apply", entry.table,
                     cfg.corpus)  # fmt: skip
        truncated = apply_pending(store, index, entry.table, pending, model=cfg.model,
                                  version=release.version, corpus=cfg.corpus,
                                  settings=entry.settings)  # fmt: skip
        applied = index.applied_changes(entry.table)
        rows = index.count(entry.table)
        repaired = cfg.release is None and _view_follows(store, index, cfg, release)
    record = {
        "model": cfg.model,
        "release": release.release,
        "version": release.version,
        "corpus": cfg.corpus,
        "table": entry.table,
        "watermark": max(applied, default=None),
        "rows": rows,
        "change_sets": [vars(a) for a in applied.values()],
    }
    store.write_json(layout.sync_record(cfg.model, release.release, cfg.corpus), record)
    report = {
        "status": "ok",
        **record,
        # This attempt's work (a re-run after a kill does only what was left):
        "applied_now": [c.name for c in pending],
        "upserts_now": sum(len(c.upsert_ids) for c in pending),
        "deletes_now": sum(len(c.delete_ids) for c in pending),
        "truncated_now": truncated,
        "view_repaired": repaired,
        "synced_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    rel = layout.report(cfg.model, cfg.run_id, f"sync-{cfg.corpus}")
    store.write_json(rel, report)
    keys = ("status", "release", "table", "watermark", "rows", "upserts_now", "deletes_now",
            "truncated_now", "view_repaired")  # fmt: skip
    return {k: report[k] for k in keys} | {"applied_now": len(pending), "report": store.url(rel)}


def _release(store: ArtifactStore, cfg: CorpusSyncConfig) -> Release:
    """The release synced (the live one by default), which must carry the corpus."""
    if cfg.release is None:
        release = live_release(store, cfg.model)
        if release is None or release.bare:
            raise BadInputError(
                f"model {cfg.model} has no live release with corpus tables in {store.url()}: "
                "nothing to sync (a refresh releases one)"
            )
    else:
        release = read_release(store, cfg.model, cfg.release)
    if cfg.corpus not in release.corpora:
        raise BadInputError(
            f"release {release.release} of {cfg.model} carries corpora "
            f"{sorted(release.corpora) or 'none'}, not {cfg.corpus!r}: nothing to sync"
        )
    return release


def _view_follows(
    store: ArtifactStore, index: VectorIndex, cfg: CorpusSyncConfig, release: Release
) -> bool:
    """The live view reads the live release's table (the store's record is the truth):
    a release or rollback killed between its compare-and-swap and its view switch left it
    on the previous one. Switched only if the release is still live after the view was
    read, and only from the table read, so a newer release's own switch is never undone."""
    table = release.corpus(cfg.corpus).table
    current = index.live_table(cfg.model, cfg.corpus)
    if current == table:
        return False
    still = live_release(store, cfg.model)
    if still is None or still.release != release.release:
        return False
    if not index.switch_live(cfg.model, cfg.corpus, table, only_from=current):
        return False
    log.warning(
        "the live view of %s %s read %s, the live release %s names %s: switched (a release "
        "or rollback was stopped between its registry move and its view switch)",
        cfg.model, cfg.corpus, current, release.release, table,
    )  # fmt: skip
    return True


if __name__ == "__main__":
    main_for("corpus_sync", CorpusSyncConfig, corpus_sync)
