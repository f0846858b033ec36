"""The artifact store: one root URL (``file://`` by default, ``s3://`` in production).

Every job reads and writes artifacts through :class:`ArtifactStore` with paths relative
to the root (``"runs/tiny/r1/reports/train.json"``). Objects are written whole: on a
local disk through a temporary file and an atomic rename, on S3 by a single PUT, so a
reader never sees half an object. Groups of objects (a checkpoint, a model version,
embedding shards) become visible only through a marker written last; see
:mod:`embedfresh.core.markers`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import posixpath
import tempfile
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import fsspec

from embedfresh.core.exit_codes import BadInputError, ConflictError, TransientError

log = logging.getLogger(__name__)


# Retries of every S3 request, in botocore (through s3fs's ``config_kwargs``): the
# "standard" mode backs off exponentially with full jitter (at most 20 s a wait) and
# retries 5xx, SlowDown/throttling and dropped or refused connections. Eight attempts
# ride out an endpoint that is gone for ~10-30 s; a longer outage ends the job with
# exit 75 and the orchestrator's retry resumes from the last checkpoint. The usual
# botocore variables override both (``AWS_RETRY_MODE``, ``AWS_MAX_ATTEMPTS``).
# s3fs adds its own few retries on SlowDown and on truncated reads on top of these.
S3_RETRY_MODE = "standard"
S3_MAX_ATTEMPTS = 8


def s3_retry_config() -> dict[str, Any]:
    """botocore's ``retries`` setting for the store's S3 client."""
    attempts = os.environ.get("AWS_MAX_ATTEMPTS", "").strip()
    try:
        total = int(attempts) if attempts else S3_MAX_ATTEMPTS
    except ValueError as e:
        raise BadInputError(f"AWS_MAX_ATTEMPTS={attempts!r} is not a whole number") from e
    if total < 1:
        raise BadInputError(f"AWS_MAX_ATTEMPTS={total} must be at least 1")
    return {
        "mode": os.environ.get("AWS_RETRY_MODE", "").strip() or S3_RETRY_MODE,
        "total_max_attempts": total,
    }


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
            if e.errno == errno.ENOTDIR and self.protocol == "file":
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


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ArtifactStore:
    """Reads and writes artifacts under one root URL through fsspec.

    :param root: ``file:///abs/dir``, a plain local path, or ``s3://bucket/prefix``.
        For S3 the endpoint comes from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``
        when set (MinIO, moto), otherwise from the usual AWS configuration.
    """

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        parsed = urlparse(root)
        if parsed.scheme in ("", "file"):
            local = parsed.path if parsed.scheme == "file" else root
            self.protocol = "file"
            self._base = os.path.abspath(os.path.expanduser(local))
            self.root = f"file://{self._base}"
        elif parsed.scheme == "s3":
            if not parsed.netloc:
                raise BadInputError(f"artifact root {root!r} names no bucket")
            self.protocol = "s3"
            self._base = f"{parsed.netloc}{parsed.path}".rstrip("/")
            self.root = f"s3://{self._base}"
        else:
            raise BadInputError(
                f"artifact root {root!r}: unsupported scheme {parsed.scheme!r} "
                "(use file:// or s3://)"
            )
        self._storage_options = dict(storage_options or {})

    def __repr__(self) -> str:
        return f"ArtifactStore({self.root!r})"

    @functools.cached_property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self.protocol == "file":
            return fsspec.filesystem("file", auto_mkdir=True)
        options = {
            "skip_instance_cache": True,
            "use_listings_cache": False,
            **self._storage_options,
        }
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options.setdefault("endpoint_url", endpoint)
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", s3_retry_config())
        options["config_kwargs"] = config
        return fsspec.filesystem("s3", **options)

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
        """Names (not paths) directly under ``rel``; empty when it does not exist."""
        path = self.path(rel)
        try:
            entries = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        names = sorted({posixpath.basename(e.rstrip("/")) for e in entries})
        return [n for n in names if n and n != posixpath.basename(path)]

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
        path = self.path(rel)
        if self.protocol == "file":
            _atomic_local_write(path, data)
        else:
            self.fs.pipe_file(path, data)

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_bytes(rel, json_bytes(obj))

    @_translate_errors
    def put_file(self, local_path: str, rel: str) -> None:
        path = self.path(rel)
        if self.protocol == "file":
            with open(local_path, "rb") as f:
                _atomic_local_write(path, f.read())
        else:
            self.fs.put_file(local_path, path)

    @_translate_errors
    def remove(self, rel: str, recursive: bool = False) -> None:
        path = self.path(rel)
        if self.fs.exists(path):
            self.fs.rm(path, recursive=recursive)

    # -- compare-and-swap ----------------------------------------------------------

    @_translate_errors
    def etag(self, rel: str) -> str | None:
        """An opaque version tag of the object, or None when it does not exist."""
        path = self.path(rel)
        if self.protocol == "file":
            try:
                with open(path, "rb") as f:
                    return sha256_bytes(f.read())
            except FileNotFoundError:
                return None
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        return str(info.get("ETag") or info.get("etag")).strip('"')

    @_translate_errors
    def write_if_match(self, rel: str, data: bytes, expected_etag: str | None) -> None:
        """Replace ``rel`` only if it still has ``expected_etag`` (None: must not exist).

        On S3 this is a conditional PUT (``If-Match`` / ``If-None-Match: *``), so the
        check and the write are one atomic step on the server. On a local disk an
        exclusive lock serialises writers around the check and the atomic rename.

        :raises ConflictError: another writer changed the object first.
        """
        path = self.path(rel)
        if self.protocol == "file":
            os.makedirs(os.path.dirname(path), exist_ok=True)
            lock_path = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock")
            with open(lock_path, "a+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    current = self.etag(rel)
                    if current != expected_etag:
                        raise ConflictError(
                            f"{self.url(rel)} changed under us (expected version "
                            f"{expected_etag}, found {current}): a concurrent run won"
                        )
                    _atomic_local_write(path, data)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
            return
        bucket, _, key = path.partition("/")
        condition = (
            {"IfNoneMatch": "*"} if expected_etag is None else {"IfMatch": f'"{expected_etag}"'}
        )
        try:
            self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
        except Exception as e:
            # s3fs re-raises the botocore ClientError as a builtin (FileExistsError for
            # If-None-Match, OSError(EINVAL) for If-Match) with the original as __cause__.
            # If-Match on a key deleted meanwhile answers 404: also a lost race.
            codes = {_s3_error_code(e), _s3_error_code(e.__cause__)}
            lost = {"PreconditionFailed", "ConditionalRequestConflict"}
            if expected_etag is not None:
                lost.add("NoSuchKey")
            if codes & lost or (
                "PreconditionFailed" in str(e) or "Precondition" in type(e).__name__
            ):
                raise ConflictError(
                    f"{self.url(rel)} changed under us (expected version "
                    f"{expected_etag}): a concurrent run won"
                ) from e
            raise


def _s3_error_code(exc: BaseException | None) -> str:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


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
