"""Verify a corpus's embeddings and publish them: ``python -m embedfresh.jobs.embed_verify``.

Checks that every corpus shard has a committed output shard (its ``part-NNNNN.COMMIT``
verifies) made from the corpus shard as it is now and from this version's weights (its
reuse key), that ids (int64 or string, the corpus's type) match the corpus exactly shard by shard (same ids, same order, no
gaps, no duplicates, none across shards), that no output part lacks a corpus shard,
that every vector is finite with unit norm and names the version. The check for ids
repeated across shards keeps the ids on disk (:class:`~embedfresh.core.shard_ids.CrossShardIds`),
so memory does not grow with the corpus. Only then writes
``_MANIFEST.json`` (last), a :mod:`embedfresh.core.markers` marker listing every part's sha256 and
size plus rows per part, model version, corpus and throughput. Anything off is a
:class:`BadInputError` (exit 2) listing the problems. Torch-free.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from typing import Any

import numpy as np
import pyarrow as pa

from embedfresh.core import layout, markers
from embedfresh.core.cli import main_for
from embedfresh.core.config import EmbedConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.parquet import read_parquet
from embedfresh.core.shard_ids import CrossShardIds
from embedfresh.core.shards import (
    MANIFEST,
    SOURCE_KEYS,
    commit_name,
    corpus_shards,
    id_type,
    list_parts,
    read_corpus_shard,
    reuse_key,
)
from embedfresh.core.storage import ArtifactStore, sha256_bytes

log = logging.getLogger("embedfresh.jobs.embed_verify")

NORM_TOLERANCE = 1e-3


def _check_part(
    store: ArtifactStore, rel: str, corpus_ids: np.ndarray, version: str
) -> tuple[list[str], int | None]:
    """Problems of one output part against its corpus shard, and its vector width."""
    table = read_parquet(store, rel)
    problems = []
    expected = {"id": id_type(corpus_ids), "model_version": pa.string()}
    for col, typ in expected.items():
        if col not in table.column_names or table.column(col).type != typ:
            problems.append(f"column {col} missing or not {typ}")
    emb_type = table.schema.field("embedding").type if "embedding" in table.column_names else None
    if not (
        emb_type is not None
        and pa.types.is_fixed_size_list(emb_type)
        and emb_type.value_type == pa.float32()
    ):
        problems.append(f"embedding is {emb_type}, expected fixed_size_list<float32>")
    if problems:
        return problems, None
    hidden = emb_type.list_size
    ids = table.column("id").to_numpy(zero_copy_only=False)
    if ids.dtype == object:
        ids = ids.astype(str)
    if len(ids) != len(corpus_ids):
        problems.append(f"{len(ids)} rows, corpus shard has {len(corpus_ids)}")
    elif not np.array_equal(ids, corpus_ids):
        missing = np.setdiff1d(corpus_ids, ids)
        extra = np.setdiff1d(ids, corpus_ids)
        problems.append(
            f"ids differ from the corpus shard ({len(missing)} missing, e.g. "
            f"{missing[:3].tolist()}; {len(extra)} unexpected, e.g. {extra[:3].tolist()}; "
            "or out of order)"
        )
    emb = table.column("embedding").combine_chunks()
    if emb.null_count:
        problems.append(f"{emb.null_count} null embeddings")
        return problems, hidden
    vectors = emb.flatten().to_numpy(zero_copy_only=False).reshape(-1, hidden)
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        problems.append(f"{int((~finite).sum())} vectors with NaN/inf")
    norms = np.linalg.norm(vectors[finite].astype(np.float64), axis=1)
    off = np.abs(norms - 1.0) >= NORM_TOLERANCE
    if off.any():
        problems.append(
            f"{int(off.sum())} vectors without unit norm (e.g. {float(norms[off][0]):.6f})"
        )
    versions = set(table.column("model_version").unique().to_pylist())
    if versions != {version}:
        problems.append(f"model_version is {sorted(map(str, versions))}, expected {version!r}")
    return problems, hidden


def verify(cfg: EmbedConfig) -> dict[str, Any]:
    """Check every corpus shard's embeddings, then write ``_MANIFEST.json`` last."""
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    corpus_dir = layout.corpus(cfg.corpus)
    out_dir = layout.embeddings(cfg.model, cfg.version, cfg.corpus)
    corpus = corpus_shards(store, cfg.corpus)
    outputs = list_parts(store, out_dir)
    problems: list[str] = []
    for index in outputs:
        if index not in corpus:
            problems.append(f"{outputs[index]}: no such corpus shard (stale output)")
    parts: dict[str, dict[str, Any]] = {}
    files: dict[str, tuple[str, int]] = {}
    hidden_sizes = set()
    settings_seen: dict[str, list[str]] = {}
    version_marker = markers.read_marker(store, layout.model_version(cfg.model, cfg.version))
    if version_marker is None:
        raise BadInputError(
            f"model version {store.url(layout.model_version(cfg.model, cfg.version))} "
            "is not committed"
        )
    rows = 0
    embed_seconds = 0.0
    real_tokens = padded_tokens = truncated = 0
    shard_ids = CrossShardIds()
    try:
        for index, corpus_name in corpus.items():
            name = layout.part_name(index)
            check = markers.verify(store, out_dir, commit_name(index))
            if not check.ok:
                problems.append(f"{name}: not committed ({check.reason})")
                continue
            marker = markers.read_marker(store, out_dir, commit_name(index)) or {}
            if marker.get("version") != cfg.version or name not in marker["files"]:
                problems.append(f"{name}: its commit marker is for another version or file")
                continue
            recorded = marker.get("reuse_key")
            if not isinstance(recorded, dict):
                problems.append(
                    f"{name}: embedded before reuse keys (older output format): re-run the embed "
                    "job, which recomputes it"
                )
                continue
            current = reuse_key(
                store=store,
                source_rel=f"{corpus_dir}/{corpus_name}",
                version_marker=version_marker,
                settings={},
            )
            stale = [k for k in SOURCE_KEYS if recorded.get(k) != current.get(k)]
            if stale:
                problems.append(
                    f"{name}: stale ({', '.join(stale)} changed since it was embedded): re-run "
                    "the embed job, which recomputes it"
                )
                continue
            shard_settings = {k: v for k, v in recorded.items() if k not in SOURCE_KEYS}
            settings_seen.setdefault(json.dumps(shard_settings, sort_keys=True), []).append(name)
            corpus_ids, _ = read_corpus_shard(store, f"{corpus_dir}/{corpus_name}")
            shard_ids.add(index, corpus_ids)
            part_problems, hidden = _check_part(store, f"{out_dir}/{name}", corpus_ids, cfg.version)
            problems.extend(f"{name}: {p}" for p in part_problems)
            if hidden is not None:
                hidden_sizes.add(hidden)
            entry = marker["files"][name]
            files[name] = (entry["sha256"], entry["size"])
            parts[name] = {
                "rows": len(corpus_ids),
                "sha256": entry["sha256"],
                "size": entry["size"],
            }
            rows += len(corpus_ids)
            embed_seconds += float(marker.get("embed_seconds", 0.0))
            real_tokens += int(marker.get("real_tokens", 0))
            padded_tokens += int(marker.get("padded_tokens", 0))
            truncated += int(marker.get("truncated", 0))
        if shard_ids.mixed:
            named = ", ".join(
                f"{layout.part_name(i)} {t}" for t, i in shard_ids.first_shard.items()
            )
            problems.append(f"corpus shards mix int64 and string ids (first of each: {named})")
        else:
            # On disk, hash-partitioned: memory bounded whatever the corpus's size.
            dups = shard_ids.duplicates()
            if dups.count:
                where = [layout.part_name(i) for i in dups.shards]
                problems.append(
                    f"{dups.count} ids appear in more than one corpus shard ({', '.join(where)}; "
                    f"e.g. {dups.examples})"
                )
    finally:
        shard_ids.close()
    if len(hidden_sizes) > 1:
        problems.append(f"parts disagree on the vector width: {sorted(hidden_sizes)}")
    if len(settings_seen) > 1:
        # One manifest, one way of embedding: mixed truncation, quantisation or backends
        # would publish vectors that do not compare.
        groups = "; ".join(f"{', '.join(n[:3])}: {k}" for k, n in settings_seen.items())
        problems.append(
            f"parts were embedded with different settings ({groups}): re-run the embed job "
            "with one setting for every shard"
        )
    if problems:
        shown = "; ".join(problems[:20])
        more = f" (and {len(problems) - 20} more)" if len(problems) > 20 else ""
        raise BadInputError(
            f"embeddings {store.url(out_dir)} of corpus {cfg.corpus!r} do not verify: {shown}{more}"
        )
    # Defensive: the part bytes must still match what the markers recorded.
    for name, (sha, size) in files.items():
        data = store.read_bytes(f"{out_dir}/{name}")
        if len(data) != size or sha256_bytes(data) != sha:
            raise BadInputError(f"{store.url(f'{out_dir}/{name}')} changed after its commit")
    manifest_meta = {
        "kind": "embeddings",
        "model": cfg.model,
        "version": cfg.version,
        "corpus": cfg.corpus,
        "corpus_url": store.url(corpus_dir),
        "hidden": hidden_sizes.pop(),
        # How every part was embedded (truncation length, pooling, prompt, quantisation, ...).
        "settings": json.loads(next(iter(settings_seen))) if settings_seen else {},
        "rows": rows,
        "parts": parts,
        "throughput": {
            "rows": rows,
            "embed_seconds": round(embed_seconds, 6),
            "sentences_per_s": round(rows / embed_seconds, 3) if embed_seconds else None,
            "truncated": truncated,
            "padding_efficiency": (
                round(real_tokens / padded_tokens, 6) if padded_tokens else None
            ),
        },
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    existing = markers.read_marker(store, out_dir, MANIFEST)
    if existing is not None and _same_set(existing, files, manifest_meta):
        # A release names this manifest by its sha256: verifying the same parts again
        # must not rewrite it (only its clock would change).
        log.info(
            "verified %d rows in %d parts; %s already lists them: kept", rows, len(parts), MANIFEST
        )
    else:
        markers.write_marker(store, out_dir, files, meta=manifest_meta, name=MANIFEST)
        log.info("verified %d rows in %d parts; wrote %s", rows, len(parts), MANIFEST)
    return {
        "status": "ok",
        "rows": rows,
        "parts": len(parts),
        "manifest": store.url(f"{out_dir}/{MANIFEST}"),
        "seconds": round(time.perf_counter() - started, 3),
    }


def _same_set(
    existing: dict[str, Any], files: dict[str, tuple[str, int]], meta: dict[str, Any]
) -> bool:
    """``existing`` (a manifest read back) lists the same parts, rows and settings."""
    listed = {
        name: (entry.get("sha256"), entry.get("size")) for name, entry in existing["files"].items()
    }
    same_files = listed == {name: (sha, size) for name, (sha, size) in files.items()}
    keys = ("model", "version", "corpus", "hidden", "settings", "rows", "parts")
    return same_files and all(existing.get(k) == meta.get(k) for k in keys)


if __name__ == "__main__":
    main_for("embed_verify", EmbedConfig, verify)
