"""Loading an embedding set into an index table, part by part, from the ledger on: the
index load's loop, shared with the index attach (a release's tables at a new address)."""

from __future__ import annotations

import logging

from embedfresh.core.embedding_sets import EmbeddingSet, read_part
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.index.base import ShardLoad, VectorIndex
from embedfresh.core.progress import Progress
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger(__name__)


def load_parts(
    store: ArtifactStore,
    index: VectorIndex,
    table: str,
    eset: EmbeddingSet,
    logger: logging.Logger = log,
) -> tuple[dict[str, ShardLoad], list[str], int, float]:
    """Every part of ``eset`` the table's ledger lacks, read and checked against the
    manifest, loaded one at a time (memory flat in corpus size): the ledger as found, the
    parts loaded now, their rows and the seconds it took.

    :raises BadInputError: the ledger records a part with other contents than ``eset``.
    """
    loaded = index.loaded_shards(table)
    stale = {n: s for n, s in loaded.items() if eset.parts.get(n, {}).get("sha256") != s.sha256}
    if stale:  # the table was accepted for this manifest: a mismatch is a bug or a hand edit
        raise BadInputError(
            f"the ledger of {table} records parts {sorted(stale)} with other contents "
            f"than {eset.manifest_url}; nothing was changed"
        )
    todo = [n for n in eset.parts if n not in loaded]
    pending_rows = sum(int(eset.parts[n]["rows"]) for n in todo)
    if loaded:
        logger.info(
            "%d of %d parts of %s already loaded into %s (the ledger): loading %d",
            len(loaded), len(eset.parts), eset.manifest_url, table, len(todo),
        )  # fmt: skip
    progress = Progress(f"loading {table}", pending_rows, log=logger)
    for name in todo:
        ids, vectors = read_part(store, eset, name)
        index.load_shard(table, name, eset.parts[name]["sha256"], ids, vectors)
        progress.advance(len(ids))
        del ids, vectors
    return loaded, todo, pending_rows, progress.finish()
