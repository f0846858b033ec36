"""Commit markers: a group of objects counts only once its marker exists.

S3 has no rename, so a directory of objects (a checkpoint, a model version, embedding
shards) is published by writing a small JSON marker last. The marker lists each
object's sha256 and size; :func:`verify` re-reads them, which is how a truncated or
corrupted checkpoint is told apart from a good one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from embedfresh.core.storage import ArtifactStore, sha256_bytes

COMMIT = "COMMIT"


@dataclass(frozen=True)
class Verification:
    ok: bool
    reason: str = ""


def write_marker(
    store: ArtifactStore,
    directory: str,
    files: dict[str, bytes] | dict[str, tuple[str, int]],
    meta: dict[str, Any] | None = None,
    name: str = COMMIT,
) -> dict[str, Any]:
    """Write ``directory/name`` listing ``files`` (name -> bytes, or (sha256, size)).

    Call it only after every listed object is written.
    """
    listing = {}
    for fname, value in sorted(files.items()):
        if isinstance(value, bytes):
            listing[fname] = {"sha256": sha256_bytes(value), "size": len(value)}
        else:
            listing[fname] = {"sha256": value[0], "size": value[1]}
    marker = {"files": listing, **(meta or {})}
    store.write_json(f"{directory}/{name}", marker)
    return marker


def publish(
    store: ArtifactStore,
    directory: str,
    files: dict[str, bytes],
    meta: dict[str, Any] | None = None,
    name: str = COMMIT,
) -> dict[str, Any]:
    """Write every object of ``files`` under ``directory``, then the marker naming them.

    Files of an earlier attempt that died before its marker are simply overwritten:
    without a marker they never counted.
    """
    for fname, data in files.items():
        store.write_bytes(f"{directory}/{fname}", data)
    return write_marker(store, directory, files, meta=meta, name=name)


def read_marker(store: ArtifactStore, directory: str, name: str = COMMIT) -> dict[str, Any] | None:
    """The marker's content, or None when the directory is not committed (or unreadable)."""
    rel = f"{directory}/{name}"
    if not store.exists(rel):
        return None
    try:
        marker = json.loads(store.read_bytes(rel))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(marker, dict) or not isinstance(marker.get("files"), dict):
        return None
    return marker


def verify(store: ArtifactStore, directory: str, name: str = COMMIT) -> Verification:
    """Check that the marker exists and every object it lists has its size and sha256."""
    marker = read_marker(store, directory, name)
    if marker is None:
        return Verification(False, f"no valid {name} marker")
    for fname, expected in marker["files"].items():
        rel = f"{directory}/{fname}"
        if not store.exists(rel):
            return Verification(False, f"{fname} is missing")
        data = store.read_bytes(rel)
        if len(data) != expected.get("size"):
            return Verification(
                False, f"{fname} has {len(data)} bytes, marker says {expected.get('size')}"
            )
        if sha256_bytes(data) != expected.get("sha256"):
            return Verification(False, f"{fname} checksum does not match its marker")
    return Verification(True)
