"""Garbage collection: ``python -m embedfresh.jobs.garbage_collect --set model=M [--set dry_run=true]``.

Deletes what no kept release references, so a model refreshed daily does not keep every
day's corpus embeddings and index tables. Kept: the last ``keep_releases`` releases
(``$EMBEDFRESH_KEEP_RELEASES``, default 3; the live one included), exactly what rollback
can reach. Deleted, in this order:

1. index tables of the model that no kept release names (never a live view's table);
2. embedding sets (``embeddings/{model}/{version}/{corpus}/``) of versions no kept
   release is of, nor production;
3. model versions of releases past retention: releases that were live, by the
   registry's history (a version that was never live, a release whose compare-and-swap
   lost included, is a run's own output, left alone).

Nothing written within ``grace_hours`` (default 24) is deleted, nor anything of a run
that holds a live lease (a refresh writing it now); what was spared and why is in the
report. Each deletion is one write: a job killed between two of them is finished by a
plain re-run. Writes ``runs/{model}/{run_id}/reports/gc.json``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from embedfresh.core import layout
from embedfresh.core.cli import main_for
from embedfresh.core.config import GarbageCollectConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.index import open_index
from embedfresh.core.leases import live_holders
from embedfresh.core.registry import Registry, release_history
from embedfresh.core.releases import Release, kept_releases, read_release
from embedfresh.core.storage import ArtifactStore, writing_elsewhere

log = logging.getLogger("embedfresh.jobs.garbage_collect")


def garbage_collect(cfg: GarbageCollectConfig) -> dict[str, Any]:
    """Delete the embedding sets, index tables and model versions no kept release needs."""
    store = ArtifactStore(cfg.artifact_root)
    doc, _ = Registry(store, cfg.model).read()
    if doc is None:
        raise BadInputError(
            f"model {cfg.model} has no registry in {store.url()}: nothing is released"
        )
    kept_ids = kept_releases(doc, cfg.keep_releases)
    kept = [read_release(store, cfg.model, r) for r in kept_ids]
    production = doc["production"]["version"]
    keep_versions = {r.version for r in kept} | {production}
    keep_tables = {e.table for r in kept for e in r.corpora.values()}
    past = _past_retention(store, cfg.model, doc, set(kept_ids))
    cutoff = time.time() - cfg.grace_hours * 3600
    spared: list[dict[str, str]] = []
    busy: dict[str, bool] = {}

    def in_use(run_or_version: str) -> bool:
        if run_or_version not in busy:
            busy[run_or_version] = bool(live_holders(store, cfg.model, run_or_version))
        return busy[run_or_version]

    def recent(what: str, when: float | None) -> bool:
        if when is not None and when > cutoff:
            spared.append({"what": what, "why": f"written within the last {cfg.grace_hours:g} h"})
            return True
        return False

    tables = _tables(cfg, keep_tables, in_use, recent, spared)
    embeddings = []
    for version in store.listdir(layout.embeddings_root(cfg.model)):
        if version in keep_versions:
            continue
        for corpus in store.listdir(f"{layout.embeddings_root(cfg.model)}/{version}"):
            rel = layout.embeddings(cfg.model, version, corpus)
            if in_use(version):
                spared.append({"what": store.url(rel), "why": f"run {version} holds a live lease"})
            elif not recent(store.url(rel), store.last_modified(rel)):
                embeddings.append(rel)
    versions = []
    for version in sorted({r.version for r in past} - keep_versions):
        rel = layout.model_version(cfg.model, version)
        if not store.exists(rel):
            continue
        if in_use(version):
            spared.append({"what": store.url(rel), "why": f"run {version} holds a live lease"})
        elif not recent(store.url(rel), store.last_modified(rel)):
            versions.append(rel)

    if cfg.dry_run:
        log.info("dry run: would drop %d table(s), delete %d embedding set(s) and %d version(s)",
                 len(tables), len(embeddings), len(versions))  # fmt: skip
    else:
        writing_elsewhere(store.root)  # the lease, before the first table is dropped
        _drop(cfg, tables)
        for rel in embeddings + versions:
            log.info("deleting %s: no kept release references it", store.url(rel))
            store.remove(rel, recursive=True)
            parent = rel.rsplit("/", 1)[0]
            if rel in embeddings and not store.listdir(parent):  # a version's last corpus
                store.remove(parent, recursive=True)
    report = {
        "status": "ok",
        "model": cfg.model,
        "dry_run": cfg.dry_run,
        "keep_releases": cfg.keep_releases,
        "kept_releases": kept_ids,
        "tables_dropped": tables,
        "embeddings_deleted": [store.url(r) for r in embeddings],
        "versions_deleted": [store.url(r) for r in versions],
        "spared": spared,
    }
    store.write_json(layout.report(cfg.model, cfg.run_id, "gc"), report)
    return {k: report[k] for k in ("status", "dry_run", "kept_releases")} | {
        "tables_dropped": len(tables),
        "embeddings_deleted": len(embeddings),
        "versions_deleted": len(versions),
        "spared": len(spared),
    }


def _past_retention(
    store: ArtifactStore, model: str, registry_doc: dict[str, Any], kept: set[str]
) -> list[Release]:
    """The releases that were live and are no longer kept (their documents stay: the
    history names them). A release document whose compare-and-swap lost never went
    live: its version is a run's own output, not a release past retention."""
    was_live = set(release_history(registry_doc))
    names = [
        n.removesuffix(".json")
        for n in store.listdir(layout.releases(model))
        if n.endswith(".json")
    ]
    return [read_release(store, model, n) for n in sorted(names) if n in was_live - kept]


def _tables(cfg, keep_tables, in_use, recent, spared) -> list[str]:
    """The model's tables in the index that no kept release names, and may go now."""
    out = []
    with open_index(cfg.artifact_root) as index:
        live = {index.live_table(cfg.model, c) for c in {t.corpus for t in index.tables(cfg.model)}}
        for info in index.tables(cfg.model):
            if info.name in keep_tables:
                continue
            what = f"table {info.name} ({index.location})"
            if info.name in live:  # a bare release since: the view still reads it
                spared.append({"what": what, "why": f"the live view of {info.corpus} reads it"})
            elif in_use(info.release):
                spared.append({"what": what, "why": f"run {info.release} holds a live lease"})
            elif not recent(what, info.created_at.timestamp() if info.created_at else None):
                out.append(info.name)
    return out


def _drop(cfg: GarbageCollectConfig, tables: list[str]) -> None:
    if not tables:
        return
    with open_index(cfg.artifact_root) as index:
        for name in tables:
            log.info("dropping table %s of %s: no kept release references it", name, index.location)
            index.drop_table(name)


if __name__ == "__main__":
    main_for("garbage_collect", GarbageCollectConfig, garbage_collect)
