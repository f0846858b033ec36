"""Waiting for a run's training partition: :class:`TrainingPartitionSensor` and its trigger.

A scheduled run is created when its interval ends, often before the day's data has
landed; without a wait its first training step fails at once (``missing training
partition dt=...``). The sensor waits for the partition the train job will read,
resolved by the train job's own rules:

- which days: :meth:`IncrementalTrainingOperator.data_interval
  <embedfresh.operators.train.IncrementalTrainingOperator.data_interval>` (``day``, the
  explicit interval arguments, else a scheduled or backfill run's data interval from
  :func:`~embedfresh.operators.params.run_data_interval`; a manual run without ``day``:
  the newest partition);
- whether the store holds them: :meth:`TrainConfig.with_day
  <embedfresh.core.config.TrainConfig.with_day>`, the check the train job makes when it
  starts, against the ``dt=`` folders of ``datasets/{dataset}/train/``
  (:func:`embedfresh.core.partitions.partition_days`, the train job's own listing: a
  misnamed folder fails the wait as it would fail the training);
- and a partition counts once its folder holds a ``.parquet`` file, what the train job's
  reader reads (or a producer's marker such as ``_SUCCESS``, when ``marker`` names one).

The wait is deferrable: the trigger polls the artifact store (blocking calls in a
thread) every ``poke_interval``, logs what it waits for and what the store holds at the
start and at least every :data:`LOG_EVERY_SECONDS`, and fires when the partition has
landed or the timeout has passed. The timeout comes from the deployment setting
:data:`PARTITION_WAIT_ENV`, read when the DAG file is parsed and kept below the
refresh's deadline (:mod:`embedfresh.operators.deadline`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSensorTimeout
from airflow.triggers.base import BaseTrigger, TriggerEvent

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError, TransientError
from embedfresh.core.partitions import partition_days
from embedfresh.core.settings import default_artifact_root
from embedfresh.operators.base import FailFastTemplatesMixin
from embedfresh.operators.deadline import DEADLINE_ENV, deadline_interval
from embedfresh.operators.params import MANUAL_RUN_TYPES, run_data_interval, run_type
from embedfresh.operators.resources import env_seconds
from embedfresh.operators.train import IncrementalTrainingOperator

#: Environment variable with the longest wait for a training partition, in seconds.
PARTITION_WAIT_ENV = "EMBEDFRESH_PARTITION_WAIT_SECONDS"
#: What a refresh needs once its partition is there (compile, train, evaluate, gate,
#: embed, verify, load the index, search check, release): the default wait leaves it
#: this much of the deadline, or half the deadline when the deadline is shorter.
REFRESH_WORK_SECONDS = 2 * 3600
#: The waiting trigger logs at least this often, also when it polls less often.
LOG_EVERY_SECONDS = 30.0
#: Partitions named in a "the store holds" line: the newest few.
NEWEST_SHOWN = 5

_TRIGGER = f"{__name__}.TrainingPartitionTrigger"


def partition_wait_timeout(deadline: dt.timedelta | None = None) -> dt.timedelta:
    """The longest wait for a partition: :data:`PARTITION_WAIT_ENV` when set, else the
    refresh's deadline (:data:`~embedfresh.operators.deadline.DEADLINE_ENV`, 6 hours by
    default) less :data:`REFRESH_WORK_SECONDS` (at most half of it): 4 hours by default.

    Read when the DAG file is parsed, so a bad value is an import error of the DAG file.

    :param deadline: the run's time budget; default: :func:`deadline_interval`.
    :raises ValueError: not a positive number of seconds, or not below the deadline (a
        wait that uses the whole budget leaves the run none to train in).
    """
    deadline = deadline_interval() if deadline is None else deadline
    wait = env_seconds(PARTITION_WAIT_ENV)
    if wait is None:
        work = min(dt.timedelta(seconds=REFRESH_WORK_SECONDS), deadline / 2)
        return deadline - work
    if wait >= deadline:
        raise ValueError(
            f"{PARTITION_WAIT_ENV}={wait.total_seconds():g} must be below the refresh's "
            f"deadline ({DEADLINE_ENV}: {deadline.total_seconds():.0f} s): a run that waits "
            "that long has no time left to train"
        )
    return wait


# -- what the store holds -------------------------------------------------------------------


def newest_partitions(days: Sequence[dt.date], shown: int = NEWEST_SHOWN) -> str:
    """``it holds 12 partitions, the newest dt=..., dt=...`` or ``it holds none``."""
    if not days:
        return "it holds none"
    names = ", ".join(f"dt={d}" for d in days[-shown:])
    if len(days) <= shown:
        return f"it holds {names}"
    return f"it holds {len(days)} partitions, the newest {names}"


@dataclass(frozen=True)
class PartitionCheck:
    """One look at the store: the days the train job would read, whether they landed."""

    landed: bool
    days: tuple[dt.date, ...]
    """The days the train job would read now (empty: no partition at all yet)."""
    waiting_for: str
    """What is missing, as URLs a person can open."""
    holds: str
    """The dataset's newest ``dt=`` partitions (:func:`newest_partitions`)."""

    @property
    def day(self) -> str | None:
        return self.days[0].isoformat() if self.days else None


