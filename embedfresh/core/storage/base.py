"""What the artifact store needs from one kind of root URL: :class:`Scheme`.

:class:`~embedfresh.core.storage.store.ArtifactStore` does the paths, the reads and the
error translation the same way for every root; a scheme says where a root points, which
fsspec filesystem reaches it, how an object is written whole, and how one is replaced
only if nobody changed it first (the registry's compare-and-swap). Schemes are found by
URL scheme through :mod:`embedfresh.core.storage.schemes`.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import ParseResult

import fsspec


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Scheme(abc.ABC):
    """How an :class:`~embedfresh.core.storage.store.ArtifactStore` reaches one kind of root.

    One instance per store. ``path`` arguments are filesystem paths without the scheme
    (``bucket/prefix/runs/...`` or ``/abs/dir/runs/...``), already checked by the store;
    errors the methods raise are translated by the store into the exit-code contract.

    A new scheme subclasses this (at least :meth:`filesystem` and :meth:`write_if_match`)
    and is registered under its URL scheme: one line in
    :data:`embedfresh.core.storage.schemes.BUILT_IN_SCHEMES`, or
    :func:`~embedfresh.core.storage.schemes.register_scheme` at run time.
    """

    #: Objects are files on this machine's disk: an ``ENOTDIR`` then means a regular file
    #: where the root or one of its directories should be (a bad root, exit code 2).
    local_disk: ClassVar[bool] = False

    def __init__(self, storage_options: Mapping[str, Any] | None = None) -> None:
        #: What the store was given for the filesystem (credentials, endpoint, ...).
        self.storage_options = dict(storage_options or {})

    def base(self, root: str, parsed: ParseResult) -> str:
        """The root's filesystem path: no scheme, no trailing ``/``. Default: the URL's
        host and path (``bucket/prefix``).

        :raises BadInputError: ``root`` cannot be a root of this scheme.
        """
        return f"{parsed.netloc}{parsed.path}".rstrip("/")

    @abc.abstractmethod
    def filesystem(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem the store reads and writes through (built once a store)."""

    def write(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        """Write one object whole: readers see the old object or the new, never a part.
        Default: one ``pipe_file`` (a single PUT on object stores)."""
        fs.pipe_file(path, data)

    def put_file(self, fs: fsspec.AbstractFileSystem, local_path: str, path: str) -> None:
        """Upload the local file ``local_path`` whole to ``path``."""
        fs.put_file(local_path, path)

    def etag(self, fs: fsspec.AbstractFileSystem, path: str) -> str | None:
        """An opaque version tag of the object, None when it does not exist. Default: the
        sha256 of its bytes (right everywhere, a full read each time)."""
        try:
            return sha256_bytes(fs.cat_file(path))
        except FileNotFoundError:
            return None

    @abc.abstractmethod
    def write_if_match(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        data: bytes,
        expected_etag: str | None,
        url: str,
    ) -> None:
        """Replace ``path`` with ``data`` only if its :meth:`etag` is still
        ``expected_etag`` (None: only if it does not exist), check and write as one
        atomic step against every other writer of the root.

        :param url: the object's full URL, for the error message.
        :raises ConflictError: another writer changed the object first; nothing written.
        """
