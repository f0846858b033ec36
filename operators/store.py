"""The artifact store as the control plane opens it: with an Airflow connection's credentials.

The jobs find their credentials the way boto3 does (the container's role, the
environment). What runs in Airflow itself (an operator reading a result record, the
shard listing) may be given an Airflow connection instead (``aws_conn_id``), resolved into s3fs
options by :func:`embedfresh.connections.s3_storage_options`, the one function the
operators and the "Model quality" page share.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from urllib.parse import urlparse

from embedfresh.connections import s3_storage_options
from embedfresh.core.storage import ArtifactStore, default_storage_options


def artifact_store(root: str, aws_conn_id: str | None) -> ArtifactStore:
    """The store at ``root``, through ``aws_conn_id``'s credentials when it is on S3."""
    return ArtifactStore(root, s3_storage_options(root, aws_conn_id))


@contextlib.contextmanager
def connection_scope(root: str, aws_conn_id: str | None) -> Iterator[None]:
    """Inside the block, every store of ``root``'s scheme that the core's readers make
    themselves (result records, the registry, input checks) uses ``aws_conn_id``."""
    options = s3_storage_options(root, aws_conn_id)
    protocol = urlparse(str(root)).scheme or "file"
    with default_storage_options(protocol, options):
        yield
