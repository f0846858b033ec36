"""Corpus shards and embedding shards: names, reading and validation (torch-free)."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pyarrow as pa

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.parquet import read_parquet
from embedfresh.core.storage import ArtifactStore, sha256_bytes

PART = re.compile(r"part-(\d{5})\.parquet")
MANIFEST = "_MANIFEST.json"
CALIBRATION = "_CALIBRATION.json"
"""An int8 embedding set's calibration texts, copied beside its parts: its query encoder
rebuilds the same int8 model after the corpus shard they came from changed."""
OUTPUT_FORMAT = 2
"""Version of the embedding part's layout (2: ids keep the corpus's type, int64 or string)."""


def commit_name(index: int) -> str:
    """The per-shard commit marker next to ``part-NNNNN.parquet``."""
    return f"part-{index:05d}.COMMIT"


def list_parts(store: ArtifactStore, directory: str) -> dict[int, str]:
    """Shard index -> file name of the ``part-NNNNN.parquet`` objects under ``directory``."""
    out = {}
    for name in store.listdir(directory):
        match = PART.fullmatch(name)
        if match:
            out[int(match.group(1))] = name
    return dict(sorted(out.items()))


def corpus_shards(store: ArtifactStore, corpus: str) -> dict[int, str]:
    """Shard index -> file name of a corpus's parts.

    :raises BadInputError: the corpus has none, naming the corpora the store holds.
    """
    directory = layout.corpus(corpus)
    parts = list_parts(store, directory)
    if not parts:
        known = [c for c in store.listdir("corpora") if list_parts(store, layout.corpus(c))]
        raise BadInputError(
            f"corpus {corpus!r} has no part-NNNNN.parquet under {store.url(directory)} "
            f"(corpora there: {', '.join(known[:20]) or 'none'})"
        )
    return parts


def version_digest(version_marker: dict[str, Any]) -> str:
    """sha256 of a model version's file checksums (its commit marker's): what changes
    whenever its weights, config or tokenizer do."""
    files = {name: entry.get("sha256") for name, entry in version_marker.get("files", {}).items()}
    return sha256_bytes(json.dumps(files, sort_keys=True).encode())


def reuse_key(
    *,
    store: ArtifactStore,
    source_rel: str,
    version_marker: dict[str, Any],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """Everything an embedding shard's vectors depend on, as recorded in its marker.

    A committed shard is reused only when its recorded key equals this one: the model
    version (a hash of every file's sha256 in its ``COMMIT``: weights, spec, tokenizer),
    the corpus shard's content (its ETag on S3, its sha256 on disk, and its size), every
    setting that changes the vectors (``settings``: truncation length, pooling, Dense
    modules, prompt, quantisation, backend numerics) and :data:`OUTPUT_FORMAT`.
    """
    return {
        "format": OUTPUT_FORMAT,
        "version_sha256": version_digest(version_marker),
        "source_etag": store.etag(source_rel),
        "source_size": store.size(source_rel),
        **settings,
    }


#: The keys of :func:`reuse_key` that say where a shard's vectors come from (the rest
#: are settings): what the verifier checks against the store as it is now.
SOURCE_KEYS = ("format", "version_sha256", "source_etag", "source_size")


def stale_reason(marker: dict[str, Any] | None, key: dict[str, Any]) -> str | None:
    """Why a committed shard (its marker) cannot be reused under ``key``; None: reuse it."""
    if marker is None:
        return "not committed"
    recorded = marker.get("reuse_key")
    if not isinstance(recorded, dict):
        return "committed without a reuse key (older output format)"
    changed = [k for k in sorted(set(key) | set(recorded)) if recorded.get(k) != key.get(k)]
    if not changed:
        return None
    named = {
        "source_etag": "the corpus shard changed",
        "source_size": "the corpus shard changed",
        "version_sha256": "the model version's files changed",
    }
    parts = []
    for k in changed:
        text = named.get(k) or f"{k} {recorded.get(k)!r} -> {key.get(k)!r}"
        if text not in parts:
            parts.append(text)
    return ", ".join(parts)


def read_corpus_shard(store: ArtifactStore, rel: str) -> tuple[np.ndarray, list[str]]:
    """Ids and texts of one corpus shard, validated. Ids keep their type: int64 (any
    integer column) or string (SKUs, ASINs, UUIDs; a numpy array of ``str``).

    :raises BadInputError: naming the shard: unreadable, wrong schema (missing columns,
        binary instead of string text, ids neither integer nor string), empty, null ids
        or texts, text bytes that are not UTF-8, empty string ids, duplicate ids.
    """
    url = store.url(rel)
    table = read_parquet(store, rel)
    problems = []
    missing = [c for c in ("id", "text") if c not in table.column_names]
    if missing:
        problems.append(f"missing columns {missing} (has {table.column_names})")
    ids_col = text_col = None
    if "id" in table.column_names:
        ids_col = table.column("id")
        if not (pa.types.is_integer(ids_col.type) or _is_string(ids_col.type)):
            problems.append(f"id is {ids_col.type}, expected int64 or string")
            ids_col = None
    if "text" in table.column_names:
        text_col = table.column("text")
        if pa.types.is_binary(text_col.type) or pa.types.is_large_binary(text_col.type):
            problems.append(
                f"text is {text_col.type}, expected string (UTF-8): write texts as a string column"
            )
            text_col = None
        elif not (pa.types.is_string(text_col.type) or pa.types.is_large_string(text_col.type)):
            problems.append(f"text is {text_col.type}, expected string")
            text_col = None
    if problems:
        raise BadInputError(f"wrong corpus schema in {url}: {'; '.join(problems)}")
    if table.num_rows == 0:
        raise BadInputError(f"empty corpus shard {url}: no rows")
    for name, col in (("id", ids_col), ("text", text_col)):
        if col.null_count:
            first = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise BadInputError(
                f"corpus shard {url} has {col.null_count} null {name}s (first at row {first})"
            )
    try:
        text_col.validate(full=True)
    except pa.ArrowInvalid as e:
        # Parquet does not check that a string column holds UTF-8; Python would fail
        # later with a bare UnicodeDecodeError.
        raise BadInputError(
            f"corpus shard {url} has text that is not valid UTF-8 ({e}): re-encode the "
            "texts as UTF-8 strings"
        ) from e
    if _is_string(ids_col.type):
        ids = np.asarray(ids_col.to_pylist(), dtype=str)
        if (np.char.str_len(ids) == 0).any():
            first = int(np.flatnonzero(np.char.str_len(ids) == 0)[0])
            raise BadInputError(f"corpus shard {url} has an empty string id (row {first})")
    else:
        try:
            ids = ids_col.cast(pa.int64(), safe=True).to_numpy()
        except pa.ArrowInvalid as e:
            raise BadInputError(f"corpus shard {url}: ids do not fit int64: {e}") from e
    unique, counts = np.unique(ids, return_counts=True)
    if len(unique) != len(ids):
        dups = unique[counts > 1]
        raise BadInputError(
            f"corpus shard {url} has {len(dups)} duplicate ids (e.g. {dups[:5].tolist()})"
        )
    return ids, text_col.to_pylist()


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def id_type(ids: np.ndarray) -> pa.DataType:
    """The Arrow type embedding parts store ``ids`` as: int64, or string."""
    return pa.string() if ids.dtype.kind == "U" else pa.int64()
