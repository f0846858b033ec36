"""Index attach: ``python -m embedfresh.jobs.index_attach --set model=M [--set release=R]``.

Puts a release's tables (the live release's by default) at this deployment's vector
index, after the store moved (the embedded index moves with its folder), the DSN
changed, or production moved to another PostgreSQL. Per corpus of the release:

1. its table, accepted where it already is with this very manifest (re-attached: nothing
   loaded), else created and loaded from the release's verified embedding set, part by
   part from the ledger on (copied: the store is the truth, no database-to-database
   copy);
2. the corpus's change sets its ledger lacks, with the release's own encoder (as
   ``corpus_sync``), then its HNSW index with the settings the release records;
3. for the live release, its live view switched to the table here.

Then ``models/{model}/sync/{release}/_INDEX.json`` records the new location (the
release document is immutable): the search check compares against the live table
there. Every step goes through the index load's and the sync's ledgers: a killed run is
finished by a plain re-run (tests/test_corpus_sync.py kills one mid-load). Writes
``runs/{model}/{run_id}/reports/attach.json``.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from embedfresh.core import layout
from embedfresh.core.changes import pending_changes
from embedfresh.core.cli import main_for
from embedfresh.core.config import IndexAttachConfig
from embedfresh.core.embedding_sets import id_type, read_embedding_set
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.index import AnnSettings, TableSpec, VectorIndex, open_index
from embedfresh.core.index.load import load_parts
from embedfresh.core.releases import CorpusRelease, Release, live_release, read_release
from embedfresh.core.storage import ArtifactStore, writing_elsewhere
from embedfresh.ml.embedding.sync import apply_pending

log = logging.getLogger("embedfresh.jobs.index_attach")


def index_attach(cfg: IndexAttachConfig) -> dict[str, Any]:
    """Attach (or load) a release's tables at this deployment's index."""
    store = ArtifactStore(cfg.artifact_root)
    live = live_release(store, cfg.model)
    release = live if cfg.release is None else read_release(store, cfg.model, cfg.release)
    if release is None or release.release is None or not release.corpora:
        raise BadInputError(
            f"model {cfg.model} has no {'live ' if cfg.release is None else ''}release with "
            f"corpus tables in {store.url()}: nothing to attach"
        )
    is_live = live is not None and live.release == release.release
    corpora: dict[str, dict[str, Any]] = {}
    with open_index(cfg.artifact_root) as index:
        writing_elsewhere(store.root)  # the lease, before the first write
        for corpus, entry in release.corpora.items():
            corpora[corpus] = _attach(store, index, release, corpus, entry)
            if is_live and index.switch_live(cfg.model, corpus, entry.table):
                log.info("live view of %s %s now reads %s", cfg.model, corpus, entry.table)
        location = index.location
    record = {
        "model": cfg.model,
        "release": release.release,
        "location": location,
        "loaded_at": {c: e.index.get("location") for c, e in release.corpora.items()},
        "attached_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    store.write_json(layout.index_location(cfg.model, release.release), record)
    report = {"status": "ok", **record, "corpora": corpora}
    rel = layout.report(cfg.model, cfg.run_id, "attach")
    store.write_json(rel, report)
    return {"status": "ok", "release": release.release, "location": location,
            "corpora": corpora, "report": store.url(rel)}  # fmt: skip


def _attach(
    store: ArtifactStore, index: VectorIndex, release: Release, corpus: str, entry: CorpusRelease
) -> dict[str, Any]:
    """One corpus's table at ``index``: accepted, or loaded and caught up, then indexed."""
    eset = read_embedding_set(store, release.model, release.version, corpus)
    if eset.manifest_sha256 != entry.manifest_sha256:
        raise BadInputError(
            f"the embeddings of {corpus!r} ({eset.manifest_url}) changed since release "
            f"{release.release} was made: its table cannot be rebuilt from them"
        )
    kind = id_type(store, eset)
    spec = TableSpec(name=entry.table, model=release.model, release=str(release.release),
                     corpus=corpus, version=release.version, dim=eset.hidden, id_type=kind,
                     manifest_sha256=eset.manifest_sha256, rows=eset.rows)  # fmt: skip
    index.prepare_table(spec)
    _, todo, rows, _ = load_parts(store, index, spec.name, eset, log)
    pending = pending_changes(store, index, spec.name, corpus, kind)
    apply_pending(store, index, spec.name, pending, model=release.model,
                  version=release.version, corpus=corpus, settings=entry.settings)  # fmt: skip
    ann = entry.index.get("ann") or {}
    built = index.build_ann(spec.name, AnnSettings(**ann))
    log.info(
        "%s %s: table %s %s at %s", release.release, corpus, spec.name,
        f"loaded ({rows} rows)" if todo else "re-attached", index.location,
    )  # fmt: skip
    return {"table": spec.name, "parts_loaded": len(todo), "change_sets_applied_now":
            [c.name for c in pending], "ann_built": built, "rows": index.count(spec.name)}  # fmt: skip


if __name__ == "__main__":
    main_for("index_attach", IndexAttachConfig, index_attach)
