"""Where the "Model quality" page reads its artifacts from.

The page must show the store the DAGs write to, so it resolves the root with the same
function as the DAGs' Params (:func:`embedfresh.core.settings.default_artifact_root`).
"""

from __future__ import annotations

from embedfresh.core.settings import default_artifact_root

#: The URL prefix the plugin's FastAPI app is mounted under in the api-server.
URL_PREFIX = "/model-quality"

#: The DAG whose runs write gate reports when a run id does not name its DAG.
REFRESH_DAG_ID = "embedding_model_refresh"


def artifact_root() -> str:
    """The artifact root URL the DAGs use (``file://`` or ``s3://``)."""
    return default_artifact_root()


#: The DAGs a person runs to move production by hand (dags/model_overrides.py), by the
#: action's name: the page offers each only to users who may trigger it.
OVERRIDE_DAG_IDS = {
    "promote_anyway": "embedfresh_promote_anyway",
    "rollback": "embedfresh_rollback",
}
