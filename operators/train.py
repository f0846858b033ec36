"""Incremental training of the production model on one data interval."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embedfresh.operators.base import EmbedfreshJobOperator


class IncrementalTrainingOperator(EmbedfreshJobOperator):
    """Trains the model incrementally on ``[data_interval_start, data_interval_end)``.

    Runs ``python -m embedfresh.jobs.train``: starts from the production version (or the base
    weights before the first promotion), resumes from the run's newest committed
    checkpoint on a retry, and publishes model version ``run_id``.

    :param data_interval_start: first day of data, ``YYYY-MM-DD`` (templated).
    :param data_interval_end: day after the last day of data, ``YYYY-MM-DD`` (templated).
    :param epochs: passes over the interval's data (templated).
    """

    job_name = "train"
    template_fields: Sequence[str] = (
        *EmbedfreshJobOperator.template_fields,
        "data_interval_start",
        "data_interval_end",
        "epochs",
    )

    def __init__(
        self,
        *,
        data_interval_start: str = "{{ data_interval_start | ds }}",
        data_interval_end: str = "{{ data_interval_end | ds }}",
        epochs: int | str = 2,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.data_interval_start = data_interval_start
        self.data_interval_end = data_interval_end
        self.epochs = epochs

    def job_specific_settings(self) -> dict[str, Any]:
        return {
            "data_interval_start": self.data_interval_start,
            "data_interval_end": self.data_interval_end,
            "epochs": self.epochs,
        }
