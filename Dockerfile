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
RUN pip install --no-cache-dir --no-deps -e /opt/embedfresh

ENV HF_HUB_OFFLINE=1 \
    PYTHONPATH=/opt/embedfresh \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/embedfresh/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/embedfresh/plugins
WORKDIR /opt/embedfresh
