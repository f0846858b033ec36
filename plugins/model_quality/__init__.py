"""The "Model quality" page of the Airflow web UI (issue 7).

Registry, gate decisions with their intervals, the latest candidate's evaluation curve
against the tolerance band, health per host and rank, compile cache entries and
embedding runs, read from the artifact store. See docs/UI.md.
"""

from embedfresh.plugins.model_quality.app import create_app

__all__ = ["create_app"]
