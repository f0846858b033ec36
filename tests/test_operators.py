"""The operators and the local runner, on real processes.

The only stand-in is the job: ``ScriptJobRunner`` runs a small program built like every
job (through :func:`embedfresh.core.cli.run_job`, so it writes its result record on
success) whose work is the task's ``code``, instead of ``python -m
embedfresh.jobs.<job>``, so every exit code and failure mode is cheap to produce;
streaming, the exit-code mapping, result records, environment and kill are the real
code. ``ScriptRunner`` runs bare ``python -c`` code for the runner's own tests.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import textwrap
import threading
import time
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG, AssetAlias
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from embedfresh.core.config import (
    GarbageCollectConfig,
    IndexLoadConfig,
    ReleaseConfig,
    RollbackConfig,
    SearchCheckConfig,
    parse_override,
)
from embedfresh.core.results import ResultTicket
from embedfresh.core.settings import INDEX_DSN_ENV
from embedfresh.operators import (
    EMBEDDING_PUBLICATIONS_ALIAS,
    MODEL_PROMOTIONS_ALIAS,
    AcceleratorHealthOperator,
    AheadOfTimeCompileOperator,
    EmbedfreshJobOperator,
    EvaluationOperator,
    GarbageCollectOperator,
    IncrementalTrainingOperator,
    IndexLoadOperator,
    JobSpec,
    LocalRunner,
    QualityGateOperator,
    ReleaseOperator,
    RollbackOperator,
    SearchCheckOperator,
    embeddings_asset,
    model_asset,
)
from embedfresh.operators.deadline import DEADLINE_ENV, deadline_interval, record_deadline_breach
from tests.conftest import ROOT

PY = "/usr/bin/python3"


# --- JobSpec ------------------------------------------------------------------------


def test_argv_runs_the_job_module_with_one_set_per_setting():
    spec = JobSpec("train", {"artifact_root": "file:///a b", "epochs": 3, "run_id": "r1"})
    assert spec.argv(PY) == [
        PY, "-m", "embedfresh.jobs.train",
        "--set", "artifact_root=file:///a b",
        "--set", "epochs=3",
        "--set", "run_id=r1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "value",
    ["r1", "manual__2026-01-01T00:00:00+00:00", "123", "true", "null", "", 3, 0.001, True,
     None, ["accuracy", "auc"], {"a": [1, "x"]}, "2026-01-01", '{"not": "a dict"}'],
)  # fmt: skip
def test_every_setting_round_trips_through_the_jobs_parser(value: Any):
    [_, item] = JobSpec("gate", {"key": value}).job_args()
    assert parse_override(item) == ("key", value)


def test_plain_strings_stay_readable_and_json_lookalikes_are_quoted():
    args = JobSpec("gate", {"a": "file:///x", "b": "123", "c": "no_regression"}).job_args()
    assert args[1::2] == ["a=file:///x", 'b="123"', "c=no_regression"]


def test_data_parallel_launches_under_torchrun():
    spec = JobSpec("train", {"run_id": "r1"}, nproc_per_node=4)
    assert spec.argv(PY) == [
        PY, "-m", "embedfresh.jobs.launch", "--standalone", "--nproc-per-node", "4",
        "-m", "embedfresh.jobs.train", "--set", "run_id=r1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "kwargs", [{"job": ""}, {"job": "../x"}, {"job": "train", "nproc_per_node": 0}]
)
def test_invalid_specs_are_refused(kwargs: dict):
    with pytest.raises(ValueError):
        JobSpec(**kwargs)


def test_operators_build_their_jobs_settings():
    common = dict(artifact_root="file:///r", run_id="r1", model="minilm", backend="cuda")
    train = IncrementalTrainingOperator(
        task_id="t", **common, data_interval_start="2026-01-01", data_interval_end="2026-01-02",
        epochs="3", job_settings={"max_steps": 5}, env={"OMP_NUM_THREADS": "2"},
    )  # fmt: skip
    spec = train.build_job_spec()
    assert spec.job == "train" and spec.env == {"OMP_NUM_THREADS": "2"}
    assert dict(spec.settings) == {
        "artifact_root": "file:///r", "model": "minilm", "backend": "cuda", "run_id": "r1",
        "data_interval_start": "2026-01-01", "data_interval_end": "2026-01-02",
        "epochs": "3", "max_steps": 5,
    }  # fmt: skip
    gate = QualityGateOperator(task_id="g", **common, mode="parity", tolerance=0.002)
    assert gate.build_job_spec().settings["mode"] == "parity"
    assert gate.build_job_spec().settings["tolerance"] == 0.002
    assert "metrics" not in gate.build_job_spec().settings  # the job's own default
    # A rendered template (the refresh DAG's gate_metrics Param) is the list's JSON text;
    # the job gets the list, through the same --set parser as any other setting.
    rendered = QualityGateOperator(task_id="g", **common, metrics='["recall_at_10", "auc"]')
    assert rendered.build_job_spec().settings["metrics"] == ["recall_at_10", "auc"]
    item = next(a for a in rendered.build_job_spec().job_args() if a.startswith("metrics="))
    assert parse_override(item) == ("metrics", ["recall_at_10", "auc"])
    bad = QualityGateOperator(task_id="g", **common, metrics="recall_at_10, auc")
    with pytest.raises(AirflowFailException, match="metrics must be a list"):
        bad.build_job_spec()
    assert EvaluationOperator(task_id="e", **common).build_job_spec().job == "evaluate"
    # job_settings win over the operator's own, so any config field can be set.
    over = EvaluationOperator(task_id="e2", **common, job_settings={"run_id": "other"})
    assert over.build_job_spec().settings["run_id"] == "other"


def test_defaults_are_templates_and_dict_fields_render_as_json():
    op = IncrementalTrainingOperator(
        task_id="t", model="tiny", artifact_root="{{ params.artifact_root }}"
    )
    assert op.run_id == "{{ run_id }}"
    assert op.data_interval_start is None and op.day == ""
    assert op.template_fields_renderers == {
        "job_settings": "json",
        "env": "json",
        "runner_settings": "json",
        "check_inputs": "json",
    }
    with pytest.raises(ValueError, match="unknown execution_mode 'kubernetes'; registered: ") as e:
        EvaluationOperator(
            task_id="e", model="tiny", artifact_root="file:///r", execution_mode="kubernetes"
        )
    assert "aws_batch" in str(e.value) and "local" in str(e.value)
    with pytest.raises(ValueError, match="needs its runner settings, e.g. batch="):
        EvaluationOperator(
            task_id="e", model="tiny", artifact_root="file:///r", execution_mode="aws_batch"
        )


# --- the release side: index load, search check, release, rollback, garbage collection


def config_of(spec: JobSpec, config: type) -> Any:
    """What the job makes of ``spec``: its ``--set`` arguments parsed as the job parses
    them, into the job's own config (which refuses unknown or invalid settings)."""
    sets = spec.job_args()
    assert spec.result is None and sets[0::2] == ["--set"] * len(spec.settings)
    return config(**dict(parse_override(item) for item in sets[1::2]))


