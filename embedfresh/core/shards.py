"""Corpus shards and embedding shards: names, reading and validation (torch-free)."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.parquet import read_parquet
from embedfresh.core.storage import ArtifactStore

PART = re.compile(r"^part-(\d{5})\.parquet$")
MANIFEST = "_MANIFEST.json"


def commit_name(index: int) -> str:
    """The per-shard commit marker next to ``part-NNNNN.parquet``."""
    return f"part-{index:05d}.COMMIT"


def list_parts(store: ArtifactStore, directory: str) -> dict[int, str]:
    """Shard index -> file name of the ``part-NNNNN.parquet`` objects under ``directory``."""
    out = {}
    for name in store.listdir(directory):
        match = PART.match(name)
        if match:
            out[int(match.group(1))] = name
    return dict(sorted(out.items()))


def corpus_shards(store: ArtifactStore, corpus: str) -> dict[int, str]:
    directory = layout.corpus(corpus)
    parts = list_parts(store, directory)
    if not parts:
        raise BadInputError(
            f"corpus {corpus!r} has no part-NNNNN.parquet under {store.url(directory)}"
        )
    return parts


def read_corpus_shard(store: ArtifactStore, rel: str) -> tuple[np.ndarray, list[str]]:
    """Ids (int64) and texts of one corpus shard, validated.

    :raises BadInputError: naming the shard: unreadable, wrong schema (missing columns,
        binary instead of string text, non-integer ids), empty, null ids or texts,
        text bytes that are not UTF-8, duplicate ids.
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
        if not pa.types.is_integer(ids_col.type):
            problems.append(f"id is {ids_col.type}, expected int64")
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
