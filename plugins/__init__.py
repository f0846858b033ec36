"""Airflow plugins of embedfresh, installed as ``embedfresh.plugins``.

This folder is also an Airflow plugins folder (``make airflow``, docker-compose): Airflow
imports only ``model_quality_plugin.py`` from it (see .airflowignore). The same plugin is
registered through the ``airflow.plugins`` entry point, and Airflow loads a plugin name
once, so a ``pip install`` alone makes the page appear.
"""
