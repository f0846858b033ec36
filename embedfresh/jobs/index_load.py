"""Load a release's embeddings into the vector index: ``python -m embedfresh.jobs.index_load
--set run_id=R --set corpus=products``.

The release is the run (``run_id``); its model version defaults to the run id. In order:

1. the verified embedding set (``embeddings/{model}/{version}/{corpus}/_MANIFEST.json``;
   none: exit 2, naming the command that verifies it);
2. the index (:func:`embedfresh.core.index.open_index`: ``$EMBEDFRESH_INDEX_DSN`` or the
   embedded server; unreachable: exit 75);
3. the release's table (:func:`embedfresh.core.index.table_name`): created, or accepted
   when it holds this very manifest's vectors; a table of that name holding anything
   else, or one the index did not make, is refused (exit 2) and nothing is dropped;
4. every part the ledger lacks, read and checked against the manifest's sha256, COPYed
   in one transaction with its ledger row: a re-run after a kill (or after the
   database went away: exit 75) loads only what is missing;
5. the table holds every corpus id exactly once (its primary key, and its row count
   against the manifest's);
6. the corpus's change sets the table's ledger lacks (``corpora/{corpus}/changes/``,
   docs/SEARCH.md "Corpus changes"), embedded with the set's own settings and applied
   one transaction each: the table is the corpus as it stands when the load runs, and
   the search check reads that table;
7. the HNSW index (``vector_cosine_ops``, ``hnsw_m``, ``hnsw_ef_construction``,
   ``maintenance_work_mem``), once;
8. the report ``runs/{model}/{run_id}/reports/index-{corpus}.json``.

Two loads of one release and corpus at once: the second exits 75 naming the holder of
the lease. Progress (rows, rate, ETA) is logged every 30 s or 5%.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from embedfresh.core import layout
from embedfresh.core.changes import pending_changes
from embedfresh.core.cli import main_for
from embedfresh.core.config import IndexLoadConfig
from embedfresh.core.embedding_sets import id_type, read_embedding_set
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.index import AnnSettings, TableSpec, open_index, table_name
from embedfresh.core.index.load import load_parts
from embedfresh.core.parquet import job_memory_pool, large_blocks_back_to_the_os
from embedfresh.core.storage import ArtifactStore, writing_elsewhere
from embedfresh.ml.embedding.sync import apply_pending

log = logging.getLogger("embedfresh.jobs.index_load")


def report_kind(corpus: str) -> str:
    return f"index-{corpus}"


def index_load(cfg: IndexLoadConfig) -> dict[str, Any]:
    """Load the release's embedding set into its table of the vector index, then index it."""
    # Arrow on the C allocator, as the embed job, and the C allocator handing each
    # part's buffers back to the OS: otherwise the high-water mark creeps with the
    # number of parts read (+9.7% from 100k to 1M rows, docs/BENCHMARKS.md).
    large_blocks_back_to_the_os()
    with job_memory_pool():
        return _load(cfg)


def _load(cfg: IndexLoadConfig) -> dict[str, Any]:
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    eset = read_embedding_set(store, cfg.model, cfg.target_version, cfg.corpus)
    if not eset.parts:
        raise BadInputError(f"{eset.manifest_url} lists no parts")
    spec = TableSpec(
        name=table_name(cfg.model, cfg.run_id, cfg.corpus),
        model=cfg.model,
        release=cfg.run_id,
        corpus=cfg.corpus,
        version=cfg.target_version,
        dim=eset.hidden,
        id_type=id_type(store, eset),
        manifest_sha256=eset.manifest_sha256,
        rows=eset.rows,
    )
    ann = AnnSettings(
        m=cfg.hnsw_m,
        ef_construction=cfg.hnsw_ef_construction,
        ef_search=cfg.ef_search,
        maintenance_work_mem=cfg.maintenance_work_mem,
    )
    with open_index(cfg.artifact_root) as index:
        writing_elsewhere(store.root)  # the lease, before the first row
        index.prepare_table(spec)
        loaded, todo, pending_rows, load_seconds = load_parts(store, index, spec.name, eset, log)
        rows, applied = index.count(spec.name), index.applied_changes(spec.name)
        if rows != eset.rows and not applied:
            raise BadInputError(
                f"table {spec.name} of {index.location} holds {rows} rows after the load, "
                f"{eset.manifest_url} lists {eset.rows}: it was changed outside embedfresh"
            )
        # Caught up with the corpus's change sets before the graph is built (and before
        # the search check reads the table): the table is the corpus as it stands now.
        pending = pending_changes(store, index, spec.name, cfg.corpus, spec.id_type)
        truncated = apply_pending(store, index, spec.name, pending, model=cfg.model,
                                  version=cfg.target_version, corpus=cfg.corpus,
                                  settings=eset.settings)  # fmt: skip
        if pending:
            applied, rows = index.applied_changes(spec.name), index.count(spec.name)
        t0 = time.perf_counter()
        built = index.build_ann(spec.name, ann)
        build_seconds = time.perf_counter() - t0
        log.info(
            "HNSW index of %s %s in %.1f s (%s)",
            spec.name, "built" if built else "already there", build_seconds, ann.to_dict(),
        )  # fmt: skip
        where = {"kind": index.kind, "location": index.location, "table": spec.name}
    report = {
        "status": "ok",
        "model": cfg.model,
        "release": cfg.run_id,
        "version": cfg.target_version,
        "corpus": cfg.corpus,
        "embeddings": eset.to_record(),
        "index": {**where, "ann": ann.to_dict()},
        "rows": rows,
        "parts": len(eset.parts),
        "parts_loaded": len(todo),
        "parts_reused": len(loaded),
        "rows_loaded": pending_rows,
        "load_seconds": round(load_seconds, 3),
        "rows_per_second": round(pending_rows / load_seconds, 1) if load_seconds > 0 else None,
        "ann_built": built,
        "change_sets": sorted(applied),
        "watermark": max(applied, default=None),
        "change_sets_applied_now": [c.name for c in pending],
        "truncated_now": truncated,
        "ann_build_seconds": round(build_seconds, 3),
        "seconds": round(time.perf_counter() - started, 3),
    }
    rel = layout.report(cfg.model, cfg.run_id, report_kind(cfg.corpus))
    store.write_json(rel, report)
    return {**{k: report[k] for k in ("status", "release", "version", "corpus", "rows")},
            "table": spec.name, "index": where, "parts_loaded": len(todo),
            "parts_reused": len(loaded), "report": store.url(rel)}  # fmt: skip


if __name__ == "__main__":
    main_for("index_load", IndexLoadConfig, index_load)
