"""Airflow plugin: the "Model quality" page in the web UI's navigation.

The FastAPI app serves the page and its JSON endpoints under ``/model-quality``; the
external view puts it in the "Browse" menu, embedded in the Airflow UI
(``/plugin/model-quality``). Airflow loads this file from its plugins folder; the code
lives in the :mod:`plugins.model_quality` package beside it (see .airflowignore).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from plugins.model_quality.app import plugin_app_spec
from plugins.model_quality.settings import URL_PREFIX


class ModelQualityPlugin(AirflowPlugin):
    name = "model_quality"
    fastapi_apps = [plugin_app_spec()]
    external_views = [
        {
            "name": "Model quality",
            "href": f"{URL_PREFIX.lstrip('/')}/",
            "url_route": "model-quality",
            "destination": "nav",
            "category": "browse",
        }
    ]
