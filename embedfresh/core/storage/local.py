"""``file://`` roots (and plain paths): a directory on this machine's disk.

Objects are written through a temporary file and an atomic rename; compare-and-swap
holds an exclusive ``flock`` on a lock file next to the object around the check and
the rename, which serialises writers on one host (and on NFS with working locks).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from urllib.parse import ParseResult

import fsspec

from embedfresh.core.exit_codes import ConflictError
from embedfresh.core.storage.base import Scheme, sha256_bytes


class LocalScheme(Scheme):
    """A directory on the local disk."""

    local_disk = True

    def base(self, root: str, parsed: ParseResult) -> str:
        """The absolute directory: ``file:///abs/dir``, or a plain path (``~`` expanded)."""
        local = parsed.path if parsed.scheme == "file" else root
        return os.path.abspath(os.path.expanduser(local))

    def filesystem(self) -> fsspec.AbstractFileSystem:
        return fsspec.filesystem("file", auto_mkdir=True)

    def write(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        _atomic_local_write(path, data)

    def put_file(self, fs: fsspec.AbstractFileSystem, local_path: str, path: str) -> None:
        with open(local_path, "rb") as f:
            _atomic_local_write(path, f.read())

    def etag(self, fs: fsspec.AbstractFileSystem, path: str) -> str | None:
        try:
            with open(path, "rb") as f:
                return sha256_bytes(f.read())
        except FileNotFoundError:
            return None

    def write_if_match(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        data: bytes,
        expected_etag: str | None,
        url: str,
    ) -> None:
        """An exclusive lock serialises writers around the check and the atomic rename."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock_path = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock")
        with open(lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = self.etag(fs, path)
                if current != expected_etag:
                    raise ConflictError(
                        f"{url} changed under us (expected version "
                        f"{expected_etag}, found {current}): a concurrent run won"
                    )
                _atomic_local_write(path, data)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _atomic_local_write(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