def check_partition(
    artifact_root: str,
    dataset: str,
    start: dt.date | None,
    end: dt.date | None,
    marker: str | None = None,
    aws_conn_id: str | None = None,
) -> PartitionCheck:
    """Whether the partitions the train job would read are in the store (blocking I/O).

    ``start`` None: the newest partition (a manual run without ``day``), as
    :meth:`TrainConfig.with_day <embedfresh.core.config.TrainConfig.with_day>` picks it
    from the ``dt=`` folders. Else every day of ``[start, end)`` (``end`` None: one day).
    A day counts when its folder holds a ``.parquet`` file (with ``marker``: that file).
    ``aws_conn_id``: an Airflow connection whose credentials open an ``s3://`` root
    (:func:`embedfresh.operators.store.artifact_store`).

    :raises BadInputError: the root or dataset is not usable (no retry helps).
    :raises TransientError: the store is unreachable now.
    """
    from embedfresh.core.config import TrainConfig
    from embedfresh.operators.store import artifact_store

    store = artifact_store(artifact_root, aws_conn_id)
    where = store.url(layout.train_partitions(dataset))
    folders = partition_days(store, dataset)  # the train job's own rule
    holds = newest_partitions(folders)
    try:
        cfg = TrainConfig(
            artifact_root=artifact_root,
            dataset=dataset,
            data_interval_start=start,
            data_interval_end=end,
        )
    except ValueError as e:  # an empty interval, a dataset that is not a name
        raise BadInputError(f"the training partition's settings are not valid: {e}") from e
    try:
        cfg = cfg.with_day(folders, where)  # the train job's own check
    except BadInputError:
        if start is None:  # no partition at all
            return PartitionCheck(False, (), f"a first training partition under {where}/", holds)
    first = cfg.data_interval_start
    assert first is not None  # settled, or given
    days = tuple(first + dt.timedelta(days=i) for i in range((cfg.interval_end - first).days))
    missing = [
        store.url(layout.dataset_partition(dataset, "train", day))
        for day in days
        if not _landed(store, layout.dataset_partition(dataset, "train", day), marker)
    ]
    what = f" ({marker})" if marker else " (a .parquet file)"
    waiting_for = "training partition " + ", ".join(m + what for m in missing)
    return PartitionCheck(not missing, days, waiting_for if missing else "", holds)


def _landed(store: Any, directory: str, marker: str | None) -> bool:
    if marker:
        return bool(store.exists(f"{directory}/{marker}"))
    return any(name.endswith(".parquet") for name in store.listdir(directory))


def _date(value: str | None) -> dt.date | None:
    return dt.date.fromisoformat(value) if value else None


# -- the trigger --------------------------------------------------------------------------


