"""Evaluation of the run's model version on the fixed held-out set."""

from __future__ import annotations

from embedfresh.operators.base import EmbedfreshJobOperator


class EvaluationOperator(EmbedfreshJobOperator):
    """Evaluates model version ``run_id`` on the fixed eval split (``python -m embedfresh.jobs.evaluate``).

    Writes ``eval.json`` with the metrics and the per-example outcomes the gate needs.
    """

    job_name = "evaluate"