def test_release_side_operators_build_settings_their_jobs_accept():
    common = dict(artifact_root="file:///r", run_id="r1", model="minilm")
    release = ReleaseOperator(task_id="release", **common, corpora='["products", "docs"]')
    cfg = config_of(release.build_job_spec(), ReleaseConfig)
    assert (cfg.corpora, cfg.action, cfg.target_version) == (["products", "docs"], "promote", "r1")
    assert cfg.reason is None and "who" not in release.build_job_spec().settings
    anyway = ReleaseOperator(
        task_id="anyway", **common, corpora=("products",), version="v3",
        action="promote_anyway", reason="search fixed by hand", who="alice",
    )  # fmt: skip
    cfg = config_of(anyway.build_job_spec(), ReleaseConfig)
    assert (cfg.corpora, cfg.version, cfg.action, cfg.reason, cfg.who) == (
        ["products"], "v3", "promote_anyway", "search fixed by hand", "alice",
    )  # fmt: skip
    rollback = RollbackOperator(
        task_id="rollback", **common, release="rel-7", reason="recall dropped", who="bob"
    )
    cfg = config_of(rollback.build_job_spec(), RollbackConfig)
    assert (cfg.to_release, cfg.reason, cfg.who) == ("rel-7", "recall dropped", "bob")

    load = IndexLoadOperator(task_id="load", **common, corpus="docs")
    cfg = config_of(load.build_job_spec(), IndexLoadConfig)
    assert (cfg.corpus, cfg.version, cfg.target_version) == ("docs", None, "r1")
    check = SearchCheckOperator(
        task_id="check", **common, corpus="docs", version="v3", regression="report"
    )
    cfg = config_of(check.build_job_spec(), SearchCheckConfig)
    assert (cfg.corpus, cfg.target_version, cfg.regression) == ("docs", "v3", "report")
    gc = GarbageCollectOperator(task_id="gc", **common, grace_hours=6, dry_run=True)
    cfg = config_of(gc.build_job_spec(), GarbageCollectConfig)
    assert (cfg.grace_hours, cfg.dry_run) == (6.0, True)


def test_release_side_templates_render_from_the_runs_params_and_user():
    with DAG("d", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) as dag:
        release = ReleaseOperator(
            task_id="release", artifact_root="{{ params.root }}", model="{{ params.model }}",
            corpora="{{ params.corpora | tojson }}", action="{{ params.action }}",
            reason="{{ params.reason }}", drop_corpora="{{ params.drop_corpora | tojson }}",
        )  # fmt: skip
        rollback = RollbackOperator(
            task_id="rollback", artifact_root="{{ params.root }}", model="{{ params.model }}",
            release="{{ params.release }}", reason="{{ params.reason }}",
        )  # fmt: skip
        check = SearchCheckOperator(
            task_id="check", model="tiny", artifact_root="{{ params.root }}",
            corpus="{{ params.corpus }}", regression="{{ params.regression }}",
        )  # fmt: skip
    params = {
        "root": "file:///r", "model": "minilm", "corpora": ["products", "docs"],
        "action": "promote_anyway", "reason": "recall fixed by hand", "release": "rel-7",
        "corpus": "docs", "regression": "report", "drop_corpora": ["faq"],
    }  # fmt: skip
    context = {
        "params": params,
        "run_id": "manual__1",
        "dag_run": SimpleNamespace(triggering_user_name="alice"),
    }
    for op in (release, rollback, check):
        op.render_template_fields(context, dag.get_template_env())
    cfg = config_of(release.build_job_spec(), ReleaseConfig)
    assert (cfg.artifact_root, cfg.model, cfg.run_id) == ("file:///r", "minilm", "manual__1")
    assert (cfg.corpora, cfg.action, cfg.reason, cfg.who, cfg.drop_corpora) == (
        ["products", "docs"], "promote_anyway", "recall fixed by hand", "alice", ["faq"],
    )  # fmt: skip
    cfg = config_of(rollback.build_job_spec(), RollbackConfig)
    assert (cfg.to_release, cfg.reason, cfg.who) == ("rel-7", "recall fixed by hand", "alice")
    cfg = config_of(check.build_job_spec(), SearchCheckConfig)
    assert (cfg.corpus, cfg.regression, cfg.target_version) == ("docs", "report", "manual__1")

    # A scheduled run has no triggering user: a person's move is refused by the job.
    unattended = RollbackOperator(
        task_id="r2", model="tiny", artifact_root="file:///r", release="x", reason="y"
    )
    context["dag_run"] = SimpleNamespace(triggering_user_name=None)
    unattended.render_template_fields(context, dag.get_template_env())
    assert unattended.who == ""
    with pytest.raises(ValueError, match="who"):
        config_of(unattended.build_job_spec(), RollbackConfig)


