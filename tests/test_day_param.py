"""The ``day`` a run trains on, and template errors that fail at once.

A manual run (the Trigger form, a REST trigger, ``dag.test()``) never trains on its data
interval, whatever its logical date (the form sends *now*): an empty ``day`` Param (None,
the form's default, or "") means the newest ``dt=`` partition in the store, looked up by
the job when it starts; a given day must be ``YYYY-MM-DD`` and be there. Scheduled and
backfill runs train on their data interval. A template that does not render fails the
task without spending its retries.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.sdk.api.datamodels._generated import DagRun, DagRunState, DagRunType
from airflow.sdk.exceptions import AirflowFailException

from embedfresh.core.config import CompileConfig, TrainConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.operators import (
    AheadOfTimeCompileOperator,
    BackendParityOperator,
    CorporaOperator,
    CorpusShardsOperator,
    IncrementalTrainingOperator,
)
from embedfresh.operators.params import (
    DAY_ARG,
    day_param,
    parse_day,
    run_data_interval,
    run_type,
)
from tests.airflow_home import DAG_TEST_HELPERS, airflow_home, run_in_airflow
from tests.conftest import run_job

DAY1, DAY2 = dt.date(2026, 1, 1), dt.date(2026, 1, 2)
WHERE = "file:///store/datasets/products/train"


# -- the config: which days a job trains on -----------------------------------------------


def test_no_day_means_the_newest_partition():
    cfg = TrainConfig(artifact_root="file:///store").with_day([DAY2, DAY1], WHERE)
    assert (cfg.data_interval_start, cfg.interval_end) == (DAY2, DAY2 + dt.timedelta(days=1))
    assert CompileConfig().with_day([DAY1], WHERE).data_interval_start == DAY1


def test_a_given_day_is_kept_when_the_store_holds_it():
    cfg = TrainConfig(data_interval_start=DAY1)
    assert cfg.with_day([DAY1, DAY2], WHERE) == cfg


@pytest.mark.parametrize(
    ("held", "shown"),
    [
        ([DAY1, DAY2], "it holds dt=2026-01-01, dt=2026-01-02"),
        ([], "it holds none"),
        (
            [DAY1 + dt.timedelta(days=i) for i in range(10)],
            "it holds 10: dt=2026-01-01, dt=2026-01-02, dt=2026-01-03, ..., dt=2026-01-08, "
            "dt=2026-01-09, dt=2026-01-10",
        ),
    ],
)
def test_a_missing_day_is_refused_in_one_line_naming_what_is_there(held, shown):
    cfg = TrainConfig(data_interval_start=dt.date(2026, 3, 1))
    with pytest.raises(BadInputError) as info:
        cfg.with_day(held, WHERE)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"missing training partition dt=2026-03-01 under {WHERE}: ")
    assert shown in message


def test_every_day_of_an_interval_must_be_there():
    cfg = TrainConfig(data_interval_start=DAY1, data_interval_end=DAY1 + dt.timedelta(days=3))
    with pytest.raises(BadInputError, match="missing training partition dt=2026-01-03"):
        cfg.with_day([DAY1, DAY2], WHERE)


def test_an_empty_store_is_refused_naming_the_command_that_fills_it():
    with pytest.raises(BadInputError, match=r"no training partition under .*generate_data"):
        TrainConfig().with_day([], WHERE)


def test_an_interval_needs_its_start_and_an_unsettled_one_has_no_end():
    with pytest.raises(ValueError, match="data_interval_end needs data_interval_start"):
        TrainConfig(data_interval_end=DAY2)
    with pytest.raises(ValueError, match="empty data interval"):
        TrainConfig(data_interval_start=DAY2, data_interval_end=DAY1)
    with pytest.raises(ValueError, match="not settled"):
        _ = TrainConfig().interval_end


# -- the train job: the newest partition, read when it starts ------------------------------


@pytest.mark.slow
def test_the_train_job_without_a_day_trains_on_the_newest_partition(root: str):
    done = run_job("train", f"artifact_root={root}", "run_id=newest", "epochs=1", "max_steps=2")
    assert done.returncode == 0, done.stderr[-3000:]
    report = Path(root.removeprefix("file://")) / "runs/tiny/newest/reports/train.json"
    assert json.loads(report.read_text())["data_interval"] == ["2026-01-02", "2026-01-03"]


def test_the_train_job_refuses_a_missing_day_before_anything_else(root: str):
    done = run_job(
        "train", f"artifact_root={root}", "run_id=missing", "data_interval_start=2026-03-01"
    )
    assert done.returncode == 2, done.stderr[-3000:]
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("train: error:")]
    assert "missing training partition dt=2026-03-01" in error
    assert "it holds dt=2026-01-01, dt=2026-01-02" in error
    assert not (Path(root.removeprefix("file://")) / "runs").exists()


# -- the operators: which days they hand the job -------------------------------------------


def _utc(day: dt.date) -> pendulum.DateTime:
    return pendulum.datetime(day.year, day.month, day.day, tz="UTC")


def _context(kind: DagRunType | None, start: dt.date | None, end: dt.date | None) -> dict:
    """A task's context as the task runner builds it: the run (the SDK's own model) and
    its data interval; ``kind`` None: no run at all (a task called outside a run)."""
    interval = {
        "data_interval_start": start and _utc(start),
        "data_interval_end": end and _utc(end),
    }
    if kind is None:
        return interval
    run = DagRun(
        dag_id="d",
        run_id=f"{kind.value}__x",
        logical_date=interval["data_interval_end"],
        run_after=interval["data_interval_end"] or _utc(DAY2),
        start_date=None,
        end_date=None,
        run_type=kind,
        state=DagRunState.RUNNING,
        consumed_asset_events=[],
        partition_key=None,
        **interval,
    )
    return {"dag_run": run, **interval}


SCHEDULED = _context(DagRunType.SCHEDULED, DAY1, DAY2)  # the run of 2026-01-02 00:00
BACKFILL = _context(DagRunType.BACKFILL, DAY1, DAY2)
# A manual run given a logical date (the Trigger form's default: now) has the interval
# that ends there; one without logical date (a REST trigger) has none.
MANUAL_DATED = _context(DagRunType.MANUAL, DAY1, DAY2)
MANUAL = _context(DagRunType.MANUAL, None, None)
EMPTY = _context(DagRunType.SCHEDULED, DAY2, DAY2)  # start == end (a trigger timetable)
NO_RUN = _context(None, DAY1, DAY2)  # called outside a run: its interval, if any


@pytest.mark.parametrize(
    ("day", "context", "expected"),
    [
        ("", SCHEDULED, ("2026-01-01", "2026-01-02")),  # a scheduled run: its data interval
        ("", BACKFILL, ("2026-01-01", "2026-01-02")),  # so does a backfill run
        ("", NO_RUN, ("2026-01-01", "2026-01-02")),
        ("", MANUAL, None),  # the job picks the newest partition
        ("", MANUAL_DATED, None),  # whatever the manual run's logical date
        (None, MANUAL_DATED, None),
        ("", EMPTY, None),
        ("2026-01-02", SCHEDULED, ("2026-01-02", "2026-01-03")),  # a named day wins
        ("2026-01-02", MANUAL, ("2026-01-02", "2026-01-03")),
        ("2026-01-01", MANUAL_DATED, ("2026-01-01", "2026-01-02")),
    ],
)
@pytest.mark.parametrize(
    "operator", [IncrementalTrainingOperator, AheadOfTimeCompileOperator, BackendParityOperator]
)
def test_the_day_a_job_gets(operator, day, context, expected):
    extra = {"init_version": "v0"} if operator is BackendParityOperator else {}
    op = operator(
        task_id="t", model="tiny", artifact_root="file:///r", run_id="r1", day=day, **extra
    )
    op.use_run_context(context)
    settings = op.build_job_spec().settings
    got = settings.get("data_interval_start"), settings.get("data_interval_end")
    assert got == (expected or (None, None))


@pytest.mark.parametrize("context", [SCHEDULED, MANUAL_DATED, MANUAL])
def test_explicit_interval_arguments_win_over_day_and_run(context):
    op = IncrementalTrainingOperator(
        task_id="t", model="tiny", artifact_root="file:///r", day="2026-01-05",
        data_interval_start="2026-01-01", data_interval_end="2026-01-03",
    )  # fmt: skip
    op.use_run_context(context)
    settings = op.build_job_spec().settings
    assert (settings["data_interval_start"], settings["data_interval_end"]) == (
        "2026-01-01",
        "2026-01-03",
    )


def test_the_run_type_is_read_from_the_run_in_the_context():
    assert run_type(MANUAL) == "manual" and run_type(SCHEDULED) == "scheduled"
    assert run_type(BACKFILL) == "backfill" and run_type(NO_RUN) is None
    assert run_type({"dag_run": {"run_type": "manual"}}) == "manual"
    assert run_data_interval(MANUAL_DATED) is None
    assert run_data_interval(SCHEDULED) == (DAY1, DAY2)


@pytest.mark.parametrize("bad", ["2026-1-3", "20260103", "2026-02-30", "yesterday", " "])
def test_a_day_that_is_not_a_date_fails_the_task_for_good(bad):
    op = IncrementalTrainingOperator(task_id="t", model="tiny", artifact_root="file:///r", day=bad)
    with pytest.raises(AirflowFailException, match="day must be a date YYYY-MM-DD"):
        op.build_job_spec()
    assert parse_day("2026-01-03") == dt.date(2026, 1, 3) and parse_day("") is None


def test_the_day_param_takes_a_date_or_nothing():
    param = day_param()
    # None by default: the Trigger form submits an empty nullable field; "" (REST) too.
    assert param.resolve() is None and param.resolve(None) is None
    assert param.resolve("") == "" and param.resolve("2026-01-03") == "2026-01-03"
    assert param.schema["type"] == ["null", "string"]
    with pytest.raises(Exception, match="2026-1-3"):
        param.resolve("2026-1-3")


@pytest.mark.parametrize(
    ("value", "rendered"), [(None, ""), ("", ""), ("2026-01-03", "2026-01-03")]
)
def test_the_day_arg_renders_an_empty_param_as_empty_never_none(value, rendered):
    with DAG("d", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) as dag:
        op = IncrementalTrainingOperator(
            task_id="train", artifact_root="file:///r", model="tiny", **DAY_ARG
        )
    op.render_template_fields({"params": {"day": value}, "run_id": "r"}, dag.get_template_env())
    assert op.day == rendered
    op.use_run_context(MANUAL)
    assert op.build_job_spec().settings.get("data_interval_start") == (rendered or None)


# A real task run: what the training operator of a DAG with the day Param hands its job,
# read in a task of ``dag.test()`` runs (manual runs) dated 2026-01-02 00:00, whose data
# interval is [2026-01-01, 2026-01-02): without a day, nothing (the newest partition);
# with one, that day.
DAY_DAG = """
import datetime as dt
from airflow.sdk import DAG, CronDataIntervalTimetable
from embedfresh.operators import IncrementalTrainingOperator
from embedfresh.operators.params import DAY_ARG, day_param