class TrainingPartitionTrigger(BaseTrigger):
    """Polls the artifact store until a run's training partition has landed, or its
    time is up. Fires one event: ``{"status": "landed" | "timeout" | "error", ...}``.

    :param artifact_root: the store root URL.
    :param dataset: the data set the train job reads.
    :param start: first day (``YYYY-MM-DD``) or None: the newest partition.
    :param end: day after the last, or None: one day.
    :param marker: the file that makes a partition count, or None: a ``.parquet`` file.
    :param aws_conn_id: Airflow connection for an ``s3://`` root, or None: boto3's own
        credentials.
    :param poke_interval: seconds between looks at the store.
    :param wait_until: epoch seconds when the wait ends without a partition.
    :param started_at: epoch seconds when the sensor started waiting.
    :param waiting_for: what the sensor's own look found missing (logged at the start).
    :param holds: what the store held at the sensor's own look.
    """

    def __init__(
        self,
        *,
        artifact_root: str,
        dataset: str,
        start: str | None,
        end: str | None,
        marker: str | None,
        poke_interval: float,
        wait_until: float,
        started_at: float,
        waiting_for: str = "",
        holds: str = "",
        aws_conn_id: str | None = None,
    ) -> None:
        super().__init__()
        self.artifact_root = artifact_root
        self.dataset = dataset
        self.start = start
        self.end = end
        self.marker = marker
        self.aws_conn_id = aws_conn_id
        self.poke_interval = float(poke_interval)
        self.wait_until = float(wait_until)
        self.started_at = float(started_at)
        self.waiting_for = waiting_for or (
            f"training partition dt={start} of {dataset}"
            if start
            else f"a first training partition of {dataset}"
        )
        self.holds = holds or "what it holds is not known yet"

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return _TRIGGER, {
            "artifact_root": self.artifact_root,
            "dataset": self.dataset,
            "start": self.start,
            "end": self.end,
            "marker": self.marker,
            "poke_interval": self.poke_interval,
            "wait_until": self.wait_until,
            "started_at": self.started_at,
            "waiting_for": self.waiting_for,
            "holds": self.holds,
            "aws_conn_id": self.aws_conn_id,
        }

    def _check(self) -> PartitionCheck:
        return check_partition(
            self.artifact_root,
            self.dataset,
            _date(self.start),
            _date(self.end),
            self.marker,
            self.aws_conn_id,
        )

    def _event(self, status: str, check: PartitionCheck | None, **extra: Any) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": status,
                "day": check.day if check else None,
                "days": [d.isoformat() for d in check.days] if check else [],
                "waiting_for": check.waiting_for if check else self.waiting_for,
                "holds": check.holds if check else self.holds,
                "waited_seconds": round(time.time() - self.started_at, 1),
                **extra,
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        left = self.wait_until - time.time()
        self.log.info(
            "waiting for %s; %s: %s. Looking every %g s, for up to %.0f s more",
            self.waiting_for,
            self.artifact_root,
            self.holds,
            self.poke_interval,
            max(left, 0),
        )
        check: PartitionCheck | None = None
        next_look = time.time() + self.poke_interval  # the sensor has just looked
        last_log = time.time()
        while True:
            now = time.time()
            if now >= next_look or now >= self.wait_until:
                try:
                    check = await asyncio.to_thread(self._check)
                except TransientError as e:
                    self.log.warning("the store is unreachable, looking again later: %s", e)
                except BadInputError as e:
                    yield self._event("error", check, message=str(e), retry=False)
                    return
                except Exception as e:  # a bug or an unknown fault: the task's retry policy
                    yield self._event("error", check, message=f"{type(e).__name__}: {e}")
                    return
                if check is not None and check.landed:
                    self.log.info(
                        "training partition dt=%s landed after %.0f s",
                        check.day,
                        time.time() - self.started_at,
                    )
                    yield self._event("landed", check)
                    return
                next_look = time.time() + self.poke_interval
            now = time.time()
            if now >= self.wait_until:
                yield self._event("timeout", check)
                return
            if now - last_log >= LOG_EVERY_SECONDS * 0.98:
                self.log.info(
                    "still waiting for %s after %.0f s; %s: %s",
                    check.waiting_for if check else self.waiting_for,
                    now - self.started_at,
                    self.artifact_root,
                    check.holds if check else self.holds,
                )
                last_log = now
            wake = min(next_look, self.wait_until, last_log + LOG_EVERY_SECONDS)
            await asyncio.sleep(max(wake - time.time(), 0.05))


# -- the sensor -----------------------------------------------------------------------------


