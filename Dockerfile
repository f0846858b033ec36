# The project inside the official Airflow 3.3 image: the same pinned requirements as
# .venv, so the scheduler, the workers and the jobs they start run the tested versions.
FROM apache/airflow:3.3.2-python3.11

USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
USER airflow

COPY --chown=airflow:root requirements.txt /opt/embedfresh/requirements.txt
RUN pip install --no-cache-dir -r /opt/embedfresh/requirements.txt

COPY --chown=airflow:root . /opt/embedfresh
# Installed, not editable: one top-level package, embedfresh (its operators, plugins and
# jobs); the plugin registers itself through the package's airflow.plugins entry point.
RUN pip install --no-cache-dir --no-deps /opt/embedfresh

ENV HF_HUB_OFFLINE=1 \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/embedfresh/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/embedfresh/plugins
# Not the source folder: from there, its embedfresh/ folder would shadow the installed
# package (which also holds embedfresh.operators and embedfresh.plugins).
WORKDIR /opt/airflow