def test_a_release_and_a_rollback_announce_the_model_asset_or_the_alias_when_templated():
    assert model_asset("minilm").uri == "embedfresh://models/minilm"
    assert embeddings_asset("minilm", "docs").uri == "embedfresh://embeddings/minilm/docs"
    for cls, args in ((ReleaseOperator, {}), (RollbackOperator, {"release": "r", "reason": "y"})):
        plain = cls(task_id="p", artifact_root="file:///r", model="minilm", **args)
        assert plain.outlets == [model_asset("minilm"), AssetAlias(EMBEDDING_PUBLICATIONS_ALIAS)]
        templated = cls(task_id="q", artifact_root="r", model="{{ params.model }}", **args)
        assert [type(o) for o in templated.outlets] == [AssetAlias, AssetAlias]
        assert [o.name for o in templated.outlets] == [
            MODEL_PROMOTIONS_ALIAS,
            EMBEDDING_PUBLICATIONS_ALIAS,
        ]
    for cls in (IndexLoadOperator, SearchCheckOperator):  # nothing is live before the release
        assert cls(task_id="x", model="tiny", artifact_root="r", corpus="docs").outlets == []
    assert GarbageCollectOperator(task_id="gc", model="tiny", artifact_root="r").outlets == []


def test_an_index_connection_is_refused_on_aws_batch():
    """On AWS Batch the job definition gives the DSN from its secrets: a connection here
    would put the password in the job's overrides, so the task fails for good, before the
    connection is even read (there is none named ``vectors`` here)."""
    ticket = ResultTicket(name="load", attempt_id="a1")
    common = dict(
        artifact_root="s3://bucket/p", model="tiny", run_id="r1", corpus="docs",
        execution_mode="aws_batch", batch={"job_queue": "q", "job_definition": "d"},
    )  # fmt: skip
    with pytest.raises(AirflowFailException, match=f"give the job definition {INDEX_DSN_ENV}"):
        IndexLoadOperator(task_id="load", index_conn_id="vectors", **common).build_job_spec(ticket)
    spec = IndexLoadOperator(task_id="load", **common).build_job_spec(ticket)
    assert INDEX_DSN_ENV not in spec.env


# --- the local runner and the exit-code mapping -------------------------------------


class ScriptRunner(LocalRunner):
    """Runs ``spec.settings["code"]`` with ``python -c`` instead of ``python -m embedfresh.jobs.<job>``."""

    def command(self, spec: JobSpec) -> list[str]:
        return [self.python, "-c", spec.settings["code"]]


#: A job like every real one (run_job: config, result record, summary, exit code) whose
#: work is its ``code`` setting: the code may print, exit with any code, or leave its
#: result in ``SUMMARY``.
SCRIPT_JOB = textwrap.dedent(
    """
    import sys
    from embedfresh.core.cli import run_job
    from embedfresh.core.config import JobConfig

    class ScriptConfig(JobConfig):
        code: str

    def script(config):
        scope = {}
        exec(config.code, scope)
        return scope.get("SUMMARY")

    sys.exit(run_job("script", ScriptConfig, script))
    """
)


class ScriptJobRunner(LocalRunner):
    """Runs :data:`SCRIPT_JOB` as the spec's job (its result record names that job) with
    the spec's job arguments (settings, result ticket)."""

    def command(self, spec: JobSpec) -> list[str]:
        code = SCRIPT_JOB.replace('run_job("script"', f"run_job({spec.job!r}")
        return [self.python, "-c", code, *spec.job_args()]


