"""Incremental training of the production model on one data interval."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from embedfresh.operators.base import EmbedfreshJobOperator
from embedfresh.operators.params import parse_day, run_data_interval


class IncrementalTrainingOperator(EmbedfreshJobOperator):
    """Trains the model incrementally on one data interval's partitions.

    Runs ``python -m embedfresh.jobs.train``: starts from the production version (or the base
    weights before the first promotion), resumes from the run's newest committed
    checkpoint on a retry, and publishes model version ``run_id``.

    Which days, first match wins: ``data_interval_start`` (and ``data_interval_end``) when
    given; else ``day``; else the run's own data interval, for a scheduled or backfill
    run only; else none, and the job trains on the newest ``dt=`` partition in the
    store, read when it starts. A manual run (the Trigger form, a REST trigger,
    ``dag.test()``; ``context["dag_run"].run_type == "manual"``) never uses its data
    interval, whatever its logical date: the form's default logical date is *now*,
    whose interval ends today, a day the store does not hold yet. To train a manual run
    on a given day, give it ``day``. The job refuses a day the store does not hold
    (exit 2, naming what it holds).

    :param day: one day of data, ``YYYY-MM-DD``; empty or None: see above (templated).
    :param data_interval_start: first day of data, ``YYYY-MM-DD``; empty: see above
        (templated).
    :param data_interval_end: day after the last day of data, ``YYYY-MM-DD``; empty: the
        day after the start (templated).
    :param epochs: passes over the interval's data (templated).
    :raises AirflowFailException: a day that is not ``YYYY-MM-DD`` (no retry).
    """

    job_name = "train"
    template_fields: Sequence[str] = (
        *EmbedfreshJobOperator.template_fields,
        "day",
        "data_interval_start",
        "data_interval_end",
        "epochs",
    )

    def __init__(
        self,
        *,
        day: str = "",
        data_interval_start: str | None = None,
        data_interval_end: str | None = None,
        epochs: int | str = 2,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.day = day
        self.data_interval_start = data_interval_start
        self.data_interval_end = data_interval_end
        self.epochs = epochs
        self._run_interval: tuple[dt.date, dt.date] | None = None

    def use_run_context(self, context: Any) -> None:
        # None for a manual run: see run_data_interval.
        self._run_interval = run_data_interval(context) if hasattr(context, "get") else None

    def data_interval(self) -> tuple[dt.date, dt.date | None] | None:
        """``(start, end)`` the job trains on (end None: the day after start), or None: the
        newest partition, which the job looks up."""
        start = parse_day(self.data_interval_start, "data_interval_start")
        if start is not None:
            return start, parse_day(self.data_interval_end, "data_interval_end")
        day = parse_day(self.day)
        if day is not None:
            return day, day + dt.timedelta(days=1)
        return self._run_interval

    def job_specific_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {}
        interval = self.data_interval()
        if interval is not None:
            settings["data_interval_start"] = interval[0].isoformat()
            if interval[1] is not None:
                settings["data_interval_end"] = interval[1].isoformat()
        settings["epochs"] = self.epochs
        return settings
