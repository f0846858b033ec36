"""A run waits for its training partition instead of failing (issue 39).

:class:`~embedfresh.operators.partition.TrainingPartitionSensor` resolves the partition
the train task will read by the train operator's own rule (``day``; a scheduled or
backfill run's data interval; a manual run without ``day``: the newest partition), and
waits for it in the triggerer, logging what it waits for and what the store holds. A
partition already there succeeds at once without deferring; the timeout, a deployment
setting kept below the refresh's deadline, fails the task without retry, naming the
partition and what the store holds.

Most tests drive the sensor and its trigger in this process (seconds); one runs a small
DAG under ``dag.test()`` in a fresh interpreter, which runs the deferred trigger inline:
a partition that lands while the run waits, and one that never lands.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pendulum
import pytest
from airflow.sdk.exceptions import (
    AirflowFailException,
    AirflowSensorTimeout,
    TaskDeferred,
)

from embedfresh.operators import partition
from embedfresh.operators.deadline import DEADLINE_ENV
from embedfresh.operators.partition import (
    PARTITION_WAIT_ENV,
    TrainingPartitionSensor,
    TrainingPartitionTrigger,
    partition_wait_timeout,
)
from tests.airflow_home import DAG_TEST_HELPERS, airflow_home
from tests.conftest import ROOT

D1, D2, D3 = dt.date(2026, 1, 1), dt.date(2026, 1, 2), dt.date(2026, 1, 3)


def land(root: Path, day: dt.date, name: str = "part-00000.parquet") -> Path:
    """Write a file into ``day``'s training partition of ``products`` (the sensor reads
    names, never contents)."""
    folder = root / "datasets/products/train" / f"dt={day}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"PAR1")
    return path


def context(kind: str, start: dt.date | None = None, end: dt.date | None = None) -> dict:
    """A task's context as far as the sensor reads it: the run's type and data interval."""

    def utc(day: dt.date | None):
        return day and pendulum.datetime(day.year, day.month, day.day, tz="UTC")

    return {
        "dag_run": {"run_type": kind},
        "data_interval_start": utc(start),
        "data_interval_end": utc(end),
    }


SCHEDULED = context("scheduled", D2, D3)  # the run of 2026-01-03 00:00 trains on dt=2026-01-02
BACKFILL = context("backfill", D2, D3)
MANUAL = context("manual")  # the Trigger form without a logical date
MANUAL_DATED = context("manual", D2, D3)  # the form's default logical date: now


def sensor(root: Path | str, **kwargs) -> TrainingPartitionSensor:
    kwargs.setdefault("timeout", 30)
    kwargs.setdefault("poke_interval", 0.2)
    kwargs.setdefault("deferrable", True)
    return TrainingPartitionSensor(
        task_id="wait_for_partition", artifact_root=f"file://{root}", model="tiny", **kwargs
    )


def deferred(op: TrainingPartitionSensor, ctx: dict) -> TrainingPartitionTrigger:
    with pytest.raises(TaskDeferred) as info:
        op.execute(ctx)
    assert info.value.method_name == "execute_complete"
    trigger = info.value.trigger
    assert isinstance(trigger, TrainingPartitionTrigger)
    # What the triggerer rebuilds the trigger from.
    classpath, kwargs = trigger.serialize()
    assert classpath == "embedfresh.operators.partition.TrainingPartitionTrigger"
    return TrainingPartitionTrigger(**kwargs)


def fire(trigger: TrainingPartitionTrigger) -> dict:
    """Run the trigger to its first event, as the triggerer (or dag.test()) does."""
    return asyncio.run(anext(trigger.run())).payload


def logged(capsys, caplog) -> str:
    """What was logged: Airflow's structlog prints to stdout once it is configured (by
    the first task-like call in this process), stdlib logging reaches caplog before."""
    return capsys.readouterr().out + caplog.text


def land_later(root: Path, day: dt.date, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, land, (root, day))
    timer.start()
    return timer


# -- the settings: read at parse time, kept below the deadline ------------------------------


@pytest.mark.parametrize(
    ("deadline", "wait", "expected"),
    [
        ("", "", 4 * 3600),  # 6 h deadline, 2 h for the refresh's work
        ("3600", "", 1800),  # a short deadline: half of it
        ("", "600", 600),
        ("120", "30", 30),
    ],
)
def test_the_wait_comes_from_its_setting_and_stays_below_the_deadline(
    monkeypatch, deadline, wait, expected
):
    monkeypatch.setenv(DEADLINE_ENV, deadline)
    monkeypatch.setenv(PARTITION_WAIT_ENV, wait)
    assert partition_wait_timeout().total_seconds() == expected
    assert sensor("/r", timeout=None).timeout == expected


@pytest.mark.parametrize(
    ("deadline", "wait", "error"),
    [
        ("", "soon", "must be a positive number of seconds, got 'soon'"),
        ("", "-5", "must be a positive number"),
        ("", "nan", "must be a positive number"),
        ("", "0", "must be a positive number"),
        ("", str(6 * 3600), "must be below the refresh's deadline"),
        ("600", "900", f"must be below the refresh's deadline \\({DEADLINE_ENV}: 600 s\\)"),
        ("later", "", f"{DEADLINE_ENV} must be a positive number"),
    ],
)
def test_bad_settings_fail_when_the_dag_file_is_parsed(monkeypatch, deadline, wait, error):
    monkeypatch.setenv(DEADLINE_ENV, deadline)
    monkeypatch.setenv(PARTITION_WAIT_ENV, wait)
    with pytest.raises(ValueError, match=error):
        sensor("/r", timeout=None)


def test_bad_arguments_fail_when_the_dag_file_is_parsed():
    with pytest.raises(ValueError, match="timeout must be a positive wait"):
        sensor("/r", timeout=0)
    with pytest.raises(ValueError, match="poke_interval must be positive"):
        sensor("/r", poke_interval=0)


def test_deferrable_follows_airflows_setting_and_polling_frees_the_slot(monkeypatch):
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "true")
    assert sensor("/r", deferrable=None).deferrable is True
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "false")
    op = sensor("/r", deferrable=None)
    assert op.deferrable is False and op.mode == "reschedule"
    assert sensor("/r", deferrable=False, mode="poke").mode == "poke"


# -- which partition: the train task's rule -------------------------------------------------


@pytest.mark.parametrize(
    ("day", "ctx", "start", "end"),
    [
        ("", SCHEDULED, "2026-01-02", "2026-01-03"),  # its data interval's day
        ("", BACKFILL, "2026-01-02", "2026-01-03"),
        ("2026-01-03", SCHEDULED, "2026-01-03", "2026-01-04"),  # a given day wins
        ("2026-01-03", MANUAL, "2026-01-03", "2026-01-04"),
        ("2026-01-03", MANUAL_DATED, "2026-01-03", "2026-01-04"),
        ("", MANUAL_DATED, None, None),  # a manual run never uses its interval
        (None, MANUAL, None, None),  # the newest partition
    ],
)
def test_the_sensor_waits_for_the_partition_the_train_task_reads(tmp_path, day, ctx, start, end):
    from embedfresh.operators import IncrementalTrainingOperator

    trigger = deferred(sensor(tmp_path, day=day, manual_runs="wait"), ctx)
    assert (trigger.start, trigger.end) == (start, end)
    # ...the very days the train task hands its job.
    train = IncrementalTrainingOperator(
        task_id="train", artifact_root="file:///r", model="tiny", day=day
    )
    train.use_run_context(ctx)
    settings = train.build_job_spec().settings
    assert (settings.get("data_interval_start"), settings.get("data_interval_end")) == (start, end)


def test_every_day_of_an_interval_must_land(tmp_path):
    land(tmp_path, D1)
    op = sensor(tmp_path, data_interval_start="2026-01-01", data_interval_end="2026-01-03")
    trigger = deferred(op, SCHEDULED)
    assert trigger.waiting_for == (
        f"training partition file://{tmp_path}/datasets/products/train/dt=2026-01-02 "
        "(a .parquet file)"
    )
    land(tmp_path, D2)
    assert op.execute(SCHEDULED) == "2026-01-01"  # the interval's first day


@pytest.mark.parametrize("bad", ["2026-1-3", "yesterday", "2026-02-30"])
def test_a_day_that_is_not_a_date_fails_for_good(tmp_path, bad):
    with pytest.raises(AirflowFailException, match="day must be a date YYYY-MM-DD"):
        sensor(tmp_path, day=bad).execute(MANUAL)


def test_the_root_defaults_to_the_jobs_setting_and_a_connection_reaches_the_trigger(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("EMBEDFRESH_ARTIFACT_ROOT", f"file://{tmp_path}")
    op = TrainingPartitionSensor(
        task_id="w", model="tiny", aws_conn_id="aws_data", timeout=5, deferrable=True
    )
    assert op.artifact_root == f"file://{tmp_path}"
    trigger = deferred(op, SCHEDULED)  # a file:// root: the connection is not used
    assert (trigger.artifact_root, trigger.aws_conn_id) == (f"file://{tmp_path}", "aws_data")


def test_a_store_that_is_not_usable_fails_for_good():
    op = TrainingPartitionSensor(
        task_id="w", artifact_root="s3:///no-bucket", model="tiny", timeout=5, deferrable=True
    )
    with pytest.raises(AirflowFailException, match="names no bucket"):
        op.execute(SCHEDULED)


# -- already there: at once, no deferral -----------------------------------------------------


def test_a_partition_already_there_succeeds_at_once_without_deferring(tmp_path, capsys):
    land(tmp_path, D2)
    assert sensor(tmp_path).execute(SCHEDULED) == "2026-01-02"  # no TaskDeferred
    # The operator's log (structlog, to stdout outside a task run).
    assert "training partition dt=2026-01-02 is in the store" in capsys.readouterr().out


def test_a_folder_without_data_does_not_count(tmp_path):
    land(tmp_path, D2, name="part-00000.parquet.tmp")  # a writer still at work
    trigger = deferred(sensor(tmp_path), SCHEDULED)
    assert trigger.waiting_for.endswith("dt=2026-01-02 (a .parquet file)")
    assert trigger.holds == "it holds dt=2026-01-02"  # the folder is there, its data not


def test_a_producers_marker_is_waited_for_when_named(tmp_path):
    land(tmp_path, D2)
    op = sensor(tmp_path, marker="_SUCCESS")
    assert deferred(op, SCHEDULED).waiting_for.endswith("dt=2026-01-02 (_SUCCESS)")
    land(tmp_path, D2, name="_SUCCESS")
    assert op.execute(SCHEDULED) == "2026-01-02"


# -- a manual run without day: the newest partition ------------------------------------------


def test_a_manual_run_without_day_succeeds_at_once_on_the_newest_partition(tmp_path):
    land(tmp_path, D1)
    land(tmp_path, D3)
    assert sensor(tmp_path, day="").execute(MANUAL) == "2026-01-03"


def test_a_manual_run_does_not_wait_it_fails_at_once_naming_what_the_store_holds(tmp_path):
    land(tmp_path, D1)
    land(tmp_path, D3)
    with pytest.raises(AirflowFailException) as info:
        sensor(tmp_path, day="2026-03-01").execute(MANUAL)
    url = f"file://{tmp_path}/datasets/products/train/dt=2026-03-01"
    assert f"missing training partition {url} (a .parquet file)" in str(info.value)
    assert "it holds dt=2026-01-01, dt=2026-01-03. A manual run does not wait" in str(info.value)
    with pytest.raises(AirflowFailException, match="a first training partition"):
        sensor(tmp_path / "empty", day="").execute(MANUAL)
    with pytest.raises(ValueError, match="manual_runs"):
        sensor(tmp_path, manual_runs="sometimes")


def test_a_manual_run_without_day_waits_for_the_first_partition(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO)
    trigger = deferred(sensor(tmp_path, day="", manual_runs="wait"), MANUAL)
    assert trigger.waiting_for == (
        f"a first training partition under file://{tmp_path}/datasets/products/train/"
    )
    assert trigger.holds == "it holds none"
    land_later(tmp_path, D3, 0.6)
    event = fire(trigger)
    assert event["status"] == "landed" and event["day"] == "2026-01-03", event
    assert "waiting for a first training partition under" in logged(capsys, caplog)


def test_a_manual_run_waits_for_the_newest_folder_the_train_job_would_pick(tmp_path):
    land(tmp_path, D1)
    (tmp_path / "datasets/products/train/dt=2026-01-02").mkdir()  # being written
    trigger = deferred(sensor(tmp_path, day="", manual_runs="wait"), MANUAL)
    assert trigger.waiting_for.endswith("dt=2026-01-02 (a .parquet file)")
    assert trigger.holds == "it holds dt=2026-01-01, dt=2026-01-02"


# -- the trigger: polls, logs, fires ---------------------------------------------------------


def test_the_trigger_waits_logging_then_fires_when_the_partition_lands(tmp_path, capsys, caplog):
    land(tmp_path, D1)
    caplog.set_level(logging.INFO)
    op = sensor(tmp_path, poke_interval=0.3)
    trigger = deferred(op, SCHEDULED)
    land_later(tmp_path, D2, 1.0)
    started = time.monotonic()
    event = fire(trigger)
    assert time.monotonic() - started >= 0.9  # it waited for the write
    assert event["status"] == "landed" and event["day"] == "2026-01-02", event
    url = f"file://{tmp_path}/datasets/products/train/dt=2026-01-02"
    text = logged(capsys, caplog)
    assert f"waiting for training partition {url} (a .parquet file)" in text
    assert "it holds dt=2026-01-01" in text
    assert "training partition dt=2026-01-02 landed after" in text
    assert op.execute_complete(SCHEDULED, event) == "2026-01-02"


def test_the_trigger_logs_at_least_every_interval_while_it_waits(
    tmp_path, capsys, caplog, monkeypatch
):
    monkeypatch.setattr(partition, "LOG_EVERY_SECONDS", 0.4)
    caplog.set_level(logging.INFO)
    trigger = deferred(sensor(tmp_path, timeout=1.5, poke_interval=600), SCHEDULED)
    assert fire(trigger)["status"] == "timeout"
    text = logged(capsys, caplog)
    still = [line for line in text.splitlines() if "still waiting for" in line]
    assert len(still) >= 2, text
    assert "dt=2026-01-02" in still[-1] and "it holds none" in still[-1]


def test_the_trigger_keeps_waiting_through_a_store_outage(tmp_path, monkeypatch, capsys, caplog):
    from embedfresh.core.exit_codes import TransientError

    real, calls = partition.check_partition, []

    def flaky(*args):
        calls.append(args)
        if len(calls) == 1:
            raise TransientError("artifact store unreachable: connection reset")
        return real(*args)

    land(tmp_path, D2)
    trigger = TrainingPartitionTrigger(
        artifact_root=f"file://{tmp_path}", dataset="products", start="2026-01-02",
        end=None, marker=None, poke_interval=0.1, wait_until=time.time() + 10,
        started_at=time.time(),
    )  # fmt: skip
    monkeypatch.setattr(partition, "check_partition", flaky)
    assert fire(trigger)["status"] == "landed" and len(calls) == 2
    assert "the store is unreachable, looking again later" in logged(capsys, caplog)


# -- the timeout: fails for good, naming the partition and what the store holds -------------


def test_when_the_timeout_passes_the_sensor_fails_for_good_naming_the_partition(tmp_path):
    land(tmp_path, D1)
    op = sensor(tmp_path, timeout=0.8, retries=3)
    event = fire(deferred(op, SCHEDULED))
    assert event["status"] == "timeout", event
    with pytest.raises(AirflowSensorTimeout) as info:  # the task runner never retries it
        op.execute_complete(SCHEDULED, event)
    message = str(info.value)
    assert message.startswith(
        f"training partition file://{tmp_path}/datasets/products/train/dt=2026-01-02 "
        "(a .parquet file) did not land within the sensor's timeout of 1 s"
    )
    assert f"file://{tmp_path}: it holds dt=2026-01-01" in message


def test_without_deferral_the_sensor_polls_and_times_out_the_same_way(tmp_path):
    land(tmp_path, D1)
    op = sensor(tmp_path, deferrable=False, mode="poke", timeout=0.5, poke_interval=0.1)
    assert not op.poke(SCHEDULED)
    with pytest.raises(AirflowSensorTimeout, match=r"dt=2026-01-02 \(a .parquet file\) did not"):
        op.execute(SCHEDULED)
    land(tmp_path, D2)
    assert op.execute(SCHEDULED) == "2026-01-02"


# -- a real run: dag.test() runs the deferred trigger inline ---------------------------------

WAIT_DAG = """
import datetime as dt
from airflow.sdk import DAG
from embedfresh.operators.params import DAY_ARG, artifact_root_param, day_param
from embedfresh.operators.partition import TrainingPartitionSensor

