"""The artifact store: one root URL (``file://`` by default, ``s3://`` in production).

Every job reads and writes artifacts through :class:`ArtifactStore` with paths relative
to the root (``"runs/tiny/r1/reports/train.json"``). Objects are written whole: on a
local disk through a temporary file and an atomic rename, on S3 by a single PUT, so a
reader never sees half an object. Groups of objects (a checkpoint, a model version,
embedding shards) become visible only through a marker written last; see
:mod:`embedfresh.core.markers`.

What differs between kinds of root (the filesystem, whole-object writes, version tags,
compare-and-swap) is the root's :class:`~embedfresh.core.storage.base.Scheme`, found by
URL scheme in :mod:`embedfresh.core.storage.schemes`; the paths, the reads and the
translation of storage errors into the exit-code contract are here, the same for all.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import json
import logging
import posixpath
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import urlparse

import fsspec

from embedfresh.core.exit_codes import BadInputError, ConflictError, TransientError
from embedfresh.core.storage import faults
from embedfresh.core.storage.schemes import scheme_class

log = logging.getLogger(__name__)


def is_transient(exc: BaseException | None) -> bool:
    """True when ``exc``, or an exception it was raised from, is an infrastructure
    fault (network, throttling, 5xx) that a later attempt may not meet."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, TransientError) or _is_transient(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _is_transient(exc: BaseException) -> bool:
    """True for faults of the infrastructure (network, throttling, 5xx) worth retrying."""
    if isinstance(exc, (ConnectionError, TimeoutError)):  # refused, reset, broken pipe
        return True
    name = type(exc).__name__
    if name in {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ClientConnectorError",
        "ServerDisconnectedError",
        "ConnectionError",
        "ServerTimeoutError",
        "ClientOSError",
        "ClientPayloadError",
        "ResponseStreamingError",
        "IncompleteRead",
        "TimeoutError",
        "FSTimeoutError",
    }:
        return True
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = response.get("Error", {}).get("Code", "")
        return status >= 500 or code in {"SlowDown", "Throttling", "RequestTimeout"}
    return False


