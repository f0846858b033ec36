"""Runners by registration: a new ``execution_mode`` is one class plus one line.

:class:`CapturedRunner` is the worked example (docs/ARCHITECTURE.md quotes it): the
smallest runner there is, the job as a child process whose output is captured whole
rather than streamed. It is registered below with its one line, and operators run real
jobs through it: what they return is the job's result record, as under the built-in
runners. The rest checks the registry's rules: names are checked when the DAG file is
parsed, settings when the task runs.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException

from embedfresh.core.settings import ExecutionMode
from embedfresh.operators import (
    AcceleratorHealthOperator,
    EvaluationOperator,
    JobResult,
    JobSpec,
    LocalRunner,
    ReleaseOperator,
    register_runner,
    registered_runners,
    unregister_runner,
)
from tests.conftest import ROOT


class CapturedRunner:
    """Runs the job as a child process and reports how it ended; output captured whole.

    :param python: interpreter that runs the job.
    :param cwd: working directory of the job.
    """

    def __init__(self, python: str = sys.executable, cwd: str | None = None) -> None:
        self.python = python
        self.cwd = cwd

    def run(self, spec: JobSpec, log: logging.Logger) -> JobResult:
        # spec.argv() carries the result record's name and attempt id: the job writes
        # the record the operator returns; this runner never parses the job's output.
        done = subprocess.run(
            spec.argv(self.python),
            env={**os.environ, **spec.env},
            cwd=self.cwd,
            capture_output=True,
            text=True,
        )
        log.info("%s", done.stdout + done.stderr)
        return JobResult(exit_code=done.returncode, summary=None, tail=done.stderr)

    def kill(self) -> None:
        """Nothing to stop: :meth:`run` returns only once the job has ended."""


register_runner("captured", CapturedRunner)


def test_an_operator_runs_a_real_job_through_the_registered_runner(tmp_path: Path):
    op = AcceleratorHealthOperator(
        task_id="health",
        model="tiny",
        artifact_root=f"file://{tmp_path}",
        run_id="r1",
        job_settings={"collectives": False},
        env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        execution_mode="captured",
        runner_settings={"cwd": str(ROOT)},
    )
    assert isinstance(op.runner, CapturedRunner) and op.runner.cwd == str(ROOT)
    summary = op.execute({})
    record = json.loads((tmp_path / "runs/tiny/r1/results/health.json").read_text())
    assert summary == record["summary"] and summary["verdict"] == "PASS"
    assert record["attempt_id"] is not None


def test_the_exit_code_contract_holds_under_the_registered_runner(tmp_path: Path):
    # No gate report in an empty store: the release job's bad input (exit 2), no retry.
    op = ReleaseOperator(
        task_id="release",
        model="tiny",
        artifact_root=f"file://{tmp_path}",
        run_id="r1",
        execution_mode="captured",
        runner_settings={"cwd": str(ROOT)},
    )
    with pytest.raises(AirflowFailException, match="exit code 2 .bad input.*no gate report"):
        op.execute({})
    assert not (tmp_path / "runs/tiny/r1/results").exists()


def test_the_built_in_modes_are_registered_runners():
    assert {str(m) for m in ExecutionMode} | {"captured"} <= set(registered_runners())
    local = EvaluationOperator(
        task_id="e",
        model="tiny",
        artifact_root="file:///r",
        execution_mode=ExecutionMode.LOCAL,
        runner_settings={"kill_grace_s": 3, "tail_lines": 5},
    )
    assert type(local.runner) is LocalRunner
    assert (local.runner.kill_grace_s, local.runner.tail_lines) == (3, 5)
    assert local.execution_mode == "local"


def test_an_unknown_mode_fails_the_dag_file_at_parse_time_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown execution_mode 'kubernetes'") as info:
        with DAG("typo", schedule=None):
            EvaluationOperator(
                task_id="e", model="tiny", artifact_root="file:///r", execution_mode="kubernetes"
            )
    for name in ("aws_batch", "captured", "local"):
        assert name in str(info.value)


def test_settings_a_runner_does_not_take_fail_the_dag_file_or_the_task_for_good():
    typo = {"python": "/opt/py", "queue": "q"}
    with pytest.raises(
        ValueError, match="unknown settings \\['queue'\\] for execution_mode 'captured'"
    ):
        EvaluationOperator(
            task_id="e",
            model="tiny",
            artifact_root="file:///r",
            execution_mode="captured",
            runner_settings=typo,
        )
    # Settings given as one template are checked once rendered: a failure without retry.
    op = EvaluationOperator(
        task_id="e",
        model="tiny",
        artifact_root="file:///r",
        execution_mode="captured",
        runner_settings="{{ params.runner }}",
    )
    op.runner_settings = typo  # as rendered
    with pytest.raises(AirflowFailException, match="unknown settings \\['queue'\\]"):
        op.check_rendered_settings()
    # By name, without a settings model: the registry cannot check them before the
    # runner is built, and then the error is final too.
    register_runner("scratch", "embedfresh.operators.runners.local:LocalRunner")
    try:
        late = EvaluationOperator(
            task_id="e", model="tiny", artifact_root="file:///r", execution_mode="scratch",
            runner_settings=typo,
        )  # fmt: skip
        late.check_rendered_settings()
        with pytest.raises(
            AirflowFailException, match="do not fit execution_mode 'scratch'.*queue"
        ):
            _ = late.runner
    finally:
        unregister_runner("scratch")


def test_a_name_names_one_runner_until_it_is_unregistered():
    with pytest.raises(ValueError, match="'captured' is already registered .pass replace=True"):
        register_runner("captured", LocalRunner)
    register_runner("captured", CapturedRunner, replace=True)
    with pytest.raises(ValueError, match="non-empty name"):
        register_runner("", CapturedRunner)
    with pytest.raises(TypeError, match="neither callable nor"):
        register_runner("scratch", 42)

    # By "module:attribute", imported only when a task builds the runner.
    register_runner("scratch", "embedfresh.operators.runners.local:LocalRunner")
    try:
        op = EvaluationOperator(
            task_id="e", model="tiny", artifact_root="file:///r", execution_mode="scratch"
        )
        assert type(op.runner) is LocalRunner
    finally:
        unregister_runner("scratch")
    assert "scratch" not in registered_runners()
    assert registered_runners().count("captured") == 1
    with pytest.raises(ValueError, match="unknown execution_mode 'scratch'"):
        unregister_runner("scratch")
    missing = EvaluationOperator(
        task_id="m", model="tiny", artifact_root="file:///r", execution_mode="captured"
    )
    register_runner("gone", "tests.no_such_module:Runner")
    try:
        missing.execution_mode = "gone"
        with pytest.raises(ModuleNotFoundError, match="tests.no_such_module"):
            _ = missing.runner
    finally:
        unregister_runner("gone")
