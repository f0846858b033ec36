"""Backend parity: one start version trained on two backends, curves gated in parity mode.

Trains ``init_version`` (empty: the registry's production version) with identical
hyperparameters on ``backend_a`` and ``backend_b``, evaluating every ``eval_every``
steps, then gates B's curve against A's two-sided at every common evaluation point (the
0.1% SLA). Anything but PASS fails the task without retry; the report and its plot are
under ``runs/<model>/<run_id>/reports/gate.{json,svg}``.

Manual only. The training data is the partition of the run's data interval, as in
``embedding_model_refresh``.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from operators import BackendParityOperator
from operators.params import artifact_root_param, backend_param, model_param

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
    },
    tags=["embedfresh"],
) as dag:
    BackendParityOperator(
        task_id="parity",
        artifact_root="{{ params.artifact_root }}",
        model="{{ params.model }}",
        init_version="{{ params.init_version }}",
        backend_a="{{ params.backend_a }}",
        backend_b="{{ params.backend_b }}",
        eval_every="{{ params.eval_every }}",
        epochs="{{ params.epochs }}",
        retries=0,
    )