def _translate_errors(method):
    """Turn storage exceptions into the job error types the exit-code contract knows."""

    @functools.wraps(method)
    def wrapper(self: ArtifactStore, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (BadInputError, ConflictError, TransientError, FileNotFoundError):
            raise
        except PermissionError as e:
            raise BadInputError(
                f"artifact root {self.root} is not writable or readable: {e}"
            ) from e
        except OSError as e:
            if e.errno in (errno.EROFS, errno.EACCES):
                raise BadInputError(f"artifact root {self.root} is read-only: {e}") from e
            if e.errno == errno.ENOTDIR and self._scheme.local_disk:
                # A regular file where the root or one of its directories should be.
                raise BadInputError(
                    f"artifact root {self.root} is not a usable directory: {e}"
                ) from e
            if is_transient(e):
                raise TransientError(f"artifact store {self.root} unreachable: {e}") from e
            raise
        except Exception as e:
            if type(e).__name__ in {"NoCredentialsError", "PartialCredentialsError"}:
                raise BadInputError(f"no AWS credentials for artifact root {self.root}: {e}") from e
            if is_transient(e):
                raise TransientError(f"artifact store {self.root} unreachable: {e}") from e
            raise

    return wrapper


#: Run once, right before the first write a process makes under a root
#: (:func:`before_first_write`): how a job takes its lease after all its checks.
_FIRST_WRITE: dict[str, Callable[[], None]] = {}


def before_first_write(root: str, callback: Callable[[], None] | None) -> None:
    """Run ``callback`` once, right before this process's next write under ``root`` (an
    :attr:`ArtifactStore.root`), whichever store makes it; None cancels it. If it
    raises, the write does not happen."""
    if callback is None:
        _FIRST_WRITE.pop(root, None)
    else:
        _FIRST_WRITE[root] = callback


def writing_elsewhere(root: str) -> None:
    """Run the callback :func:`before_first_write` holds for ``root`` now, if any: the job
    is about to write outside the store (rows into the vector index) and, as before its
    first write into the store, takes its lease first. If it raises, nothing is written."""
    callback = _FIRST_WRITE.pop(root, None)
    if callback is not None:
        callback()


#: Options of stores made without their own, by URL scheme (:func:`default_storage_options`).
_DEFAULT_OPTIONS: contextvars.ContextVar[Mapping[str, Mapping[str, Any]]] = contextvars.ContextVar(
    "embedfresh_default_storage_options", default=MappingProxyType({})
)


@contextlib.contextmanager
def default_storage_options(protocol: str, options: Mapping[str, Any] | None) -> Iterator[None]:
    """Inside the block, every store of ``protocol`` (``"s3"``) made without
    ``storage_options`` of its own gets ``options``; ``None`` changes nothing.

    How a caller that resolved credentials elsewhere (the control plane, from an Airflow
    connection) hands them to the stores that the readers it calls make themselves
    (result records, the registry, input checks), without those knowing where they came
    from. Scoped to the current thread or task (a context variable).
    """
    if options is None:
        yield
        return
    token = _DEFAULT_OPTIONS.set(
        MappingProxyType({**_DEFAULT_OPTIONS.get(), protocol: dict(options)})
    )
    try:
        yield
    finally:
        _DEFAULT_OPTIONS.reset(token)


class ArtifactStore:
    """Reads and writes artifacts under one root URL through fsspec.

    :param root: ``file:///abs/dir``, a plain local path, ``s3://bucket/prefix``, or a
        root of another registered scheme. For S3 the endpoint comes from
        ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` when set (MinIO, moto), otherwise
        from the usual AWS configuration.
    :param storage_options: passed to the scheme's filesystem (S3: s3fs's options);
        ``None``: those :func:`default_storage_options` holds for the scheme, if any.
    :raises BadInputError: the root's scheme is not registered (the message lists those
        that are), or the root is not usable for its scheme (an S3 URL without bucket).
    """

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        parsed = urlparse(root)
        protocol = parsed.scheme or "file"  # a plain path is a local directory
        if storage_options is None and protocol in _DEFAULT_OPTIONS.get():
            storage_options = dict(_DEFAULT_OPTIONS.get()[protocol])
        self._scheme = scheme_class(protocol, root)(storage_options)
        self.protocol = protocol
        self._base = self._scheme.base(root, parsed)
        self.root = f"{protocol}://{self._base}"

    def __repr__(self) -> str:
        return f"ArtifactStore({self.root!r})"

    @functools.cached_property
    def fs(self) -> fsspec.AbstractFileSystem:
        return self._scheme.filesystem()

    # -- paths ---------------------------------------------------------------------

    def path(self, rel: str) -> str:
        """The filesystem path (no scheme) of ``rel`` under the root.

        ``rel`` may also be a full URL under the root (what reports record); a URL
        anywhere else (another root, a store copied from elsewhere) is refused rather
        than glued under this root as a path that can never exist.
        """
        if "://" in rel:
            if rel == self.root or rel.startswith(f"{self.root}/"):
                rel = rel[len(self.root) :]
            else:
                raise BadInputError(
                    f"artifact path {rel!r} is a URL outside the artifact root {self.root}"
                )
        rel = rel.strip("/")
        parts = rel.split("/") if rel else []
        if any(p in ("..", ".") for p in parts):
            raise BadInputError(f"artifact path {rel!r} must not contain '.' or '..'")
        return posixpath.join(self._base, *parts) if parts else self._base

    def url(self, rel: str = "") -> str:
        """The full URL of ``rel``: what a person copies into a shell or a browser."""
        return f"{self.protocol}://{self.path(rel)}"

    # -- reads ---------------------------------------------------------------------

    @_translate_errors
    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))

    @_translate_errors
    def read_bytes(self, rel: str) -> bytes:
        return self.fs.cat_file(self.path(rel))

    def read_json(self, rel: str) -> Any:
        data = self.read_bytes(rel)
        try:
            return json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadInputError(f"{self.url(rel)} is not valid JSON: {e}") from e

    @_translate_errors
    def listdir(self, rel: str) -> list[str]:
        """Names (not paths) directly under ``rel``; empty when it does not exist.
        Hidden names (``.staging``, lock files, Spark's ``.crc`` files) are left out."""
        path = self.path(rel)
        try:
            entries = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        names = sorted({posixpath.basename(e.rstrip("/")) for e in entries})
        return [n for n in names if n and not n.startswith(".") and n != posixpath.basename(path)]

    @_translate_errors
    def last_modified(self, rel: str) -> float | None:
        """When the newest object at or under ``rel`` was written (epoch seconds), or None
        when there is none: how old a folder's content is (garbage collection's grace)."""
        path = self.path(rel)
        try:
            found = self.fs.find(path, detail=True, withdirs=False)
        except FileNotFoundError:
            return None
        newest = None
        for info in found.values():
            stamp = info.get("mtime", info.get("LastModified"))
            if stamp is None:
                continue
            seconds = stamp.timestamp() if hasattr(stamp, "timestamp") else float(stamp)
            newest = seconds if newest is None else max(newest, seconds)
        return newest

    @_translate_errors
    def size(self, rel: str) -> int:
        return int(self.fs.size(self.path(rel)))

    @contextlib.contextmanager
    def open_read(self, rel: str) -> Iterator[Any]:
        """A seekable binary file for streaming reads (Parquet)."""
        with _translate_errors(lambda self: self.fs.open(self.path(rel), "rb"))(self) as f:
            yield f

    @_translate_errors
    def get_file(self, rel: str, local_path: str) -> None:
        self.fs.get_file(self.path(rel), local_path)

    # -- writes --------------------------------------------------------------------

    @_translate_errors
    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write one object whole: readers see the old object or the new, never a part."""
        self._before_write()
        self._scheme.write(self.fs, self.path(rel), data)
        self._wrote("write", rel)

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_bytes(rel, json_bytes(obj))

    @_translate_errors
    def put_file(self, local_path: str, rel: str) -> None:
        self._before_write()
        self._scheme.put_file(self.fs, local_path, self.path(rel))
        self._wrote("put", rel)

    @_translate_errors
    def remove(self, rel: str, recursive: bool = False) -> None:
        path = self.path(rel)
        if self.fs.exists(path):
            self._before_write()
            self.fs.rm(path, recursive=recursive)
            self._wrote("remove", rel)

    # -- compare-and-swap ----------------------------------------------------------

    @_translate_errors
    def etag(self, rel: str) -> str | None:
        """An opaque version tag of the object, or None when it does not exist."""
        return self._scheme.etag(self.fs, self.path(rel))

    @_translate_errors
    def write_if_match(self, rel: str, data: bytes, expected_etag: str | None) -> None:
        """Replace ``rel`` only if it still has ``expected_etag`` (None: must not exist).

        On S3 this is a conditional PUT (``If-Match`` / ``If-None-Match: *``), so the
        check and the write are one atomic step on the server. On a local disk an
        exclusive lock serialises writers around the check and the atomic rename.

        :raises ConflictError: another writer changed the object first.
        """
        self._before_write()
        self._scheme.write_if_match(self.fs, self.path(rel), data, expected_etag, self.url(rel))
        self._wrote("cas", rel)

    def _before_write(self) -> None:
        callback = _FIRST_WRITE.pop(self.root, None)
        if callback is not None:
            callback()

    def _wrote(self, op: str, rel: str) -> None:
        """A fault point of the reliability suite (:mod:`~embedfresh.core.storage.faults`):
        a no-op unless its test-only environment variables are set."""
        faults.after_write(op, self.path(rel)[len(self._base) :])


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
