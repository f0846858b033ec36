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
    check = _Verification(ArtifactStore(cfg.artifact_root), cfg)
    check.every_shard()
    check.refuse_on_problems()
    check.parts_unchanged()
    return {**check.publish(), "seconds": round(time.perf_counter() - started, 3)}


class _Verification:
    """One verification: the shards' checks add up here (problems, parts, throughput);
    the manifest is written only from a verification without a problem."""

    def __init__(self, store: ArtifactStore, cfg: EmbedConfig) -> None:
        self.store, self.cfg = store, cfg
        self.corpus_dir = layout.corpus(cfg.corpus)
        self.out_dir = layout.embeddings(cfg.model, cfg.version, cfg.corpus)
        self.corpus = corpus_shards(store, cfg.corpus)
        outputs = list_parts(store, self.out_dir)
        self.problems = [
            f"{name}: no such corpus shard (stale output)"
            for index, name in outputs.items()
            if index not in self.corpus
        ]
        self.version_marker = markers.read_marker(
            store, layout.model_version(cfg.model, cfg.version)
        )
        if self.version_marker is None:
            raise BadInputError(
                f"model version {store.url(layout.model_version(cfg.model, cfg.version))} "
                "is not committed"
            )
        self.parts: dict[str, dict[str, Any]] = {}
        self.files: dict[str, tuple[str, int]] = {}
        self.hidden_sizes: set[int] = set()
        self.settings_seen: dict[str, list[str]] = {}
        self.rows, self.embed_seconds = 0, 0.0
        self.real_tokens = self.padded_tokens = self.truncated = 0

    def every_shard(self) -> None:
        """Each shard's part against its corpus shard, then ids across shards (kept on
        disk, hash-partitioned: memory bounded whatever the corpus's size)."""
        shard_ids = CrossShardIds()
        try:
            for index, corpus_name in self.corpus.items():
                corpus_ids = self._shard(index, corpus_name)
                if corpus_ids is not None:
                    shard_ids.add(index, corpus_ids)
            if shard_ids.mixed:
                named = ", ".join(
                    f"{layout.part_name(i)} {t}" for t, i in shard_ids.first_shard.items()
                )
                self.problems.append(
                    f"corpus shards mix int64 and string ids (first of each: {named})"
                )
            elif (dups := shard_ids.duplicates()).count:
                where = [layout.part_name(i) for i in dups.shards]
                self.problems.append(
                    f"{dups.count} ids appear in more than one corpus shard ({', '.join(where)}; "
                    f"e.g. {dups.examples})"
                )
        finally:
            shard_ids.close()
        if len(self.hidden_sizes) > 1:
            self.problems.append(f"parts disagree on the vector width: {sorted(self.hidden_sizes)}")
        if len(self.settings_seen) > 1:
            # One manifest, one way of embedding: mixed truncation, quantisation or backends
            # would publish vectors that do not compare.
            groups = "; ".join(f"{', '.join(n[:3])}: {k}" for k, n in self.settings_seen.items())
            self.problems.append(
                f"parts were embedded with different settings ({groups}): re-run the embed job "
                "with one setting for every shard"
            )

    def _shard(self, index: int, corpus_name: str) -> np.ndarray | None:
        """Check one shard's part; its corpus ids, or None when it is not committed as
        this version's, from the corpus shard as it is now (its problem recorded)."""
        store, out_dir, name = self.store, self.out_dir, layout.part_name(index)
        check = markers.verify(store, out_dir, commit_name(index))
        if not check.ok:
            self.problems.append(f"{name}: not committed ({check.reason})")
            return None
        marker = markers.read_marker(store, out_dir, commit_name(index)) or {}
        if marker.get("version") != self.cfg.version or name not in marker["files"]:
            self.problems.append(f"{name}: its commit marker is for another version or file")
            return None
        recorded = marker.get("reuse_key")
        if not isinstance(recorded, dict):
            self.problems.append(
                f"{name}: embedded before reuse keys (older output format): re-run the embed "
                "job, which recomputes it"
            )
            return None
        source_rel = f"{self.corpus_dir}/{corpus_name}"
        current = reuse_key(store=store, source_rel=source_rel,
                            version_marker=self.version_marker, settings={})  # fmt: skip
        stale = [k for k in SOURCE_KEYS if recorded.get(k) != current.get(k)]
        if stale:
            self.problems.append(
                f"{name}: stale ({', '.join(stale)} changed since it was embedded): re-run "
                "the embed job, which recomputes it"
            )
            return None
        shard_settings = {k: v for k, v in recorded.items() if k not in SOURCE_KEYS}
        self.settings_seen.setdefault(json.dumps(shard_settings, sort_keys=True), []).append(name)
        corpus_ids, _ = read_corpus_shard(store, source_rel)
        part_problems, hidden = _check_part(
            store, f"{out_dir}/{name}", corpus_ids, self.cfg.version
        )
        self.problems.extend(f"{name}: {p}" for p in part_problems)
        if hidden is not None:
            self.hidden_sizes.add(hidden)
        entry = marker["files"][name]
        self.files[name] = (entry["sha256"], entry["size"])
        self.parts[name] = {
            "rows": len(corpus_ids),
            "sha256": entry["sha256"],
            "size": entry["size"],
        }
        self.rows += len(corpus_ids)
        self.embed_seconds += float(marker.get("embed_seconds", 0.0))
        self.real_tokens += int(marker.get("real_tokens", 0))
        self.padded_tokens += int(marker.get("padded_tokens", 0))
        self.truncated += int(marker.get("truncated", 0))
        return corpus_ids

    def refuse_on_problems(self) -> None:
        if self.problems:
            shown = "; ".join(self.problems[:20])
            more = f" (and {len(self.problems) - 20} more)" if len(self.problems) > 20 else ""
            raise BadInputError(
                f"embeddings {self.store.url(self.out_dir)} of corpus {self.cfg.corpus!r} do not "
                f"verify: {shown}{more}"
            )

    def parts_unchanged(self) -> None:
        """Defensive: the part bytes must still match what the markers recorded."""
        for name, (sha, size) in self.files.items():
            data = self.store.read_bytes(f"{self.out_dir}/{name}")
            if len(data) != size or sha256_bytes(data) != sha:
                raise BadInputError(
                    f"{self.store.url(f'{self.out_dir}/{name}')} changed after its commit"
                )

    def publish(self) -> dict[str, Any]:
        """``_MANIFEST.json``, unless it already lists these parts: a release names the
        manifest by its sha256, so verifying the same parts again must not rewrite it
        (only its clock would change)."""
        store, cfg, rows = self.store, self.cfg, self.rows
        meta = {
            "kind": "embeddings",
            "model": cfg.model,
            "version": cfg.version,
            "corpus": cfg.corpus,
            "corpus_url": store.url(self.corpus_dir),
            "hidden": self.hidden_sizes.pop(),
            # How every part was embedded (truncation length, pooling, prompt, quantisation, ...).
            "settings": json.loads(next(iter(self.settings_seen))) if self.settings_seen else {},
            "rows": rows,
            "parts": self.parts,
            "throughput": {
                "rows": rows,
                "embed_seconds": round(self.embed_seconds, 6),
                "sentences_per_s": round(rows / self.embed_seconds, 3)
                if self.embed_seconds
                else None,
                "truncated": self.truncated,
                "padding_efficiency": (
                    round(self.real_tokens / self.padded_tokens, 6) if self.padded_tokens else None
                ),
            },
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        existing = markers.read_marker(store, self.out_dir, MANIFEST)
        if existing is not None and _same_set(existing, self.files, meta):
            log.info("verified %d rows in %d parts; %s already lists them: kept",
                     rows, len(self.parts), MANIFEST)  # fmt: skip
        else:
            markers.write_marker(store, self.out_dir, self.files, meta=meta, name=MANIFEST)
            log.info("verified %d rows in %d parts; wrote %s", rows, len(self.parts), MANIFEST)
        return {
            "status": "ok",
            "rows": rows,
            "parts": len(self.parts),
            "manifest": store.url(f"{self.out_dir}/{MANIFEST}"),
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