class WhatTheJobGets(IncrementalTrainingOperator):
    def execute(self, context):
        self.use_run_context(context)
        settings = self.build_job_spec().settings
        return {"run_type": str(context["dag_run"].run_type.value),
                "interval": [str(context["data_interval_start"]), str(context["data_interval_end"])],
                "start": settings.get("data_interval_start"), "end": settings.get("data_interval_end")}

with DAG("day_rule", schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
         start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), catchup=False,
         params={"day": day_param()}):
    WhatTheJobGets(task_id="train", artifact_root="file:///r", model="tiny", **DAY_ARG)
"""

RUN_DAY_DAG = (
    DAG_TEST_HELPERS
    + r"""
dag = load_dag(sys.argv[1], "day_rule")
got = []
for hour, conf in ((0, {}), (1, {"day": "2026-01-01"})):
    run = dag.test(logical_date=dt.datetime(2026, 1, 2, hour, tzinfo=dt.UTC), run_conf=conf)
    facts = run_facts(run, ["train"])
    assert facts["state"] == "success", facts
    got.append(facts["xcom"]["train"])
print(json.dumps(got))
"""
)


@pytest.mark.slow
def test_a_manual_run_trains_on_its_day_or_the_newest_never_its_interval(tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "day_rule.py").write_text(DAY_DAG)
    env = airflow_home(tmp_path / "airflow-home", f"file://{tmp_path / 'store'}")
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    (no_day, given), output = run_in_airflow(RUN_DAY_DAG, env, str(dags), timeout=300)
    assert no_day["run_type"] == given["run_type"] == "manual", output
    assert no_day["interval"][0].startswith("2026-01-01"), no_day  # it has an interval...
    assert (no_day["start"], no_day["end"]) == (None, None), no_day  # ...and ignores it
    assert (given["start"], given["end"]) == ("2026-01-01", "2026-01-02"), given


def test_a_data_interval_is_read_in_utc_days():
    start = pendulum.datetime(2026, 1, 1, 23, 0, tz="America/New_York")  # 04:00 UTC next day
    assert run_data_interval(
        {"data_interval_start": start, "data_interval_end": start.add(days=1)}
    ) == (DAY2, dt.date(2026, 1, 3))
    assert run_data_interval({"data_interval_start": None, "data_interval_end": None}) is None


# -- template errors: fail at once, no retry -----------------------------------------------


@pytest.mark.parametrize(
    "template",
    ["{{ data_interval_start | ds }}", "{{ params.no_such_param }}", "{% if %}", "{{ 1 + 'a' }}"],
)
def test_a_template_that_does_not_render_fails_without_retry(template):
    with DAG("d", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) as dag:
        op = IncrementalTrainingOperator(
            task_id="train", model="tiny", artifact_root=template, retries=3
        )
    context = {"params": {}, "run_id": "manual__x"}  # a manual run: no data interval
    with pytest.raises(AirflowFailException, match="task train: a template of .* not retrying"):
        op.render_template_fields(context, dag.get_template_env())
    shards = CorpusShardsOperator(task_id="shards", artifact_root="file:///r", corpus=template)
    with pytest.raises(AirflowFailException, match="task shards"):
        shards.render_template_fields(context, dag.get_template_env())
    corpora = CorporaOperator(task_id="corpora", artifact_root="file:///r", corpora=template)
    with pytest.raises(AirflowFailException, match="task corpora: a template of .* not retrying"):
        corpora.render_template_fields(context, dag.get_template_env())


def test_a_template_that_renders_is_untouched():
    with DAG("d", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) as dag:
        op = IncrementalTrainingOperator(
            task_id="train", model="tiny", artifact_root="{{ params.root }}", day="{{ params.day }}"
        )
    context = {"params": {"root": "file:///r", "day": ""}, "run_id": "manual__x"}
    op.render_template_fields(context, dag.get_template_env())
    assert (op.artifact_root, op.day, op.run_id) == ("file:///r", "", "manual__x")


# A real task run (dag.test(), the task runner's own failure handling): a manual run with
# no logical date renders ``data_interval_start`` in a plain and in a mapped task, both
# with retries; each fails on its first try and is not retried.
TEMPLATE_ERROR_DAG = """
import datetime as dt
from airflow.sdk import DAG
from embedfresh.operators import ShardEmbeddingOperator, EvaluationOperator

