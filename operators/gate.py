"""The quality gate: candidate vs reference within the 0.1% SLA."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embedfresh.operators.base import EmbedfreshJobOperator


class QualityGateOperator(EmbedfreshJobOperator):
    """Lets the run's candidate through only on PASS (``python -m embedfresh.jobs.gate``).

    FAIL and INCONCLUSIVE exit 3: the task fails without retry and production is untouched.

    :param mode: ``no_regression`` (one-sided, vs production) or ``parity`` (two-sided)
        (templated).
    :param tolerance: relative tolerance, 0.001 being the 0.1% SLA (templated).
    """

    job_name = "gate"
    template_fields: Sequence[str] = (*EmbedfreshJobOperator.template_fields, "mode", "tolerance")

    def __init__(
        self, *, mode: str = "no_regression", tolerance: float | str = 0.001, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.mode = mode
        self.tolerance = tolerance

    def job_specific_settings(self) -> dict[str, Any]:
        return {"mode": self.mode, "tolerance": self.tolerance}
