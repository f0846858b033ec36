"""``s3://bucket/prefix`` roots: S3 or anything that speaks its API (MinIO, moto).

Objects are written by a single PUT; compare-and-swap is a conditional PUT
(``If-Match`` / ``If-None-Match: *``), so the check and the write are one atomic step on
the server. The endpoint comes from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` when
set, otherwise from the usual AWS configuration.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import ParseResult

import fsspec

from embedfresh.core.exit_codes import BadInputError, ConflictError
from embedfresh.core.storage.base import Scheme

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


class S3Scheme(Scheme):
    """A bucket and a key prefix on S3 (through s3fs)."""

    def base(self, root: str, parsed: ParseResult) -> str:
        """``bucket/prefix``.

        :raises BadInputError: the URL names no bucket (``s3:///x``).
        """
        if not parsed.netloc:
            raise BadInputError(f"artifact root {root!r} names no bucket")
        return super().base(root, parsed)

    def filesystem(self) -> fsspec.AbstractFileSystem:
        options = {
            "skip_instance_cache": True,
            "use_listings_cache": False,
            **self.storage_options,
        }
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options.setdefault("endpoint_url", endpoint)
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", s3_retry_config())
        options["config_kwargs"] = config
        return fsspec.filesystem("s3", **options)

    def etag(self, fs: fsspec.AbstractFileSystem, path: str) -> str | None:
        """The object's ETag (S3's own version tag: no read of the bytes)."""
        try:
            info = fs.info(path)
        except FileNotFoundError:
            return None
        tag = info.get("ETag") or info.get("etag")
        if not tag:  # an endpoint that lists none: the bytes' own hash, never "None"
            return super().etag(fs, path)
        return str(tag).strip('"')

    def write_if_match(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        data: bytes,
        expected_etag: str | None,
        url: str,
    ) -> None:
        """A conditional PUT: the check and the write are one atomic step on the server."""
        bucket, _, key = path.partition("/")
        condition = (
            {"IfNoneMatch": "*"} if expected_etag is None else {"IfMatch": f'"{expected_etag}"'}
        )
        try:
            fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
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
                    f"{url} changed under us (expected version "
                    f"{expected_etag}): a concurrent run won"
                ) from e
            raise


def _s3_error_code(exc: BaseException | None) -> str:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))
