"""Airflow plugin: the "Model quality" page in the web UI's navigation.

The FastAPI app serves the page and its JSON endpoints under ``/model-quality``; the
external view puts it in the "Browse" menu, embedded in the Airflow UI
(``/plugin/model-quality``).

Airflow finds the plugin through the package's ``airflow.plugins`` entry point, so
``pip install embedfresh`` is enough. Where a plugins folder holds this file too (the
repository's ``plugins/`` in ``make airflow``, or a copy), Airflow imports it there
first, as a top-level module, and would then report the entry point's copy as a
duplicate ("already registered"): a folder copy therefore defines no plugin while the
installed package registers it.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from airflow.plugins_manager import AirflowPlugin

from embedfresh.plugins.model_quality.app import plugin_app_spec
from embedfresh.plugins.model_quality.settings import URL_PREFIX

#: Where the ``airflow.plugins`` entry point points (pyproject.toml).
ENTRY_POINT_MODULE = "embedfresh.plugins.model_quality_plugin"


def registered_by_entry_point() -> bool:
    """Whether an installed distribution registers this module as an Airflow plugin."""
    return any(ep.module == ENTRY_POINT_MODULE for ep in entry_points(group="airflow.plugins"))


class _ModelQualityPlugin(AirflowPlugin):
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


if __name__ == ENTRY_POINT_MODULE or not registered_by_entry_point():
    ModelQualityPlugin = _ModelQualityPlugin
del _ModelQualityPlugin