for dag_id, timeout in (("partition_lands", 60), ("partition_never_lands", None)):
    with DAG(dag_id, schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
             params={"artifact_root": artifact_root_param(), "day": day_param()},
             default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=0)}):
        TrainingPartitionSensor(
            task_id="wait_for_partition", artifact_root="{{ params.artifact_root }}",
            model="tiny", **DAY_ARG, timeout=timeout, poke_interval=0.5, deferrable=True,
            manual_runs="wait",  # dag.test() makes manual runs
        )
"""

RUN_WAIT_DAG = (
    DAG_TEST_HELPERS
    + r"""
import os, threading, time
from pathlib import Path
from airflow.dag_processing.dagbag import DagBag

folder, store = sys.argv[1], Path(sys.argv[2])

def land():
    part = store / "datasets/products/train/dt=2026-01-03/part-00000.parquet"
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(b"PAR1")

# The partition lands 2 s into the first run's wait (timed from its trigger's start: a
# task's first start-up in this interpreter takes 10 s or more on a loaded box).
from embedfresh.operators import partition
wait = partition.TrainingPartitionTrigger.run
timers = []

async def run_landing_later(self):
    if not timers:
        timers.append(threading.Timer(2.0, land))
        timers[0].start()
    async for event in wait(self):
        yield event

