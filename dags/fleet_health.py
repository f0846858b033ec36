"""Scheduled health check of the accelerator fleet: devices, tensor ops, collectives.

Runs ``python -m embedfresh.jobs.health`` every six hours (and by hand from the Trigger form) with
``nproc`` processes on one node, or on ``num_nodes`` nodes through the AWS Batch runner
when an operator is configured so. Every check, its figures and the verdict go to
``runs/<model>/<run_id>/reports/health.json``; a failed check fails the task (exit 4,
no retry) and names the check in the task log.

Thresholds come from Params: ``min_busbw_gbps`` (a floor per collective in GB/s, e.g.
``{"all_reduce": 50}``), ``tensor_rtol`` (tolerance of float32 ops against float64; null:
the backend's default) and ``expected_devices`` (devices the node must see; null: at
least one). The defaults run the embedded demo on CPU.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, CronTriggerTimetable, Param

from embedfresh.operators import AcceleratorHealthOperator
from embedfresh.operators.notify import notifiers
from embedfresh.operators.params import COMMON_JOB_ARGS, common_params
from embedfresh.operators.resources import task_resources

with DAG(
    "fleet_health",
    description="Health checks of the accelerators and their links, nothing else",
    doc_md=__doc__,
    schedule=CronTriggerTimetable("0 */6 * * *", timezone="UTC"),
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    # Params of type object/null must reach the job as JSON values, not as strings.
    render_template_as_native_obj=True,
    params={
        **common_params(),
        "nproc": Param(1, type="integer", minimum=1, description="Processes (devices) per node"),
        "min_busbw_gbps": Param(
            {},
            type="object",
            description='Bus-bandwidth floor per collective in GB/s, e.g. {"all_reduce": 50}',
        ),
        "tensor_rtol": Param(
            None,
            type=["null", "number"],
            description="Tolerance of float32 tensor ops vs float64; null: backend default",
        ),
        "expected_devices": Param(
            None,
            type=["null", "integer"],
            description="Devices each node must see; null: at least one",
        ),
    },
    tags=["embedfresh"],
    on_failure_callback=notifiers("run_failed"),
) as dag:
    AcceleratorHealthOperator(
        task_id="health",
        **COMMON_JOB_ARGS,
        **task_resources("health"),
        nproc_per_node="{{ params.nproc }}",
        job_settings={
            "min_busbw_gbps": "{{ params.min_busbw_gbps }}",
            "tensor_rtol": "{{ params.tensor_rtol }}",
            "expected_devices": "{{ params.expected_devices }}",
        },
        retries=0,
    )
