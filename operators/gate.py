"""The quality gate: candidate vs reference within the 0.1% SLA."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from embedfresh.operators.base import EmbedfreshJobOperator


class QualityGateOperator(EmbedfreshJobOperator):
    """Lets the run's candidate through only on PASS (``python -m embedfresh.jobs.gate``).

    FAIL and INCONCLUSIVE exit 3: the task fails without retry and production is untouched.

    :param mode: ``no_regression`` (one-sided, vs production) or ``parity`` (two-sided)
        (templated).
    :param tolerance: relative tolerance, 0.001 being the 0.1% SLA (templated).
    :param metrics: the metrics that must all pass, a list or its JSON text (templated:
        ``"{{ params.gate_metrics | tojson }}"``); None: the gate job's default.
    """

    job_name = "gate"
    template_fields: Sequence[str] = (
        *EmbedfreshJobOperator.template_fields,
        "mode",
        "tolerance",
        "metrics",
    )

    def __init__(
        self,
        *,
        mode: str = "no_regression",
        tolerance: float | str = 0.001,
        metrics: list[str] | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.mode = mode
        self.tolerance = tolerance
        self.metrics = metrics

    def job_specific_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {"mode": self.mode, "tolerance": self.tolerance}
        if self.metrics is not None:
            metrics = self.metrics
            if isinstance(metrics, str):  # a rendered template: JSON text of the list
                try:
                    metrics = json.loads(metrics)
                except json.JSONDecodeError:
                    raise AirflowFailException(
                        f"metrics must be a list of metric names, got {self.metrics!r}"
                    ) from None
            settings["metrics"] = metrics
        return settings