with DAG("template_errors", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
         default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=0)}):
    EvaluationOperator(task_id="plain", model="tiny", artifact_root="{{ data_interval_start | ds }}")
    ShardEmbeddingOperator.partial(
        task_id="mapped", model="tiny", corpus="products", artifact_root="file:///r",
        version="{{ data_interval_start | ds }}",
    ).expand(shards=[[0], [1]])
"""

RUN_TEMPLATE_ERROR_DAG = (
    DAG_TEST_HELPERS
    + r"""
dag = load_dag(sys.argv[1], "template_errors")
run = dag.test(logical_date=None)
with create_session() as session:
    tis = session.scalars(select(TaskInstance).where(TaskInstance.run_id == run.run_id)).all()
    print(json.dumps({"state": str(run.state),
                      "tis": sorted([t.task_id, t.map_index, str(t.state), t.try_number] for t in tis)}))
"""
)


@pytest.mark.slow
def test_template_errors_fail_the_first_try_of_a_real_task_run(tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "template_errors.py").write_text(TEMPLATE_ERROR_DAG)
    env = airflow_home(tmp_path / "airflow-home", f"file://{tmp_path / 'store'}")
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)  # dag.test() syncs the DAG's own bundle
    facts, output = run_in_airflow(RUN_TEMPLATE_ERROR_DAG, env, str(dags), timeout=300)
    assert facts["state"] == "failed", output
    assert facts["tis"] == [
        ["mapped", 0, "failed", 1],
        ["mapped", 1, "failed", 1],
        ["plain", -1, "failed", 1],
    ], output
    assert "not retrying" in output and "data_interval_start" in output
