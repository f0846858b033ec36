"""Where the "Model quality" page reads its artifacts from.

The page must show the store the DAGs write to, so it resolves the root with the same
function as the DAGs' Params (:func:`embedfresh.core.settings.default_artifact_root`).
"""

from __future__ import annotations

import os
from typing import Any

from embedfresh.connections import s3_storage_options
from embedfresh.core.settings import default_artifact_root

#: The URL prefix the plugin's FastAPI app is mounted under in the api-server.
URL_PREFIX = "/model-quality"

#: The DAG whose runs write gate reports when a run id does not name its DAG.
REFRESH_DAG_ID = "embedding_model_refresh"


def artifact_root() -> str:
    """The artifact root URL the DAGs use (``file://`` or ``s3://``)."""
    return default_artifact_root()


#: The Airflow connection the page reads an ``s3://`` store through; unset: boto3's own
#: credentials (the api-server's role or environment), as before.
AWS_CONN_ID_ENV = "EMBEDFRESH_AWS_CONN_ID"


def aws_conn_id() -> str | None:
    """``$EMBEDFRESH_AWS_CONN_ID``: the AWS connection of the page's store, if any."""
    return os.environ.get(AWS_CONN_ID_ENV, "").strip() or None


def storage_options(root: str) -> dict[str, Any] | None:
    """s3fs options for the store at ``root`` from :func:`aws_conn_id`'s connection
    (:func:`embedfresh.connections.s3_storage_options`, the operators' own); ``None`` for
    a root not on S3 or no connection configured. Read per request, so a changed
    connection applies without a restart; the session refreshes its own credentials.
    """
    return s3_storage_options(root, aws_conn_id())


#: The DAGs a person runs to move production by hand (dags/model_overrides.py), by the
#: action's name: the page offers each only to users who may trigger it.
OVERRIDE_DAG_IDS = {
    "promote_anyway": "embedfresh_promote_anyway",
    "rollback": "embedfresh_rollback",
}
