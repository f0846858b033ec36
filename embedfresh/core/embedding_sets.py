"""A verified embedding set: one corpus embedded with one model version, as its
``_MANIFEST.json`` (written last by :mod:`embedfresh.jobs.embed_verify`) describes it.

What the release side reads: the index load streams its parts into a table, the search
check scans them for the exact top-k, and a release records the manifest's URL and
sha256, so a release names exactly the vectors its table holds. Every part read is
checked against the sha256 and size the manifest lists. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.parquet import read_parquet_bytes
from embedfresh.core.shards import MANIFEST
from embedfresh.core.storage import ArtifactStore, sha256_bytes


@dataclass(frozen=True)
class EmbeddingSet:
    model: str
    version: str
    corpus: str
    directory: str
    """The set's folder, relative to the store root."""
    manifest_url: str
    manifest_sha256: str
    """sha256 of the manifest's bytes: the identity a release and a table record."""
    rows: int
    hidden: int
    settings: dict[str, Any]
    parts: dict[str, dict[str, Any]]
    """Part name -> ``{"rows", "sha256", "size"}``, in shard order."""

    def to_record(self) -> dict[str, Any]:
        """What a report or a release says about the set."""
        return {
            "manifest": self.manifest_url,
            "manifest_sha256": self.manifest_sha256,
            "rows": self.rows,
            "hidden": self.hidden,
            "settings": self.settings,
        }


def read_embedding_set(store: ArtifactStore, model: str, version: str, corpus: str) -> EmbeddingSet:
    """The verified embeddings of ``corpus`` by ``version`` of ``model``.

    :raises BadInputError: no manifest (the set was never verified: the message says
        which command verifies it), or one that is not a manifest of these embeddings.
    """
    directory = layout.embeddings(model, version, corpus)
    rel = f"{directory}/{MANIFEST}"
    if not store.exists(rel):
        raise BadInputError(
            f"no verified embeddings of corpus {corpus!r} by {model} version {version}: "
            f"{store.url(rel)} does not exist; embed and verify them first (python -m "
            f"embedfresh.jobs.embed_verify --set model={model} --set version={version} "
            f"--set corpus={corpus})"
        )
    raw = store.read_bytes(rel)
    try:
        manifest = json.loads(raw)
        parts = dict(manifest["parts"])
        out = EmbeddingSet(
            model=model,
            version=version,
            corpus=corpus,
            directory=directory,
            manifest_url=store.url(rel),
            manifest_sha256=sha256_bytes(raw),
            rows=int(manifest["rows"]),
            hidden=int(manifest["hidden"]),
            settings=dict(manifest.get("settings") or {}),
            parts=dict(sorted(parts.items())),
        )
        wrong = [
            k
            for k, v in (("version", version), ("corpus", corpus), ("model", model))
            if manifest.get(k) != v
        ]
    except (ValueError, KeyError, TypeError) as e:
        raise BadInputError(f"{store.url(rel)} is not an embeddings manifest ({e!r})") from e
    if wrong or manifest.get("kind") != "embeddings":
        raise BadInputError(
            f"{store.url(rel)} is not the manifest of these embeddings (it names "
            f"{', '.join(f'{k} {manifest.get(k)!r}' for k in wrong) or 'another kind'})"
        )
    return out


def id_type(store: ArtifactStore, eset: EmbeddingSet) -> str:
    """``int64`` or ``string``: the ids' type, from the first part's Parquet footer."""
    import pyarrow.parquet as pq

    rel = f"{eset.directory}/{next(iter(eset.parts))}"
    with store.open_read(rel) as f:
        field = pq.ParquetFile(f).schema_arrow.field("id")
    return "int64" if pa.types.is_integer(field.type) else "string"


def read_part(store: ArtifactStore, eset: EmbeddingSet, name: str) -> tuple[np.ndarray, np.ndarray]:
    """One part's ids (int64, or str) and float32 vectors [rows, hidden], after checking
    its bytes against the manifest.

    :raises BadInputError: the part changed since the manifest was written.
    """
    entry = eset.parts[name]
    rel = f"{eset.directory}/{name}"
    data = store.read_bytes(rel)
    if len(data) != entry["size"] or sha256_bytes(data) != entry["sha256"]:
        raise BadInputError(
            f"{store.url(rel)} does not match its manifest {eset.manifest_url} (sha256 or "
            "size differ): it changed after it was verified; embed and verify again"
        )
    table = read_parquet_bytes(data, store.url(rel))
    del data
    ids = table.column("id").to_numpy(zero_copy_only=False)
    if ids.dtype == object:
        ids = ids.astype(str)
    emb = table.column("embedding").combine_chunks()
    if not pa.types.is_fixed_size_list(emb.type) or emb.type.list_size != eset.hidden:
        raise BadInputError(
            f"{store.url(rel)}: embedding is {emb.type}, expected {eset.hidden} floats"
        )
    vectors = emb.flatten().to_numpy(zero_copy_only=False).reshape(-1, eset.hidden)
    if len(ids) != entry["rows"]:
        raise BadInputError(
            f"{store.url(rel)} has {len(ids)} rows, its manifest says {entry['rows']}"
        )
    return ids, np.ascontiguousarray(vectors, dtype=np.float32)


def iter_parts(
    store: ArtifactStore, eset: EmbeddingSet, skip: set[str] | frozenset[str] = frozenset()
) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """``(name, ids, vectors)`` of every part but those in ``skip``, in shard order."""
    for name in eset.parts:
        if name not in skip:
            ids, vectors = read_part(store, eset, name)
            yield name, ids, vectors
