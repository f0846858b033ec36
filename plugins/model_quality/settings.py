"""Where the "Model quality" page reads its artifacts from.

The page must show the store the DAGs write to, so it resolves the root the same way
``dags/embedding_model_refresh.py`` does: ``EMBEDFRESH_ARTIFACT_ROOT`` when set, else the
repository's ``artifacts/airflow`` folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from jobs.config import DEFAULT_ARTIFACT_ROOT_ENV

REPO = Path(__file__).resolve().parent.parent.parent

#: The URL prefix the plugin's FastAPI app is mounted under in the api-server.
URL_PREFIX = "/model-quality"

#: The DAG whose runs write gate reports when a run id does not name its DAG.
REFRESH_DAG_ID = "embedding_model_refresh"


def artifact_root() -> str:
    """The artifact root URL the DAGs use (``file://`` or ``s3://``)."""
    return os.environ.get(DEFAULT_ARTIFACT_ROOT_ENV) or f"file://{REPO / 'artifacts' / 'airflow'}"