class ScriptOperator(EmbedfreshJobOperator):
    job_name = "script"

    def __init__(self, *, code: str, kill_grace_s: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.code = textwrap.dedent(code)
        self.kill_grace_s = kill_grace_s

    def job_specific_settings(self) -> dict[str, Any]:
        return {"code": self.code}

    @cached_property
    def runner(self) -> LocalRunner:
        return ScriptJobRunner(kill_grace_s=self.kill_grace_s)


@pytest.fixture
def root(tmp_path: Path) -> str:
    """The artifact store the script jobs write their result records to."""
    return f"file://{tmp_path / 'store'}"


def script(code: str, root: str = "file:///unused", **kwargs: Any) -> ScriptOperator:
    kwargs.setdefault("model", "tiny")
    return ScriptOperator(task_id="script", artifact_root=root, run_id="r1", code=code, **kwargs)


def exits_with(code: int, summary: Any = None, error: str = "") -> str:
    """Code that reports on stderr, then exits ``code``; with exit 0 and a summary it
    returns the summary instead, so the job writes its record and prints it."""
    lines = ["import json, sys", 'print("working", file=sys.stderr)']
    if error:
        lines.append(f"print({error!r}, file=sys.stderr)")
    if summary is not None:
        lines.append(f"SUMMARY = {summary!r}")
    if code != 0 or summary is None:
        lines.append(f"sys.exit({code})")
    return "\n".join(lines)


def results_of(root: str) -> Path:
    return Path(root.removeprefix("file://")) / "runs/tiny/r1/results"


def test_exit_0_returns_the_summary_in_the_jobs_result_record_for_xcom(root: str):
    summary = {"status": "ok", "steps": 3}
    assert script(exits_with(0, summary), root).execute({}) == summary
    record = json.loads((results_of(root) / "script.json").read_text())
    assert record["summary"] == summary and record["job"] == "script"
    assert record["name"] == "script"  # the task id, outside a DAG run
    assert len(record["attempt_id"]) == 32 and record["config"]["run_id"] == "r1"


def test_exit_0_without_a_result_record_is_a_retryable_failure(root: str):
    # The job exits 0 before run_job writes anything: its outcome is unknown.
    with pytest.raises(AirflowException, match="exited 0 but wrote no result record at") as info:
        script(exits_with(0), root).execute({})
    assert type(info.value) is AirflowException
    assert f"{root}/runs/tiny/r1/results/script.json:" in str(info.value)


def test_a_record_left_by_an_earlier_execution_is_not_this_ones(root: str):
    first = {"status": "ok", "try": 1}
    assert script(exits_with(0, first), root).execute({}) == first
    path = results_of(root) / "script.json"
    before = path.read_bytes()
    # The retry's job exits 0 without writing: the record there is the first try's.
    with pytest.raises(AirflowException, match="was left by another execution") as info:
        script(exits_with(0), root).execute({})
    assert type(info.value) is AirflowException
    assert f"result record file://{path} " in str(info.value)
    assert path.read_bytes() == before


def test_mapped_task_instances_each_return_their_own_record(root: str):
    def ti(map_index: int) -> dict[str, Any]:
        return {"ti": SimpleNamespace(dag_id="dag", task_id="script", map_index=map_index)}

    returned = [script(exits_with(0, {"i": i}), root).execute(ti(i)) for i in (0, 1)]
    assert returned == [{"i": 0}, {"i": 1}]
    assert sorted(p.name for p in results_of(root).iterdir()) == [
        "dag:script:0.json",
        "dag:script:1.json",
    ]


def test_a_summary_that_is_not_an_object_is_refused(root: str):
    with pytest.raises(AirflowException, match="holds a list summary, not the JSON object"):
        script(exits_with(0, [1, 2]), root).execute({})


@pytest.mark.parametrize(
    "code, meaning",
    [(2, "bad input"), (3, "quality gate refused"), (4, "health check")],
)
def test_exit_2_3_4_fail_without_retry_and_quote_the_jobs_error(code: int, meaning: str, root: str):
    error = f"job: error: something precise went wrong ({code})"
    with pytest.raises(AirflowFailException) as info:
        script(exits_with(code, {"never": "recorded"}, error=error), root).execute({})
    message = str(info.value)
    assert f"exit code {code}" in message and meaning in message
    assert message.endswith(error)
    assert not results_of(root).exists()  # a failed job leaves no record


@pytest.mark.parametrize("code, words", [(75, "transient"), (1, "crashed"), (139, "crashed")])
def test_transient_and_unknown_exits_are_retryable(code: int, words: str, root: str):
    with pytest.raises(AirflowException, match=words) as info:
        script(exits_with(code, error="job: error: boom"), root).execute({})
    assert type(info.value) is AirflowException  # not AirflowFailException: retried
    assert "boom" in str(info.value)


def test_a_real_job_failing_on_bad_input_fails_the_task_with_its_message(tmp_path: Path):
    root = f"file://{tmp_path}"
    release = ReleaseOperator(task_id="release", artifact_root=root, run_id="r1", model="tiny")
    release.runner.cwd = str(ROOT)
    with pytest.raises(AirflowFailException, match="release: error: no gate report") as info:
        release.execute({})
    assert "exit code 2" in str(info.value)
    rollback = RollbackOperator(
        task_id="rollback",
        model="tiny",
        artifact_root=root,
        run_id="r2",
        release="r0",
        reason="x",
        who="al",
    )
    rollback.runner.cwd = str(ROOT)
    with pytest.raises(AirflowFailException, match="rollback: error: cannot roll tiny back to r0"):
        rollback.execute({})
    assert not (tmp_path / "models").exists()  # no release, no registry


class ScriptRelease(ReleaseOperator):
    """The release operator (its outlets, announcing and index connection) running the
    script job :data:`SCRIPT_JOB` under the name ``release``."""

    def __init__(self, *, code: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.code = textwrap.dedent(code)

    def job_specific_settings(self) -> dict[str, Any]:
        return {"code": self.code}

    @cached_property
    def runner(self) -> LocalRunner:
        return ScriptJobRunner()


#: What the release job returns (embedfresh/jobs/release.py), and the index DSN it was given.
RELEASED = """
    import os
    SUMMARY = {
        "production": "r9", "release": "r9", "registry": "file:///r/models/minilm/registry.json",
        "corpora": {
            "docs": {"table": "emb_docs", "rows": 2, "manifest": "file:///m/docs"},
            "products": {"table": "emb_products", "rows": 3, "manifest": "file:///m/products"},
        },
        "dsn": os.environ.get("EMBEDFRESH_INDEX_DSN"),
    }
"""


@pytest.mark.parametrize("model", ["minilm", "{{ params.model }}"])
def test_a_release_announces_its_model_and_every_corpus_it_made_live(
    model: str, root: str, monkeypatch: pytest.MonkeyPatch
):
    """The model's Asset (a static outlet, or through the alias when templated) and one
    embeddings Asset per corpus of the job's summary, through the alias; the index
    connection's URI reaches the job in its environment, never in its settings."""
    from airflow.sdk.execution_time.context import OutletEventAccessors

    monkeypatch.setenv("AIRFLOW_CONN_VECTORS", "postgresql://embed:s3cret-pw@db.example:5432/vec")
    monkeypatch.delenv(INDEX_DSN_ENV, raising=False)
    with DAG("d", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) as dag:
        op = ScriptRelease(
            task_id="release", artifact_root=root, run_id="r1", model=model,
            index_conn_id="vectors", code=RELEASED,
        )  # fmt: skip
    context = {"params": {"model": "minilm"}, "dag_run": SimpleNamespace(triggering_user_name="al")}
    op.render_template_fields(context, dag.get_template_env())
    events = OutletEventAccessors()
    summary = op.execute({"outlet_events": events})

    assert summary["dsn"].endswith("://embed:s3cret-pw@db.example:5432/vec"), summary["dsn"]
    # ... in its environment only: not in its settings (the record keeps them), nor its argv.
    records = Path(root.removeprefix("file://")) / "runs/minilm/r1/results"
    record = json.loads((records / "release.json").read_text())
    assert record["config"]["code"] and "s3cret-pw" not in json.dumps(record["config"])
    spec = op.build_job_spec(ResultTicket(name="release", attempt_id="a2"))
    assert spec.env[INDEX_DSN_ENV] == summary["dsn"] and "s3cret-pw" not in " ".join(spec.argv(PY))
    released = {
        "release": "r9",
        "version": "r9",
        "registry": "file:///r/models/minilm/registry.json",
    }
    if model == "minilm":
        assert events[model_asset("minilm")].extra == released
    else:
        [event] = events[AssetAlias(MODEL_PROMOTIONS_ALIAS)].asset_alias_events
        assert (event.dest_asset_key.uri, event.extra) == ("embedfresh://models/minilm", released)
    corpora = events[AssetAlias(EMBEDDING_PUBLICATIONS_ALIAS)].asset_alias_events
    assert {e.dest_asset_key.uri: e.extra for e in corpora} == {
        "embedfresh://embeddings/minilm/docs": {
            "release": "r9", "version": "r9", "table": "emb_docs", "rows": 2,
            "manifest": "file:///m/docs",
        },
        "embedfresh://embeddings/minilm/products": {
            "release": "r9", "version": "r9", "table": "emb_products", "rows": 3,
            "manifest": "file:///m/products",
        },
    }  # fmt: skip


class Recorder(logging.Handler):
    """Collects log lines; calls ``on_line`` for each, as they arrive."""

    def __init__(self, on_line=lambda line: None) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.on_line = on_line

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        self.on_line(line)


def recording_logger(name: str, handler: Recorder) -> logging.Logger:
    log = logging.getLogger(f"tests.operators.{name}")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    return log


def test_output_streams_into_the_log_while_the_job_runs(tmp_path: Path):
    # The child waits for a file that only the log handler creates on seeing its first
    # line: it exits 0 only if that line reached the log while the job was running.
    flag = tmp_path / "seen"
    code = f"""
        import json, pathlib, sys, time
        print("first line", flush=True)
        print("a warning on stderr", file=sys.stderr, flush=True)
        deadline = time.monotonic() + 20
        while not pathlib.Path({str(flag)!r}).exists():
            if time.monotonic() > deadline:
                sys.exit(9)
            time.sleep(0.02)
        print(json.dumps({{"seen": True}}))
    """

    def on_line(line: str) -> None:
        if line == "first line":
            flag.touch()

    handler = Recorder(on_line)
    result = ScriptRunner().run(
        JobSpec("script", {"code": textwrap.dedent(code)}), recording_logger("stream", handler)
    )
    assert result.exit_code == 0 and result.summary == {"seen": True}
    assert result.tail == "a warning on stderr"
    assert {"first line", "a warning on stderr", '{"seen": true}'} <= set(handler.lines)


def test_the_job_gets_the_worker_env_plus_its_own_and_offline_hub(monkeypatch, root: str):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("EMBEDFRESH_TEST_WORKER", "worker")
    code = """
        import os
        keys = ["EMBEDFRESH_TEST_WORKER", "EMBEDFRESH_TEST_SPEC", "HF_HUB_OFFLINE"]
        SUMMARY = {k: os.environ.get(k) for k in keys}
    """
    op = script(code, root, env={"EMBEDFRESH_TEST_SPEC": "spec"})
    assert op.execute({}) == {
        "EMBEDFRESH_TEST_WORKER": "worker",
        "EMBEDFRESH_TEST_SPEC": "spec",
        "HF_HUB_OFFLINE": "1",
    }
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the worker's own choice wins over the default
    assert script(code, root).execute({})["HF_HUB_OFFLINE"] == "0"


# --- on_kill ----------------------------------------------------------------------------


def gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (exited, or a zombie waiting for its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_gone(pids: list[int], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


SPAWNS_A_GRANDCHILD = """
    import json, os, pathlib, signal, subprocess, sys, time
    if {ignore_term}:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    pathlib.Path(os.environ["PIDS_FILE"]).write_text(json.dumps([os.getpid(), child.pid]))
    time.sleep(120)
"""


def run_and_kill(tmp_path: Path, ignore_term: bool, grace: float = 5.0):
    """Run the task in a thread, call on_kill once its processes are up.

    Returns the job's and its child's pids, what execute() raised, and how long
    on_kill took.
    """
    pids_file = tmp_path / "pids.json"
    op = script(
        SPAWNS_A_GRANDCHILD.format(ignore_term=ignore_term),
        f"file://{tmp_path / 'store'}",
        env={"PIDS_FILE": str(pids_file)},
        kill_grace_s=grace,
    )
    raised: list[BaseException] = []

    def target() -> None:
        try:
            op.execute({})
        except Exception as e:
            raised.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not pids_file.exists() or not pids_file.read_text():
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.02)
    pids = json.loads(pids_file.read_text())
    started = time.monotonic()
    op.on_kill()
    seconds = time.monotonic() - started
    thread.join(15)
    assert not thread.is_alive(), "execute() did not return after on_kill"
    return pids, raised[0] if raised else None, seconds


def test_on_kill_ends_the_whole_process_group_and_the_task_may_retry(tmp_path: Path):
    pids, raised, seconds = run_and_kill(tmp_path, ignore_term=False, grace=60)
    assert len(pids) == 2 and wait_gone(pids), pids
    assert seconds < 30  # SIGTERM was enough: no wait for the SIGKILL grace (60 s)
    # The job's SIGTERM handler (embedfresh/core/cli.py) ends it as a transient fault.
    assert type(raised) is AirflowException and "exit code 75" in str(raised)
    assert "stopped by SIGTERM" in str(raised)


def test_on_kill_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path):
    pids, raised, seconds = run_and_kill(tmp_path, ignore_term=True, grace=0.5)
    assert wait_gone(pids), pids
    assert 0.4 < seconds < 30  # the grace, then SIGKILL (not the job's 120 s sleep)
    assert type(raised) is AirflowException and "exit code -9" in str(raised)


def test_on_kill_before_anything_ran_is_a_no_op():
    script("pass").on_kill()
    LocalRunner().kill()


def test_the_runner_uses_the_workers_interpreter():
    assert LocalRunner().python == sys.executable
    assert LocalRunner(python="/opt/py").command(JobSpec("train")) == [
        "/opt/py",
        "-m",
        "embedfresh.jobs.train",
    ]


# --- embedding and parity operators -------------------------------------------------


def test_embedding_and_parity_operators_build_their_jobs_settings():
    from embedfresh.operators import (
        BackendParityOperator,
        EmbeddingVerifyOperator,
        ShardEmbeddingOperator,
    )

    common = dict(artifact_root="file:///r", run_id="r1", model="tiny")
    embed = ShardEmbeddingOperator(
        task_id="e", **common, version="v1", corpus="products", shards=[0, 2]
    )
    spec = embed.build_job_spec()
    assert spec.job == "embed"
    assert {k: spec.settings[k] for k in ("version", "corpus", "shards", "token_budget")} == {
        "version": "v1", "corpus": "products", "shards": [0, 2], "token_budget": 4096,
    }  # fmt: skip
    assert (
        "shards"
        not in ShardEmbeddingOperator(task_id="a", **common, version="v1", corpus="products")
        .build_job_spec()
        .settings
    )
    assert {"version", "corpus", "shards", "token_budget"} <= set(embed.template_fields)
    verify = EmbeddingVerifyOperator(task_id="v", **common, version="v1", corpus="docs")
    assert verify.build_job_spec().job == "embed_verify"
    assert "shards" not in verify.build_job_spec().settings
    parity = BackendParityOperator(
        task_id="p", **common, init_version="v0", backend_b="cuda", eval_every=5,
        data_interval_start="2026-01-01", data_interval_end="2026-01-02",
    )  # fmt: skip
    settings = parity.build_job_spec().settings
    assert parity.build_job_spec().job == "parity"
    assert (settings["init_version"], settings["backend_a"], settings["backend_b"]) == (
        "v0", "cpu", "cuda",
    )  # fmt: skip
    assert settings["eval_every"] == 5 and settings["data_interval_start"] == "2026-01-01"


def test_verify_announces_its_own_set_never_the_live_embeddings(root: str):
    """A verified candidate set announces its own Asset (model, version, corpus); the live
    embeddings Asset is updated only with the release that carries it."""
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from embedfresh.operators import EmbeddingVerifyOperator
    from embedfresh.operators.assets import EMBEDDING_SETS_ALIAS

    with pytest.raises(TypeError, match="corpus"):
        EmbeddingVerifyOperator(task_id="v", artifact_root="r", model="minilm", version="v1")
    for corpus in ("docs", "{{ params.corpus }}"):
        verify = EmbeddingVerifyOperator(
            task_id="v", artifact_root="r", model="minilm", corpus=corpus, version="v1"
        )
        assert verify.outlets == [AssetAlias(EMBEDDING_SETS_ALIAS)]
    events = OutletEventAccessors()
    summary = {"rows": 7, "manifest": "file:///m/docs/_MANIFEST.json", "parts": 1}
    verify = EmbeddingVerifyOperator(
        task_id="v", artifact_root=root, model="minilm", corpus="docs", version="v1"
    )
    assert verify.announce({"outlet_events": events}, summary) is summary
    [event] = events[AssetAlias(EMBEDDING_SETS_ALIAS)].asset_alias_events
    assert event.dest_asset_key.uri == "embedfresh://embedding-sets/minilm/v1/docs"
    assert event.extra == {"rows": 7, "manifest": "file:///m/docs/_MANIFEST.json"}


def _corpus_dir(root: Path, name: str, shards: int) -> None:
    corpus = root / "corpora" / name
    corpus.mkdir(parents=True)
    for i in range(shards):
        (corpus / f"part-{i:05d}.parquet").write_bytes(b"")


def test_shards_are_listed_in_chunks_and_the_production_version_is_read(tmp_path: Path):
    from airflow.sdk.exceptions import AirflowFailException as Fail

    from embedfresh.operators import (
        CorpusShardsOperator,
        ResolveModelVersionOperator,
        production_version,
    )

    _corpus_dir(tmp_path, "products", 5)
    (tmp_path / "corpora" / "products" / "notes.txt").write_text("ignored")
    root = f"file://{tmp_path}"
    one = CorpusShardsOperator(task_id="l", artifact_root=root, corpus="products")
    assert one.execute({}) == [{"corpus": "products", "shards": [i]} for i in range(5)]
    two = CorpusShardsOperator(
        task_id="m", artifact_root=root, corpus="products", shards_per_task="2"
    )
    assert two.execute({}) == [
        {"corpus": "products", "shards": [0, 1]},
        {"corpus": "products", "shards": [2, 3]},
        {"corpus": "products", "shards": [4]},
    ]
    with pytest.raises(Fail, match="no part"):
        CorpusShardsOperator(task_id="n", artifact_root=root, corpus="none").execute({})
    with pytest.raises(Fail, match="shards_per_task must be >= 1"):
        CorpusShardsOperator(
            task_id="o", artifact_root=root, corpus="products", shards_per_task=0
        ).execute({})
    with pytest.raises(ValueError, match="name the corpus to list"):
        CorpusShardsOperator(task_id="p", artifact_root=root)

    with pytest.raises(Fail, match="nothing was promoted yet"):
        production_version(root, "tiny")
    registry = tmp_path / "models" / "tiny" / "registry.json"
    registry.parent.mkdir(parents=True)
    # Read by the jobs' own parser: a registry without its history is refused.
    registry.write_text(json.dumps({"model": "tiny", "production": {"version": "v7"}}))
    with pytest.raises(Fail, match="does not have the registry structure"):
        production_version(root, "tiny")
    registry.write_text(
        json.dumps({"model": "tiny", "production": {"version": "v7"}, "history": []})
    )
    assert production_version(root, "tiny") == "v7"
    # Resolving also checks the version is committed (errors at the door: tests/test_inputs.py).
    for version in ("v7", "v2"):
        commit = tmp_path / "models" / "tiny" / "versions" / version / "COMMIT"
        commit.parent.mkdir(parents=True)
        commit.write_text(json.dumps({"files": {}}))
    resolve = ResolveModelVersionOperator(task_id="r", artifact_root=root, model="tiny")
    assert resolve.execute({}) == "v7"
    pinned = ResolveModelVersionOperator(
        task_id="s", artifact_root=root, model="tiny", version="v2"
    )
    assert pinned.execute({}) == "v2"


def test_corpora_are_checked_and_their_shards_listed_as_each_embed_tasks_kwargs(tmp_path: Path):
    """Several corpora: each checked (one without shards fails the task, naming the
    corpora there are), then every corpus's shards in chunks; each chunk is the keyword
    arguments of one mapped embed task (``expand_kwargs``), and no two of them share a
    lease or a report."""
    from airflow.sdk.exceptions import AirflowFailException as Fail

    from embedfresh.core.config import EmbedConfig
    from embedfresh.operators import CorporaOperator, CorpusShardsOperator, ShardEmbeddingOperator

    _corpus_dir(tmp_path, "products", 3)
    _corpus_dir(tmp_path, "docs", 2)
    (tmp_path / "corpora" / "empty").mkdir()
    root = f"file://{tmp_path}"
    listed = CorporaOperator(task_id="c", artifact_root=root, corpora='["docs", "products"]')
    assert listed.execute({}) == ["docs", "products"]  # a rendered Param: its JSON
    assert CorporaOperator(task_id="d", artifact_root=root, corpora=["docs"]).execute({}) == [
        "docs"
    ]
    with pytest.raises(Fail) as info:
        CorporaOperator(task_id="e", artifact_root=root, corpora=["products", "reviews"]).execute(
            {}
        )
    message = str(info.value)
    assert "corpus 'reviews' has no part-NNNNN.parquet" in message, message
    there = message.split("(corpora there: ", 1)[1].rstrip(")").split(", ")
    assert sorted(there) == ["docs", "products"], message  # not "empty": it has no shard
    with pytest.raises(Fail, match="corpora is empty"):
        CorporaOperator(task_id="f", artifact_root=root, corpora="[]").execute({})

    shards = CorpusShardsOperator(
        task_id="s", artifact_root=root, corpora=["products", "docs"], shards_per_task=2
    )
    chunks = shards.execute({})
    assert chunks == [
        {"corpus": "products", "shards": [0, 1]},
        {"corpus": "products", "shards": [2]},
        {"corpus": "docs", "shards": [0, 1]},
    ]
    configs = [
        config_of(
            ShardEmbeddingOperator(
                task_id="embed",
                artifact_root=root,
                model="tiny",
                run_id="r1",
                version="v1",
                **chunk,
            ).build_job_spec(),
            EmbedConfig,
        )
        for chunk in chunks
    ]
    assert [(c.corpus, c.shards) for c in configs] == [(k["corpus"], k["shards"]) for k in chunks]
    assert (
        len({c.lease_unit("embed") for c in configs}) == len({c.report_kind for c in configs}) == 3
    )
    as_json = CorpusShardsOperator(task_id="t", artifact_root=root, corpora='["docs"]')
    assert as_json.execute({}) == [{"corpus": "docs", "shards": [i]} for i in (0, 1)]
    with pytest.raises(Fail, match="corpus 'empty' has no part"):
        CorpusShardsOperator(task_id="u", artifact_root=root, corpora=["docs", "empty"]).execute({})
    with pytest.raises(Fail, match="no corpus to embed"):
        CorpusShardsOperator(task_id="v", artifact_root=root, corpora=[]).execute({})


# --- health, compile, deadline --------------------------------------------------------


def test_health_and_compile_operators_build_their_jobs_settings():
    common = dict(artifact_root="file:///r", run_id="r1", model="tiny", backend="cpu")
    health = AcceleratorHealthOperator(
        task_id="h", **common, nproc_per_node="2", job_settings={"min_busbw_gbps": {"all_reduce": 5}}
    )  # fmt: skip
    spec = health.build_job_spec()
    assert spec.job == "health" and spec.nproc_per_node == 2
    assert spec.argv(PY)[:7] == [
        PY,
        "-m",
        "embedfresh.jobs.launch",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
    ]
    assert dict(spec.settings) == {**common, "min_busbw_gbps": {"all_reduce": 5}}
    assert "nproc_per_node" in health.template_fields

    # The compile trial takes the training task's arguments, so it traces the same graphs.
    train_args = dict(data_interval_start="2026-01-01", epochs="3", job_settings={"batch_size": 16})
    compile_spec = AheadOfTimeCompileOperator(task_id="c", **common, **train_args).build_job_spec()
    train_spec = IncrementalTrainingOperator(task_id="t", **common, **train_args).build_job_spec()
    assert compile_spec.job == "compile" and train_spec.job == "train"
    assert compile_spec.settings == train_spec.settings

    bad = AcceleratorHealthOperator(task_id="h2", **common, nproc_per_node="two")
    with pytest.raises(AirflowFailException, match="nproc_per_node must be a whole number"):
        bad.build_job_spec()


def test_a_failed_health_check_fails_the_task_without_retry(tmp_path: Path):
    # One CPU process sees one device; expecting 10 is a real failed check (exit 4).
    op = AcceleratorHealthOperator(
        task_id="health", model="tiny", artifact_root=f"file://{tmp_path}", run_id="r1",
        job_settings={"expected_devices": 10, "collectives": False},
    )  # fmt: skip
    op.runner.cwd = str(ROOT)
    with pytest.raises(AirflowFailException, match="exit code 4 .health check found a faulty"):
        op.execute({})
    report = json.loads((tmp_path / "runs/tiny/r1/reports/health.json").read_text())
    assert report["verdict"] == "FAIL"
    assert not (tmp_path / "runs/tiny/r1/results").exists()  # no record of a failure


def test_the_deadline_callback_records_the_breach_where_the_run_writes(tmp_path, caplog):
    default_root, run_root = tmp_path / "default", tmp_path / "run"
    context = {
        "dag_run": {
            "dag_id": "embedding_model_refresh",
            "run_id": "scheduled__2026-01-02T00:00:00+00:00",
            "state": "running",
            "queued_at": "2026-01-02T00:00:05Z",
            "conf": {"artifact_root": f"file://{run_root}"},
        },
        "deadline": {"id": "d-1", "deadline_time": dt.datetime(2026, 1, 2, 6, 0, 5, tzinfo=dt.UTC)},
    }
    with caplog.at_level(logging.WARNING, logger="embedfresh.operators.deadline"):
        record_deadline_breach(f"file://{default_root}", "tiny", 21600.0, context=context)

    # The run's conf names its artifact root: the record goes there, not to the default.
    path = run_root / "runs/tiny/scheduled__2026-01-02T00:00:00+00:00/reports/deadline.json"
    assert json.loads(path.read_text()) == {
        "dag_id": "embedding_model_refresh",
        "run_id": "scheduled__2026-01-02T00:00:00+00:00",
        "state_at_breach": "running",
        "queued_at": "2026-01-02T00:00:05Z",
        "deadline_time": "2026-01-02T06:00:05+00:00",
        "interval_seconds": 21600.0,
        "recorded_at": json.loads(path.read_text())["recorded_at"],
        "deadline_id": "d-1",
    }
    assert not default_root.exists()
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("DEADLINE MISSED: embedding_model_refresh run scheduled__")
    assert f"file://{path}" in message


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, 6 * 3600), ("", 6 * 3600), ("90", 90), ("0.5", 0.5)]
)
def test_the_deadline_interval_comes_from_the_environment(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv(DEADLINE_ENV, raising=False)
    else:
        monkeypatch.setenv(DEADLINE_ENV, value)
    assert deadline_interval() == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan"])
def test_a_bad_deadline_setting_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(DEADLINE_ENV, value)
    with pytest.raises(ValueError, match=f"{DEADLINE_ENV} must be a positive number"):
        deadline_interval()