partition.TrainingPartitionTrigger.run = run_landing_later
got = {}
for dag_id, day in (("partition_lands", "2026-01-03"), ("partition_never_lands", "2026-01-09")):
    started = time.monotonic()
    run = load_dag(folder, dag_id).test(logical_date=None, run_conf={"day": day})
    facts = run_facts(run, ["wait_for_partition"])
    with create_session() as session:
        ti = session.scalars(select(TaskInstance).where(TaskInstance.run_id == run.run_id)).one()
        facts["try_number"] = ti.try_number
    facts["seconds"] = time.monotonic() - started
    got[dag_id] = facts

# A wait that is not below the refresh's deadline: an import error of the DAG file.
os.environ["EMBEDFRESH_PARTITION_WAIT_SECONDS"] = str(7 * 3600)
got["import_errors"] = list(DagBag(dag_folder=folder).import_errors.values())
print(json.dumps(got))
"""
)


@pytest.mark.slow
def test_a_run_waits_for_its_partition_then_succeeds_or_times_out(tmp_path: Path):
    dags, store = tmp_path / "dags", tmp_path / "store"
    dags.mkdir()
    (dags / "partition_wait.py").write_text(WAIT_DAG)
    land(store, D1)
    env = airflow_home(tmp_path / "airflow-home", f"file://{store}")
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    env[PARTITION_WAIT_ENV] = "2"  # the second DAG's timeout, read at parse time
    done = subprocess.run(
        [sys.executable, "-c", RUN_WAIT_DAG, str(dags), str(store)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    output = done.stdout + done.stderr  # whole: the waiting lines come early
    (tmp_path / "output.txt").write_text(output)  # kept for a look after a failure
    assert done.returncode == 0, output[-6000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])

    lands = got["partition_lands"]
    assert lands["state"] == "success", output[-6000:]
    assert lands["xcom"]["wait_for_partition"] == "2026-01-03", output[-6000:]
    assert lands["seconds"] >= 2, lands  # it waited for the write
    url = f"file://{store}/datasets/products/train"
    assert f"waiting for training partition {url}/dt=2026-01-03 (a .parquet file)" in output
    assert "it holds dt=2026-01-01" in output
    assert "[DAG TEST] running trigger in line" in output  # it deferred
    assert "training partition dt=2026-01-03 landed after" in output

    never = got["partition_never_lands"]
    assert never["state"] == "failed", output[-6000:]
    assert never["tasks"] == [["wait_for_partition", -1, "failed"]], never
    assert never["try_number"] == 1, never  # retries=2, none spent
    assert (
        f"training partition {url}/dt=2026-01-09 (a .parquet file) did not land within "
        "the sensor's timeout of 2 s"
    ) in output
    assert "it holds dt=2026-01-01, dt=2026-01-03" in output

    (error,) = got["import_errors"]
    assert f"{PARTITION_WAIT_ENV}=25200 must be below the refresh's deadline" in error
