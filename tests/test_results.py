"""Result records (embedfresh.core.results): written by run_job on success only, under a
name unique per task instance, and read back only by the execution that wrote them.

run_job runs in process here with a tiny job function, like tests/reliability/
test_transient_exit.py; the operators' side, on real processes, is in
tests/test_operators.py and tests/test_runner_results.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from embedfresh.core import cli, layout
from embedfresh.core.config import JobConfig
from embedfresh.core.exit_codes import BadInputError, ExitCode, TransientError
from embedfresh.core.results import (
    RECORD_FORMAT,
    InvalidResultError,
    MissingResultError,
    ResultTicket,
    StaleResultError,
    new_attempt_id,
    read_result,
    result_name,
)

SUMMARY = {"status": "ok", "rows": 3, "nested": {"a": [1, 2.5, None]}}


@pytest.fixture(autouse=True)
def _keep_test_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "configure_logging", lambda: None)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("AWS_BATCH_JOB_ID", raising=False)


@pytest.fixture
def root(tmp_path: Path) -> str:
    return f"file://{tmp_path}"


def run(root: str, *extra: str, job: Any = None, name: str = "probe") -> int:
    def succeed(config: JobConfig) -> dict[str, Any]:
        return SUMMARY

    argv = ["--set", f"artifact_root={root}", "--set", "run_id=r1", *extra]
    return cli.run_job(name, JobConfig, job or succeed, argv)


def records(root: str) -> Path:
    return Path(root.removeprefix("file://")) / "runs/tiny/r1/results"


def test_a_successful_job_records_exactly_what_it_prints(root: str, capsys):
    ticket = ResultTicket("dag:task:3", new_attempt_id())
    assert run(root, *ticket.job_args()) == ExitCode.OK
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    record = json.loads((records(root) / "dag:task:3.json").read_text())
    assert json.dumps(record["summary"], sort_keys=True) == printed
    assert record["summary"] == SUMMARY
    assert record["name"] == "dag:task:3" and record["job"] == "probe"
    assert record["attempt_id"] == ticket.attempt_id and record["format"] == RECORD_FORMAT
    assert record["config"] == JobConfig(artifact_root=root, run_id="r1").model_dump(mode="json")
    assert record["started_at"] <= record["finished_at"]
    assert set(record["execution"]) == {"host", "pid"}


def test_at_a_shell_the_record_is_named_after_the_job(root: str, monkeypatch):
    monkeypatch.setenv("AWS_BATCH_JOB_ID", "b-123")  # as Batch sets it in the container
    assert run(root, name="embed_verify") == ExitCode.OK
    record = json.loads((records(root) / "embed_verify.json").read_text())
    assert record["attempt_id"] is None
    assert record["execution"]["aws_batch_job_id"] == "b-123"


@pytest.mark.parametrize(
    "fails",
    [BadInputError("bad partition"), TransientError("store unreachable")],
    ids=["bad-input", "transient"],
)
def test_a_failed_job_writes_no_record(root: str, fails: Exception):
    def job(config: JobConfig) -> dict[str, Any]:
        raise fails

    assert run(root, job=job) in (ExitCode.BAD_INPUT, ExitCode.TRANSIENT)
    assert not Path(root.removeprefix("file://")).joinpath("runs").exists()


def test_only_global_rank_0_writes_under_torchrun(root: str, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    assert run(root) == ExitCode.OK
    assert capsys.readouterr().out  # every rank still prints its summary
    assert not records(root).exists()
    monkeypatch.setenv("RANK", "0")
    assert run(root) == ExitCode.OK
    assert (records(root) / "probe.json").exists()


def test_an_unusable_result_name_is_bad_input_before_the_job_runs(root: str, capsys):
    called = []

    def job(config: JobConfig) -> dict[str, Any]:
        called.append(config)
        return SUMMARY

    assert run(root, "--result-name", "../escape", job=job) == ExitCode.BAD_INPUT
    assert "invalid result name '../escape'" in capsys.readouterr().err
    assert called == [] and not Path(root.removeprefix("file://")).joinpath("runs").exists()


def test_result_names_are_unique_per_task_instance_and_always_a_path_segment():
    assert result_name("train") == "train"
    assert result_name("train", dag_id="refresh") == "refresh:train"
    assert result_name("embed", dag_id="refresh", map_index=3) == "refresh:embed:3"
    assert result_name("embed", dag_id="refresh", map_index=-1) == "refresh:embed"
    # A task "3" in a group "embed" is "embed.3": never the mapped "embed" at index 3.
    assert result_name("embed.3", dag_id="refresh") != result_name(
        "embed", dag_id="refresh", map_index=3
    )
    odd = [
        result_name("tâche", dag_id="refresh"),
        result_name("tache", dag_id="refresh"),
        result_name("a..b", dag_id="_private"),
        result_name("t" * 250, dag_id="d" * 250),
        result_name("t" * 250, dag_id="d" * 250, map_index=1),
    ]
    assert len(set(odd)) == len(odd)
    for name in odd:
        assert layout.safe_id(name, "result name") == name and len(name) <= 200


def test_the_layout_names_the_record():
    assert layout.result("tiny", "r1", "refresh:embed:0") == (
        "runs/tiny/r1/results/refresh:embed:0.json"
    )
    with pytest.raises(BadInputError, match="invalid result name"):
        layout.result("tiny", "r1", "a/b")
    with pytest.raises(BadInputError, match="invalid result name"):
        ResultTicket("a/b", new_attempt_id())


def test_a_record_is_read_back_only_by_the_execution_that_wrote_it(root: str):
    settings = {"artifact_root": root, "run_id": "r1", "model": "tiny"}
    ticket = ResultTicket("refresh:train", new_attempt_id())
    url = f"{root}/runs/tiny/r1/results/refresh:train.json"

    with pytest.raises(MissingResultError, match="wrote no result record at") as missing:
        read_result(settings, ticket, "probe")
    assert missing.value.url == url

    assert run(root, *ticket.job_args()) == ExitCode.OK
    record, read_url = read_result(settings, ticket, "probe")
    assert record.summary == SUMMARY and read_url == url

    later = ResultTicket(ticket.name, new_attempt_id())
    with pytest.raises(StaleResultError, match="left by another execution") as stale:
        read_result(settings, later, "probe")
    assert stale.value.url == url and ticket.attempt_id in str(stale.value)
    with pytest.raises(StaleResultError):
        read_result(settings, ticket, "train")  # same name and attempt, another job

    path = Path(url.removeprefix("file://"))
    document = json.loads(path.read_text())
    path.write_text(json.dumps({**document, "format": RECORD_FORMAT + 1}))
    with pytest.raises(InvalidResultError, match="this reader knows up to"):
        read_result(settings, ticket, "probe")
    path.write_text(json.dumps({"summary": SUMMARY}))
    with pytest.raises(InvalidResultError, match="is not a result record"):
        read_result(settings, ticket, "probe")
    path.write_text("{torn")
    with pytest.raises(InvalidResultError, match="cannot be read"):
        read_result(settings, ticket, "probe")


def test_a_ticket_survives_a_deferral_as_json():
    ticket = ResultTicket("refresh:embed:1", new_attempt_id())
    assert ResultTicket.from_dict(json.loads(json.dumps(ticket.to_dict()))) == ticket
    assert ticket.job_args() == [
        "--result-name",
        "refresh:embed:1",
        "--attempt-id",
        ticket.attempt_id,
    ]
    assert new_attempt_id() != new_attempt_id()
