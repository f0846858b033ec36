"""Test DAGs: one job on AWS Batch (moto's, run by the test executor), waited on by
polling in the worker or deferred to the triggerer.

The "interpreter in the image" is tests/airflow/batch_probe_python.sh: it prints the
marker lines the run's conf asks for, holds while the hold file exists, then runs the
real job (the health job: seconds on any store). Parsed only by the Airflow that
tests/airflow/test_batch_airflow.py starts, never by the session's.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from airflow.sdk import DAG, Param

from embedfresh.operators import AcceleratorHealthOperator

PROBE_PYTHON = str(Path(__file__).resolve().parent.parent / "batch_probe_python.sh")

for dag_id, deferrable in (("batch_probe_poll", False), ("batch_probe_deferred", True)):
    with DAG(
        dag_id,
        schedule=None,
        start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        params={
            "artifact_root": Param(os.environ.get("EMBEDFRESH_ARTIFACT_ROOT", ""), type="string"),
            "marker": Param("", type="string"),
            "lines": Param(0, type="integer", minimum=0),
            "hold": Param("", type="string"),
        },
        default_args={"retries": 1, "retry_delay": dt.timedelta(seconds=1)},
    ):
        AcceleratorHealthOperator(
            task_id="health",
            model="tiny",
            artifact_root="{{ params.artifact_root }}",
            job_settings={"collectives": False},
            env={
                "PROBE_MARKER": "{{ params.marker }}",
                "PROBE_LINES": "{{ params.lines }}",
                "PROBE_HOLD": "{{ params.hold }}",
            },
            execution_mode="aws_batch",
            runner_settings={
                "job_definition": "embedfresh-train",
                "job_queue": "embedfresh-queue",
                "aws_conn_id": None,
                "region_name": "us-east-1",
                "python": PROBE_PYTHON,
                "poll_interval": 1,
                "deferrable": deferrable,
            },
        )
