"""Corpus sync: ``python -m embedfresh.jobs.corpus_sync --set model=M --set corpus=C [--set release=R]``.

Brings a release's table up to date with its corpus's change sets
(:mod:`embedfresh.core.changes`), so a document added today is found today and one
removed today is not, without waiting for the next release. In order:

1. the release (the live one, or ``release``) and its table for the corpus (a live
   release that does not carry the corpus, or none yet: nothing to sync, exit 0); the change
   sets the table's ledger lacks, every one read and validated before the first write
   (a bad one: exit 2, naming the file, the column and the row; nothing applied). A
   change set whose bytes differ from those the ledger recorded is refused the same way:
   change sets are immutable; so is one that sorts before a change set the table holds;
2. the upserted texts embedded by the release's own encoder
   (:class:`~embedfresh.ml.embedding.query.ReleaseEncoder`: its version, truncation,
   pooling, prompt and fast mode, int8 calibrated on the same texts), so a new row is
   the vector a from-scratch embed of the corpus would give it;
3. each change set applied in one transaction with its ledger row (upserts, deletes):
   a kill between two change sets is finished by a plain re-run, which applies only what
   the ledger lacks; pgvector keeps the HNSW graph as rows arrive;
4. for the live release, its live view: switched to the release's table if a release or
   rollback was killed between its registry move and its view switch (the store's record
   is the truth; the switch is a compare-and-swap that never undoes a newer release's).
   Done before the change sets are read: a refused change set never keeps it behind;
5. the sync record ``models/{model}/sync/{release}/{corpus}.json``: the watermark (the
   last change set the table holds), each change set's counts, the table's rows. The
   release document itself never changes; the record is made from the ledger and written
   when it reads otherwise.

Writes ``runs/{model}/{run_id}/reports/sync-{corpus}.json``.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from embedfresh.core import layout
from embedfresh.core.cli import main_for
from embedfresh.core.config import CorpusSyncConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.index import VectorIndex, open_index
from embedfresh.core.releases import Release, live_release, read_release
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.embedding.sync import Synced, catch_up, sync_record, write_sync_record

log = logging.getLogger("embedfresh.jobs.corpus_sync")


def corpus_sync(cfg: CorpusSyncConfig) -> dict[str, Any]:
    """Apply the corpus's pending change sets to the release's table."""
    store = ArtifactStore(cfg.artifact_root)
    release = _release(store, cfg)
    carried = release is not None and cfg.corpus in release.corpora
    with open_index(cfg.artifact_root) as index:
        # The view first: a bad change set (refused below) never keeps it behind.
        view = _view_follows(store, index, cfg, release) if cfg.release is None else None
        done = catch_up(store, index, release, cfg.corpus) if carried else Synced()
    if not carried:
        log.info("%s: nothing to sync", _no_table(cfg, release))
    record = sync_record(cfg.model, release, cfg.corpus, done)
    if carried:
        write_sync_record(store, release, cfg.corpus, record)
    report = {
        "status": "ok",
        **record,
        # This attempt's work (a re-run after a kill does only what was left):
        "applied_now": [c.name for c in done.pending],
        "upserts_now": sum(len(c.upsert_ids) for c in done.pending),
        "deletes_now": sum(len(c.delete_ids) for c in done.pending),
        "truncated_now": done.truncated,
        "view_repaired": view,
        "synced_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    rel = layout.report(cfg.model, cfg.run_id, f"sync-{cfg.corpus}")
    store.write_json(rel, report)
    keys = ("status", "release", "table", "watermark", "rows", "upserts_now", "deletes_now",
            "truncated_now", "view_repaired")  # fmt: skip
    return {k: report[k] for k in keys} | {
        "applied_now": len(done.pending),
        "report": store.url(rel),
    }


def _release(store: ArtifactStore, cfg: CorpusSyncConfig) -> Release | None:
    """The release synced: the live one (None before the first release), or the one
    named, which must carry the corpus."""
    if cfg.release is None:
        return live_release(store, cfg.model)
    release = read_release(store, cfg.model, cfg.release)
    if cfg.corpus not in release.corpora:
        raise BadInputError(f"{_no_table(cfg, release)}: nothing to sync")
    return release


def _no_table(cfg: CorpusSyncConfig, release: Release | None) -> str:
    if release is None:
        return f"model {cfg.model} has no live release"
    return (
        f"release {release.release} of {cfg.model} carries corpora "
        f"{sorted(release.corpora) or 'none'}, not {cfg.corpus!r}"
    )


def _view_follows(
    store: ArtifactStore, index: VectorIndex, cfg: CorpusSyncConfig, release: Release | None
) -> str | None:
    """The live view follows the live release (the store's record is the truth): it
    reads the release's table, or there is none when the release does not carry the
    corpus. A release or rollback killed between its registry move and its view switch
    left it behind; so does a view made before views named their version. Repaired by a
    compare-and-swap on the view's state read before the registry (a newer release's or
    rollback's own switch, even one that changed nothing, moves that state: it is never
    undone). ``switched``, ``dropped`` or None."""
    if release is None:
        return None
    table = release.corpus(cfg.corpus).table if cfg.corpus in release.corpora else None
    state = index.live_state(cfg.model, cfg.corpus)
    still = live_release(store, cfg.model)
    if still is None or still.release != release.release or (table is None and state[0] is None):
        return None
    if table is None:
        moved = index.drop_live(cfg.model, cfg.corpus, only_from=state)
    else:
        moved = index.switch_live(cfg.model, cfg.corpus, table, only_from=state)
    if not moved:
        return None
    log.warning(
        "the live view of %s %s read %s, the live release %s %s: %s (a release or rollback "
        "was stopped between its registry move and its view switch, or the view predates "
        "its version column)",
        cfg.model, cfg.corpus, state[0], release.release,
        f"names {table}" if table else "does not carry it", "switched" if table else "dropped",
    )  # fmt: skip
    return "switched" if table else "dropped"


if __name__ == "__main__":
    main_for("corpus_sync", CorpusSyncConfig, corpus_sync)
