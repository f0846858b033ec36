"""``file://`` roots (and plain paths): a directory on this machine's disk.

Objects are written to a temporary file in the root's staging folder (``.staging/``,
never inside a published directory), fsynced, given the mode the umask asks for, and
renamed into place atomically. A writer killed before its rename leaves its file in
``.staging/``; the next store on the same root sweeps those whose writer is gone.
Compare-and-swap holds an exclusive ``flock`` on a lock file of the object (under
``.staging/locks/``, named by a hash of the object's path) around the check and the
rename, which serialises writers on one host (and on NFS with working locks).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from typing import BinaryIO
from urllib.parse import ParseResult

import fsspec

from embedfresh.core.exit_codes import BadInputError, ConflictError
from embedfresh.core.storage.base import Scheme, sha256_bytes

log = logging.getLogger(__name__)

#: The root's folder for files being written (relative to the root).
STAGING = ".staging"


class LocalScheme(Scheme):
    """A directory on the local disk."""

    local_disk = True

    def base(self, root: str, parsed: ParseResult) -> str:
        """The absolute directory: ``file:///abs/dir``, or a plain path (``~`` expanded).

        :raises BadInputError: a ``file://`` URL names a host (``file://host/dir``, or
            ``file://dir/sub`` meant as a relative path): the host would be dropped.
        """
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise BadInputError(
                f"artifact root {root!r} names the host {parsed.netloc!r}: file:// roots are "
                f"on this machine; write file:///absolute/path (three slashes)"
            )
        local = parsed.path if parsed.scheme == "file" else root
        self.root_dir = os.path.abspath(os.path.expanduser(local))
        return self.root_dir

    def filesystem(self) -> fsspec.AbstractFileSystem:
        self.staging = _Staging(os.path.join(self.root_dir, STAGING))
        return fsspec.filesystem("file", auto_mkdir=True)

    def write(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        self.staging.write(path, lambda f: f.write(data))

    def put_file(self, fs: fsspec.AbstractFileSystem, local_path: str, path: str) -> None:
        def copy(f: BinaryIO) -> None:
            with open(local_path, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)

        self.staging.write(path, copy)

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
        locks = os.path.join(self.staging.directory, "locks")
        os.makedirs(locks, exist_ok=True)
        lock_path = os.path.join(locks, f"{sha256_bytes(path.encode())[:32]}.lock")
        with open(lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = self.etag(fs, path)
                if current != expected_etag:
                    raise ConflictError(
                        f"{url} changed under us (expected version "
                        f"{expected_etag}, found {current}): a concurrent run won"
                    )
                self.staging.write(path, lambda f: f.write(data))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


class _Staging:
    """The root's ``.staging/`` folder: files being written, named after their writer
    (``<name>.<host>.<pid>.<random>.tmp``), so a later store can tell a dead writer's
    leftovers from a live writer's file."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.host = socket.gethostname().replace(".", "_")
        umask = os.umask(0)
        os.umask(umask)
        #: What ``open()`` would give a new file under this umask (mkstemp gives 0600).
        self.mode = 0o666 & ~umask
        self.sweep()

    def write(self, path: str, fill: Callable[[BinaryIO], object]) -> None:
        """Write ``path`` whole: ``fill`` writes the bytes into a staged file that is then
        fsynced and renamed over ``path``; nothing is left behind on an error."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.makedirs(self.directory, exist_ok=True)
            self._write_via(self.directory, path, fill)
        except OSError as e:
            # EXDEV: ``path`` is on another filesystem mounted under the root; EROFS or
            # EACCES on the staging folder alone: the object's own folder decides.
            if e.errno not in (errno.EXDEV, errno.EROFS, errno.EACCES):
                raise
            self._write_via(os.path.dirname(path), path, fill)

    def _write_via(self, directory: str, path: str, fill: Callable[[BinaryIO], object]) -> None:
        prefix = f"{os.path.basename(path)}.{self.host}.{os.getpid()}."
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
                f.flush()
                os.fchmod(f.fileno(), self.mode)
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def sweep(self) -> None:
        """Remove staged files whose writer on this host is gone (a job killed mid-write);
        files of live writers and of other hosts stay."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            parts = name.rsplit(".", 4)  # <name>.<host>.<pid>.<random>.tmp
            if len(parts) != 5 or parts[1] != self.host or not parts[2].isdigit():
                continue
            if pid_alive(int(parts[2])):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, name))
                log.info("removed %s, left by a writer that is gone", name)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (another user's counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