class TrainingPartitionSensor(FailFastTemplatesMixin, BaseSensorOperator):
    """Waits for the training partition a run's train job will read; returns its day.

    Which partition, first match wins (the train operator's own rule): the explicit
    ``data_interval_start``/``data_interval_end``; ``day``; a scheduled or backfill run's
    data interval; else the newest partition the store holds (the sensor succeeds as
    soon as there is one, and waits for the first one when there is none). A partition
    counts once its folder holds a ``.parquet`` file (with ``marker``: that file).

    Scheduled and backfill runs wait: their data may land late. A manual run (the
    Trigger form, REST, ``dag.test()``) does not, by default: a person asked for data the
    store holds now, so a missing day fails at once, naming the days the store holds
    (:meth:`look_once`); ``manual_runs="wait"`` makes it wait like a scheduled run.

    Deferrable: the wait runs in the triggerer (:class:`TrainingPartitionTrigger`), so it
    holds no worker slot; a partition already there succeeds at once without deferring.
    Not deferrable: ``reschedule`` mode (the slot is freed between looks) unless ``mode``
    says otherwise. The timeout fails the task without retry
    (:class:`~airflow.sdk.exceptions.AirflowSensorTimeout`), naming the partition and what
    the store holds.

    :param artifact_root: root URL of the artifact store, ``file://`` or ``s3://``; None:
        ``$EMBEDFRESH_ARTIFACT_ROOT``, as the jobs (templated).
    :param model: the model the run trains (templated; shown in the log).
    :param day: the ``day`` argument given to the train task, ``YYYY-MM-DD`` or empty
        (templated; :data:`~embedfresh.operators.params.DAY_ARG`).
    :param data_interval_start: as the train task's (templated).
    :param data_interval_end: as the train task's (templated).
    :param dataset: the train job's ``dataset`` setting; None: its default (``products``)
        (templated).
    :param marker: a file the data's producer writes last into each partition
        (``_SUCCESS``); None: any ``.parquet`` file counts (templated).
    :param aws_conn_id: Airflow connection whose credentials open an ``s3://`` root;
        None: boto3's own (templated).
    :param timeout: longest wait, seconds or a timedelta; None:
        :func:`partition_wait_timeout` (:data:`PARTITION_WAIT_ENV`, read at parse time).
    :param poke_interval: seconds between looks at the store (default 60).
    :param manual_runs: ``fail`` (default): a manual run's missing partition fails at
        once; ``wait``: it waits as a scheduled run does.
    :param deferrable: wait in the triggerer; None: ``[operators] default_deferrable``
        (Airflow's convention; ``false`` unless the deployment turns it on).
    :return: the day, ``YYYY-MM-DD`` (the first day of a longer interval), as XCom.
    :raises AirflowSensorTimeout: the timeout passed (no retry).
    :raises AirflowFailException: a ``day`` that is not a date, or a store that is not
        usable (no retry).
    """

    template_fields: Sequence[str] = (
        "artifact_root",
        "model",
        "day",
        "data_interval_start",
        "data_interval_end",
        "dataset",
        "marker",
        "aws_conn_id",
    )
    ui_color = "#f4f1fd"

    def __init__(
        self,
        *,
        artifact_root: str | None = None,
        model: str,
        day: str | None = "",
        data_interval_start: str | None = None,
        data_interval_end: str | None = None,
        dataset: str | None = None,
        marker: str | None = None,
        aws_conn_id: str | None = None,
        timeout: dt.timedelta | float | None = None,
        poke_interval: dt.timedelta | float = 60,
        deferrable: bool | None = None,
        manual_runs: str = "fail",
        **kwargs: Any,
    ) -> None:
        if manual_runs not in ("fail", "wait"):
            raise ValueError(f"manual_runs is 'fail' or 'wait', got {manual_runs!r}")
        if deferrable is None:  # Airflow's convention, read when the DAG file is parsed
            deferrable = conf.getboolean("operators", "default_deferrable", fallback=False)
        if timeout is None:
            timeout = partition_wait_timeout()
        kwargs.setdefault("mode", "poke" if deferrable else "reschedule")
        super().__init__(timeout=timeout, poke_interval=poke_interval, **kwargs)
        if not self.timeout > 0:
            raise ValueError(f"timeout must be a positive wait, got {timeout!r}")
        if not self.poke_interval > 0:
            raise ValueError(f"poke_interval must be positive, got {poke_interval!r}")
        self.artifact_root = default_artifact_root() if artifact_root is None else artifact_root
        self.model = model
        self.day = day
        self.data_interval_start = data_interval_start
        self.data_interval_end = data_interval_end
        self.dataset = dataset
        self.marker = marker
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable
        self.manual_runs = manual_runs
        self._run_interval: tuple[dt.date, dt.date] | None = None
        self._last: PartitionCheck | None = None

    # The same days as the train task: its own method, on this sensor's fields of the
    # same names (day, data_interval_start, data_interval_end, _run_interval).
    data_interval = IncrementalTrainingOperator.data_interval

    def use_run_context(self, context: Any) -> None:
        # None for a manual run: see run_data_interval.
        self._run_interval = run_data_interval(context) if hasattr(context, "get") else None

    def _dataset(self) -> str:
        if self.dataset:
            return str(self.dataset)
        from embedfresh.core.config import TrainConfig

        return TrainConfig.model_fields["dataset"].default

    def _wanted(self) -> tuple[dt.date | None, dt.date | None]:
        interval = self.data_interval()
        return (None, None) if interval is None else interval

    def check(self) -> PartitionCheck:
        """One look at the store for the partition this run trains on (no retry on a
        store that is not usable)."""
        start, end = self._wanted()
        try:
            self._last = check_partition(
                str(self.artifact_root),
                self._dataset(),
                start,
                end,
                self.marker or None,
                self.aws_conn_id or None,
            )
        except BadInputError as e:
            raise AirflowFailException(f"cannot look for the training partition: {e}") from e
        return self._last

    def look(self) -> PartitionCheck | None:
        """One look at the store, said in the log: what it found, or None when the store
        is unreachable (the wait goes on)."""
        try:
            found = self.check()
        except TransientError as e:
            self.log.warning("the store is unreachable, looking again later: %s", e)
            return None
        if not found.landed:
            self._log_waiting(found)
        return found

    def poke(self, context: Any) -> PokeReturnValue:
        self.use_run_context(context)
        found = self.look()
        if found is not None and found.landed:
            return PokeReturnValue(is_done=True, xcom_value=self._landed(found))
        return PokeReturnValue(is_done=False)

    def execute(self, context: Any) -> str | None:
        self.use_run_context(context)
        if self.manual_runs == "fail" and run_type(context) in MANUAL_RUN_TYPES:
            return self.look_once()
        if not self.deferrable:
            try:
                return super().execute(context)
            except AirflowSensorTimeout as e:
                raise AirflowSensorTimeout(self._timeout_message(self._last)) from e
        found = self.look()
        if found is not None and found.landed:
            return self._landed(found)
        now = time.time()
        start, end = self._wanted()
        self.defer(
            trigger=TrainingPartitionTrigger(
                artifact_root=str(self.artifact_root),
                dataset=self._dataset(),
                start=start.isoformat() if start else None,
                end=end.isoformat() if end else None,
                marker=self.marker or None,
                aws_conn_id=self.aws_conn_id or None,
                poke_interval=self.poke_interval,
                wait_until=now + self.timeout,
                started_at=now,
                waiting_for=found.waiting_for if found else "",
                holds=found.holds if found else "",
            ),
            method_name="execute_complete",
            # A backstop only (a triggerer that is down): the trigger ends the wait itself.
            timeout=dt.timedelta(seconds=self.timeout + max(60.0, 2 * self.poke_interval)),
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> str | None:
        """Resume after the trigger fired: the day, or the failure it reports."""
        event = event or {}
        status = event.get("status")
        if status == "landed":
            self.log.info(
                "training partition dt=%s landed after %s s (model %s, %s)",
                event.get("day"),
                event.get("waited_seconds"),
                self.model,
                self.artifact_root,
            )
            return event.get("day")
        if status == "timeout":
            raise AirflowSensorTimeout(self._timeout_message(None, event))
        message = f"waiting for the training partition failed: {event.get('message', event)}"
        if event.get("retry") is False:
            raise AirflowFailException(message)
        raise AirflowException(message)

    def look_once(self) -> str | None:
        """A manual run does not wait: a person asked for data the store holds now. The
        day when it is there; else a failure at once, naming what is missing and what
        the store holds (the Trigger form's ``day``, or empty for the newest).

        :raises AirflowFailException: it is not there (no retry).
        """
        found = self.check()
        if found.landed:
            return self._landed(found)
        raise AirflowFailException(
            f"missing {found.waiting_for}; {self.artifact_root}: {found.holds}. A manual run "
            "does not wait for data: trigger it with a day the store holds, or with day "
            "empty for the newest"
        )

    def _landed(self, found: PartitionCheck) -> str | None:
        self.log.info(
            "training partition dt=%s is in the store (%s; model %s): %s",
            found.day,
            ", ".join(f"dt={d}" for d in found.days),
            self.model,
            found.holds,
        )
        return found.day

    def _log_waiting(self, found: PartitionCheck) -> None:
        self.log.info(
            "waiting for %s (model %s, for up to %.0f s); %s: %s",
            found.waiting_for,
            self.model,
            self.timeout,
            self.artifact_root,
            found.holds,
        )

    def _timeout_message(
        self, found: PartitionCheck | None, event: dict[str, Any] | None = None
    ) -> str:
        if found is not None:
            waiting_for, holds = found.waiting_for, found.holds
        else:
            event = event or {}
            waiting_for = event.get("waiting_for") or "the run's training partition"
            holds = event.get("holds") or "what it holds is unknown"
        return (
            f"{waiting_for} did not land within the sensor's timeout of {self.timeout:.0f} s "
            f"(default from {PARTITION_WAIT_ENV}); {self.artifact_root}: {holds}. Write the "
            "partition and clear this task, or trigger the run with the day of a partition "
            "the store holds"
        )
