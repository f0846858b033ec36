"""Search the live index for a query: ``python -m embedfresh.jobs.search --set query="red
running shoes" [--set corpus=C] [--set k=5] [--set release=R]``.

A smoke test a person can run: reads the live release of ``model`` (or the release
named), embeds the query with that release's own query encoder and searches that
release's table, the way a search service does; prints one line per result (rank, id,
cosine similarity, the corpus text) and, last, the results as one JSON line. Reads only:
it takes no lease and writes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embedfresh.core import layout
from embedfresh.core.cli import main_for
from embedfresh.core.config import SearchConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.index import open_index
from embedfresh.core.parquet import read_parquet
from embedfresh.core.releases import Release, live_release, read_release
from embedfresh.core.shards import corpus_shards
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.embedding.query import ReleaseEncoder

log = logging.getLogger("embedfresh.jobs.search")


def search(cfg: SearchConfig) -> dict[str, Any]:
    """Search a release's table (the live one by default) for ``query``."""
    store = ArtifactStore(cfg.artifact_root)
    if cfg.release is None:
        release = live_release(store, cfg.model)
        if release is None:
            raise BadInputError(f"model {cfg.model} has no live release in {store.url()}")
    else:
        release = read_release(store, cfg.model, cfg.release)
    corpus = cfg.corpus or _only_corpus(release)
    entry = release.corpus(corpus)
    encoder = ReleaseEncoder.for_release(store, release, corpus)
    vector = encoder.queries([cfg.query])
    with open_index(cfg.artifact_root) as index:
        found = index.search(
            entry.table, vector, cfg.k, ef_search=entry.index.get("ann", {}).get("ef_search")
        )
    ids, distances = found.ids[0], found.distances[0]
    texts = _texts(store, corpus, ids)
    print(
        f"release {release.release} (version {release.version}), table {entry.table}: {cfg.query!r}"
    )
    results = []
    for rank, (doc_id, distance) in enumerate(
        zip(ids.tolist(), distances.tolist(), strict=True), 1
    ):
        text = texts.get(doc_id, "")
        print(f"{rank:3d}  {doc_id}  {1 - distance:.4f}  {text[:100]}")
        results.append(
            {"rank": rank, "id": doc_id, "similarity": round(1 - distance, 6), "text": text}
        )
    return {
        "release": release.release,
        "version": release.version,
        "corpus": corpus,
        "table": entry.table,
        "query": cfg.query,
        "latency_ms": round(float(found.seconds[0]) * 1000, 3),
        "results": results,
    }


def _only_corpus(release: Release) -> str:
    """The corpus of a release that has one.

    :raises BadInputError: it has none, or several (named: pick one with ``corpus=``).
    """
    if len(release.corpora) == 1:
        return next(iter(release.corpora))
    what = f"release {release.release}" if release.release else f"production {release.version}"
    if not release.corpora:
        raise BadInputError(f"{what} of {release.model} has no corpus: nothing to search")
    raise BadInputError(
        f"{what} of {release.model} has corpora {', '.join(release.corpora)}: name the one "
        "to search (--set corpus=...)"
    )


def _texts(store: ArtifactStore, corpus: str, ids: np.ndarray) -> dict[Any, str]:
    """The corpus texts of ``ids``, read shard by shard until all are found."""
    wanted = set(ids.tolist())
    out: dict[Any, str] = {}
    for name in corpus_shards(store, corpus).values():
        table = read_parquet(store, f"{layout.corpus(corpus)}/{name}")
        column = table.column("id")
        hits = table.filter(pc.is_in(column, value_set=pa.array(list(wanted), column.type)))
        for doc_id, text in zip(
            hits.column("id").to_pylist(), hits.column("text").to_pylist(), strict=True
        ):
            out[doc_id] = text
        if wanted <= set(out):
            break
    return out


if __name__ == "__main__":
    main_for("search", SearchConfig, search, read_only=True)
