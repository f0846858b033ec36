"""Accelerator health check before any training starts."""

from __future__ import annotations

from embedfresh.operators.base import EmbedfreshJobOperator


class AcceleratorHealthOperator(EmbedfreshJobOperator):
    """Checks the devices and links a run is about to use (``python -m embedfresh.jobs.health``).

    Tensor-op checks against a float64 reference, NaN/Inf and memory checks on every
    device, and collectives (all-reduce, all-gather, reduce-scatter) across all ranks
    with their bus bandwidth; on Neuron hosts also ``neuron-ls`` and ``nccom-test``. Use
    ``nproc_per_node`` (and ``batch={'num_nodes': N, ...}`` on AWS Batch) to check the
    same world size the training job will use. Thresholds and check sizes go in
    ``job_settings`` (the job's config fields, see docs/HEALTH.md).

    Writes ``runs/<model>/<run_id>/reports/health.json``; the XCom value is the job's
    small summary (verdict, failed checks, report URL). A faulty device or link exits 4:
    the task fails without retry, so nothing downstream (compile, train) starts.
    """

    job_name = "health"
    ui_color = "#e9f7ef"
