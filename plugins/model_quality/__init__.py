"""The "Model quality" page of the Airflow web UI (issue 7).

The live release (model version, each corpus's embedding set, index table and search
check) and the release history, gate decisions with their intervals, the latest
candidate's evaluation curve against the tolerance band, the newest runs' search checks,
health per host and rank, compile cache entries and embedding runs, read from the
artifact store. See docs/UI.md.
"""

from embedfresh.plugins.model_quality.app import create_app

__all__ = ["create_app"]
