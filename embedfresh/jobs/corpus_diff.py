"""Corpus diff: ``python -m embedfresh.jobs.corpus_diff --set corpus=C --set snapshot=S``.

For a producer that writes full snapshots rather than change sets: the new snapshot
(``corpora/{corpus}/snapshots/{snapshot}/part-NNNNN.parquet``, the corpus's own schema)
is compared with the corpus as it stands (its snapshot with every change set applied,
in order; a change set named after the snapshot is refused, so a re-run computes the
same difference), and the difference lands as one change set, ``corpora/{corpus}/changes/
{snapshot}.parquet``: an upsert for every id that is new or whose text changed, a delete
for every id that is gone. Then update the corpus's Asset; ``corpus_sync`` applies it.

Both sides are read whole into memory (ids and texts: about the corpus's text size,
twice). A re-run writes the same bytes (an existing change set of that name with other
bytes is refused: change sets are immutable); a snapshot equal to the corpus lands
nothing. Writes ``runs/{model}/{run_id}/reports/diff-{corpus}.json``.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from embedfresh.core import layout
from embedfresh.core.changes import DELETE, UPSERT, change_set_names, read_change_set
from embedfresh.core.cli import main_for
from embedfresh.core.config import CorpusDiffConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.shards import corpus_shards, list_parts, read_corpus_shard
from embedfresh.core.storage import ArtifactStore, sha256_bytes
from embedfresh.ml.data.generate import parquet_bytes

log = logging.getLogger("embedfresh.jobs.corpus_diff")


def corpus_diff(cfg: CorpusDiffConfig) -> dict[str, Any]:
    """Land the change set that takes the corpus to the snapshot."""
    store = ArtifactStore(cfg.artifact_root)
    snapshot_dir = layout.corpus_snapshot(cfg.corpus, cfg.snapshot)
    target = _read(store, snapshot_dir, list_parts(store, snapshot_dir))
    if not target:
        raise BadInputError(f"snapshot {store.url(snapshot_dir)} has no part-NNNNN.parquet")
    current = _read(store, layout.corpus(cfg.corpus), corpus_shards(store, cfg.corpus))
    kind = "string" if isinstance(next(iter(current)), str) else "int64"
    if ("string" if isinstance(next(iter(target)), str) else "int64") != kind:
        raise BadInputError(
            f"snapshot {store.url(snapshot_dir)} has {'int64' if kind == 'string' else 'string'} "
            f"ids, corpus {cfg.corpus!r} has {kind} ids"
        )
    names = change_set_names(store, cfg.corpus)
    later = [n for n in names if n > cfg.snapshot]
    if later:
        raise BadInputError(
            f"change sets {later[:5]} of corpus {cfg.corpus!r} sort after snapshot "
            f"{cfg.snapshot!r}: its change set would apply after them; name the snapshot "
            "after the last change set (a UTC time)"
        )
    for name in names:
        if name == cfg.snapshot:
            continue  # this snapshot's own change set, landed by an earlier attempt
        change = read_change_set(store, cfg.corpus, name, kind)
        for doc in change.delete_ids.tolist():
            current.pop(doc, None)
        current.update(zip(change.upsert_ids.tolist(), change.upsert_texts, strict=True))
    upserts = sorted(i for i, text in target.items() if current.get(i) != text)
    deletes = sorted(set(current) - set(target))
    rel = layout.change_set(cfg.corpus, cfg.snapshot)
    if upserts or deletes:
        _land(store, rel, kind, upserts, deletes, target)
    else:
        log.info("snapshot %s equals corpus %s: no change set", cfg.snapshot, cfg.corpus)
    report = {
        "status": "ok",
        "corpus": cfg.corpus,
        "snapshot": cfg.snapshot,
        "change_set": store.url(rel) if upserts or deletes else None,
        "upserts": len(upserts),
        "deletes": len(deletes),
        "rows": len(target),
    }
    store.write_json(layout.report(cfg.model, cfg.run_id, f"diff-{cfg.corpus}"), report)
    return report


def _read(store: ArtifactStore, directory: str, parts: dict[int, str]) -> dict[Any, str]:
    """Id -> text of every part, refusing an id in two parts."""
    out: dict[Any, str] = {}
    for name in parts.values():
        ids, texts = read_corpus_shard(store, f"{directory}/{name}")
        before = len(out)
        out.update(zip(ids.tolist(), texts, strict=True))
        if len(out) != before + len(ids):
            raise BadInputError(
                f"{store.url(directory)}: an id of {name} is in an earlier part too"
            )
    return out


def _land(
    store: ArtifactStore, rel: str, kind: str, upserts: list, deletes: list, texts: dict
) -> None:
    """Write the change set once: the same bytes again are kept, other bytes refused."""
    ids = upserts + deletes
    table = pa.table(
        {
            "op": pa.array([UPSERT] * len(upserts) + [DELETE] * len(deletes), pa.string()),
            "id": pa.array(ids, pa.string() if kind == "string" else pa.int64()),
            "text": pa.array([texts[i] for i in upserts] + [None] * len(deletes), pa.string()),
        }
    )
    data = parquet_bytes(table)
    if store.exists(rel):
        if sha256_bytes(store.read_bytes(rel)) != sha256_bytes(data):
            raise BadInputError(
                f"change set {store.url(rel)} exists with other contents: change sets are "
                "immutable; name the new snapshot anew"
            )
        return
    store.write_bytes(rel, data)
    log.info("landed %s: %d upserts, %d deletes", store.url(rel), len(upserts), len(deletes))


if __name__ == "__main__":
    main_for("corpus_diff", CorpusDiffConfig, corpus_diff)
