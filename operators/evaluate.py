"""Evaluation of the run's model version on the fixed held-out set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embedfresh.operators.base import EmbedfreshJobOperator
from embedfresh.operators.reports import eval_report_name


class QueryCap:
    """``max_queries`` of the evaluate, gate and search check jobs: the most judged
    queries any look uses (templated; rendered empty, e.g. ``"{{ params.judged_queries
    or '' }}"``, it is not set and the jobs use the whole pool)."""

    max_queries: int | str | None

    def cap_setting(self) -> dict[str, Any]:
        value = self.max_queries
        return {} if value in (None, "", "None") else {"max_queries": value}


class EvaluationOperator(QueryCap, EmbedfreshJobOperator):
    """Evaluates model version ``run_id`` on the fixed eval split (``python -m embedfresh.jobs.evaluate``).

    Writes ``reports/eval.json`` with the metrics and the per-example outcomes the gate
    needs; a task of another id than ``evaluate`` writes ``reports/eval-<task id>.json``
    (a mapped one adds ``-<map index>``), so several evaluations of one run coexist and
    each gate reads the one it names.

    :param max_queries: the most judged queries its look uses (templated; :class:`QueryCap`).
    """

    job_name = "evaluate"
    template_fields: Sequence[str] = (*EmbedfreshJobOperator.template_fields, "max_queries")

    def __init__(self, *, max_queries: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_queries = max_queries
        self._map_index: int | None = None

    def use_run_context(self, context: Any) -> None:
        ti = context.get("ti") if hasattr(context, "get") else None
        self._map_index = getattr(ti, "map_index", None)

    def job_specific_settings(self) -> dict[str, Any]:
        return {
            "report_name": eval_report_name(self.task_id, self._map_index),
            **self.cap_setting(),
        }
