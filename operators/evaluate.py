"""Evaluation of the run's model version on the fixed held-out set."""

from __future__ import annotations

from typing import Any

from embedfresh.operators.base import EmbedfreshJobOperator
from embedfresh.operators.reports import eval_report_name


class EvaluationOperator(EmbedfreshJobOperator):
    """Evaluates model version ``run_id`` on the fixed eval split (``python -m embedfresh.jobs.evaluate``).

    Writes ``reports/eval.json`` with the metrics and the per-example outcomes the gate
    needs; a task of another id than ``evaluate`` writes ``reports/eval-<task id>.json``
    (a mapped one adds ``-<map index>``), so several evaluations of one run coexist and
    each gate reads the one it names.
    """

    job_name = "evaluate"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._map_index: int | None = None

    def use_run_context(self, context: Any) -> None:
        ti = context.get("ti") if hasattr(context, "get") else None
        self._map_index = getattr(ti, "map_index", None)

    def job_specific_settings(self) -> dict[str, Any]:
        return {"report_name": eval_report_name(self.task_id, self._map_index)}
