"""Commit markers: a group of objects counts only once its marker exists.

S3 has no rename, so a directory of objects (a checkpoint, a model version, embedding
shards) is published by writing a small JSON marker last. The marker lists each
object's sha256 and size; :func:`verify` re-reads them, streamed (:func:`check_object`:
chunk by chunk through :meth:`ArtifactStore.open_read`, never a whole object in memory,
the same on a local disk and on S3), which is how a truncated or corrupted checkpoint or
model version is told apart from a good one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from embedfresh.core.storage import ArtifactStore, sha256_bytes

COMMIT = "COMMIT"

# Bytes hashed per read when a listed object is verified: what verification holds in
# memory, beside the filesystem's own read buffer (s3fs reads ahead one block).
CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class Verification:
    ok: bool
    reason: str = ""
    file: str = ""
    """The listed object that failed (its name in the marker), when one did."""
    files: int = 0
    """Objects checked and found intact."""
    bytes: int = 0
    """Bytes read and hashed."""
    marker: dict[str, Any] | None = None
    """The marker's content, as read for the check (None when there was none)."""


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
    written: dict[str, tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """Write every object of ``files`` under ``directory``, then the marker naming them.

    ``written``: objects of the directory already written otherwise (name -> (sha256,
    size): a file uploaded from disk, another rank's shards), listed in the marker too.
    Files of an earlier attempt that died before its marker are simply overwritten:
    without a marker they never counted.
    """
    for fname, data in files.items():
        store.write_bytes(f"{directory}/{fname}", data)
    return write_marker(store, directory, {**(written or {}), **files}, meta=meta, name=name)


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


def check_object(
    store: ArtifactStore,
    directory: str,
    name: str,
    expected: Any,
    marker_name: str = COMMIT,
    chunk_bytes: int | None = None,
) -> str | None:
    """What is wrong with object ``directory/name`` against its marker entry
    ``expected`` (``{"sha256": ..., "size": ...}``), or None when it matches.

    Streamed: the size is compared first (no read at all for a truncated or grown
    object), then the object is hashed ``chunk_bytes`` at a time through
    :meth:`ArtifactStore.open_read`, so memory stays bounded whatever its size and the
    same code reads a local file or an S3 object.
    """
    rel = f"{directory}/{name}"
    if (
        not isinstance(expected, dict)
        or not isinstance(expected.get("sha256"), str)
        or not isinstance(expected.get("size"), int)
    ):
        return f"{name}: its entry in the {marker_name} marker is malformed ({expected!r})"
    size, sha256 = expected["size"], expected["sha256"]
    try:
        actual = store.size(rel)
        if actual != size:
            return _size_mismatch(name, actual, size, marker_name)
        digest = hashlib.sha256()
        read = 0
        with store.open_read(rel) as f:
            while chunk := f.read(chunk_bytes or CHUNK_BYTES):
                digest.update(chunk)
                read += len(chunk)
    except FileNotFoundError:
        return f"{name} is missing"
    if read != size:  # replaced while it was read
        return _size_mismatch(name, read, size, marker_name)
    if digest.hexdigest() != sha256:
        return (
            f"{name} checksum does not match its {marker_name} marker: sha256 "
            f"{digest.hexdigest()[:16]}..., marker says {sha256[:16]}... (same size, "
            f"{size} bytes: the content changed)"
        )
    return None


def _size_mismatch(name: str, actual: int, expected: int, marker_name: str) -> str:
    what = "truncated" if actual < expected else "longer than listed"
    return f"{name} has {actual} bytes, {marker_name} marker says {expected} ({what})"


def verify(
    store: ArtifactStore,
    directory: str,
    name: str = COMMIT,
    chunk_bytes: int | None = None,
    marker: dict[str, Any] | None = None,
) -> Verification:
    """Check that the marker exists and every object it lists has its size and sha256.

    Every object is streamed (:func:`check_object`); the first one that does not match
    ends the check, named in :attr:`Verification.file` and :attr:`Verification.reason`.
    ``marker`` is the marker's content when the caller has just read it
    (:func:`read_marker`): it is not read again. The marker checked is
    :attr:`Verification.marker`, so a caller needs no second read of it either.
    """
    if marker is None:
        marker = read_marker(store, directory, name)
    if marker is None:
        return Verification(False, f"no valid {name} marker")
    files = total = 0
    for fname, expected in sorted(marker["files"].items()):
        problem = check_object(store, directory, fname, expected, name, chunk_bytes)
        if problem is not None:
            return Verification(False, problem, file=fname, files=files, bytes=total, marker=marker)
        files += 1
        total += expected["size"]
    return Verification(True, files=files, bytes=total, marker=marker)
