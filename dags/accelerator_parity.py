"""Backend parity: one start version trained on two backends, curves gated in parity mode.

Trains ``init_version`` (empty: the registry's production version) with identical
hyperparameters on ``backend_a`` and ``backend_b``, evaluating every ``eval_every``
steps, then gates B's curve against A's two-sided at every common evaluation point (the
0.1% SLA). Anything but PASS fails the task without retry; the report and its plot are
under ``runs/<model>/<run_id>/reports/gate.{json,svg}``.

init_version -> side_a, side_b -> parity: the start version is resolved once, each side
trains in a task of its own (on AWS Batch, on its backend's own job definition:
``EMBEDFRESH_BATCH_PARITY_A_JOB_DEFINITION``...), and ``parity`` compares the curves.

``dropout`` defaults to 0: the backends draw dropout masks from different random
generators, so with dropout the two sides are two different random trainings and the
curves differ by more than the SLA even on one backend (docs/PARITY.md).

Manual only, and a manual run never trains on its data interval (whatever its logical
date): the Param ``day`` names the training partition (``dt=<day>``); empty (the
default) means the newest partition in the store, looked up when the task starts.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from embedfresh.operators import BackendParityOperator, ResolveModelVersionOperator
from embedfresh.operators.notify import notifiers
from embedfresh.operators.params import (
    DAY_ARG,
    artifact_root_param,
    backend_param,
    day_param,
    model_param,
)
from embedfresh.operators.resources import task_resources

with DAG(
    "accelerator_parity",
    description="Same checkpoint on two backends, curves gated in parity mode",
    doc_md=__doc__,
    schedule=None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    params={
        "artifact_root": artifact_root_param(),
        "model": model_param(),
        "init_version": Param(
            "", type="string", description="Start version; empty: the production version"
        ),
        "backend_a": backend_param("cpu", "Reference backend"),
        "backend_b": backend_param("xla", "Candidate backend"),
        "eval_every": Param(
            10, type="integer", minimum=1, description="Optimizer steps between evaluations"
        ),
        "epochs": Param(1, type="integer", minimum=1, description="Training epochs"),
        "day": day_param(),
        "dropout": Param(
            0.0,
            type="number",
            minimum=0,
            exclusiveMaximum=1,
            description="Dropout of both sides' training; 0 keeps cross-backend runs comparable",
        ),
    },
    tags=["embedfresh"],
    on_failure_callback=notifiers("run_failed"),
) as dag:
    # Both sides start from one version, resolved once (production may move meanwhile).
    init_version = ResolveModelVersionOperator(
        task_id="init_version",
        artifact_root="{{ params.artifact_root }}",
        model="{{ params.model }}",
        version="{{ params.init_version }}",
    )
    same = {
        "artifact_root": "{{ params.artifact_root }}",
        "model": "{{ params.model }}",
        "init_version": "{{ ti.xcom_pull(task_ids='init_version') }}",
        "backend_a": "{{ params.backend_a }}",
        "backend_b": "{{ params.backend_b }}",
        "eval_every": "{{ params.eval_every }}",
        "epochs": "{{ params.epochs }}",
        **DAY_ARG,
        "job_settings": {"dropout": "{{ params.dropout }}"},
        "retries": 0,
    }
    # One task per side, each on its own backend's machine (an AWS Batch job definition
    # hosts one backend), then the comparison of the two curves.
    sides = [
        BackendParityOperator(
            task_id=f"side_{side}", **same, step=side, **task_resources(f"parity_{side}")
        )
        for side in ("a", "b")
    ]
    compare = BackendParityOperator(
        task_id="parity", **same, step="compare", **task_resources("parity_compare")
    )
    init_version >> sides >> compare
