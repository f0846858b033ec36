"""The artifact store as the control plane opens it: with an Airflow connection's credentials.

The jobs find their credentials the way boto3 does (the container's role, the
environment). What runs in Airflow itself (an operator reading a result record, the
shard listing) may be given an Airflow connection instead (``aws_conn_id``); it is
resolved here, through the Amazon provider's ``S3Hook``, into s3fs options for
:class:`~embedfresh.core.storage.ArtifactStore`, so :mod:`embedfresh.core` never learns
about Airflow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from embedfresh.core.storage import ArtifactStore, default_storage_options

#: The schemes of roots a connection's AWS credentials apply to.
AWS_SCHEMES = frozenset({"s3"})


def connection_storage_options(root: str, aws_conn_id: str | None) -> dict[str, Any] | None:
    """s3fs options for ``root`` from Airflow connection ``aws_conn_id``, resolved the way
    the provider's own ``s3://`` ObjectStoragePath does: the hook's session (keys, role,
    region; refreshed as they expire), the connection's S3 endpoint and its botocore
    ``config_kwargs``.

    ``None`` (nothing to pass) for a root of another scheme or no connection. A
    connection that does not exist leaves boto3's own credential chain, as the provider's
    hooks do (with their warning).
    """
    if not aws_conn_id or urlparse(str(root)).scheme not in AWS_SCHEMES:
        return None
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    hook = S3Hook(aws_conn_id=aws_conn_id)
    options: dict[str, Any] = {"session": hook.get_session(deferrable=True)}
    if endpoint := hook.conn_config.get_service_endpoint_url(service_name="s3"):
        options["endpoint_url"] = endpoint
    if config := hook.conn_config.extra_config.get("config_kwargs"):
        options["config_kwargs"] = dict(config)
    return options


def artifact_store(root: str, aws_conn_id: str | None) -> ArtifactStore:
    """The store at ``root``, through ``aws_conn_id``'s credentials when it is on S3."""
    return ArtifactStore(root, connection_storage_options(root, aws_conn_id))


@contextlib.contextmanager
def connection_scope(root: str, aws_conn_id: str | None) -> Iterator[None]:
    """Inside the block, every store of ``root``'s scheme that the core's readers make
    themselves (result records, the registry, input checks) uses ``aws_conn_id``."""
    options = connection_storage_options(root, aws_conn_id)
    protocol = urlparse(str(root)).scheme or "file"
    with default_storage_options(protocol, options):
        yield
