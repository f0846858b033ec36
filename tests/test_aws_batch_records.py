"""What the AWS Batch runner reads off Batch's own records: an array job's end, the cost
of every attempt, the job name a retry finds, the log streams it copies.

Pure functions over DescribeJobs records shaped as Batch returns them (times in epoch
milliseconds); the runs through the test executor are in tests/test_aws_batch_attach.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from embedfresh.core.cost import PRICES_USD
from embedfresh.core.results import ResultTicket
from embedfresh.operators.job_spec import JobSpec
from embedfresh.operators.runners.aws_batch import (
    AwsBatchRunner,
    BatchSettings,
    array_result,
    batch_cost,
    log_streams,
)

T0 = 1_764_000_000_000  # ms


def attempt(start_s: float, stop_s: float, code: int | None, reason: str = "") -> dict[str, Any]:
    container: dict[str, Any] = {"logStreamName": f"def/default/{int(start_s)}"}
    if code is not None:
        container["exitCode"] = code
    return {
        "startedAt": T0 + int(start_s * 1000),
        "stoppedAt": T0 + int(stop_s * 1000),
        "statusReason": reason or "Essential container in task exited",
        "container": container,
    }


def child(index: int, status: str, *attempts: dict[str, Any]) -> dict[str, Any]:
    return {
        "jobId": f"parent:{index}",
        "jobName": "embedfresh-embed-r1-abc",
        "status": status,
        "statusReason": attempts[-1]["statusReason"] if attempts else "",
        "arrayProperties": {"index": index},
        "attempts": list(attempts),
    }


def parent(status: str, size: int) -> dict[str, Any]:
    return {
        "jobId": "parent",
        "jobName": "embedfresh-embed-r1-abc",
        "status": status,
        "arrayProperties": {"size": size, "statusSummary": {}},
    }


HOST_LOST = "Host EC2 (instance i-0abc) terminated."


def test_an_array_succeeds_only_when_every_child_did():
    ok = [child(i, "SUCCEEDED", attempt(0, 10, 0)) for i in range(3)]
    result = array_result(parent("SUCCEEDED", 3), ok)
    assert result is not None and result.exit_code == 0
    assert result.details["children"] == {"SUCCEEDED": 3}
    assert array_result(parent("RUNNING", 3), ok) is None


@pytest.mark.parametrize(
    "codes, expected",
    [
        ([0, 75, 0], 75),  # Batch's retries ran out on a transient fault: retry the task
        ([0, None, 0], 75),  # a host lost on the last attempt: no exit code at all
        ([1, 75, 0], 1),  # a crash outranks a transient fault
        ([75, 1, 2], 2),  # a bad input is final: retrying cannot help
    ],
)
def test_a_failed_array_exits_with_its_most_final_childs_code(codes, expected):
    children = [
        child(
            i,
            "SUCCEEDED" if code == 0 else "FAILED",
            attempt(0, 5, code, HOST_LOST if code is None else ""),
        )
        for i, code in enumerate(codes)
    ]
    result = array_result(parent("FAILED", len(codes)), children)
    assert result is not None and result.exit_code == expected
    failed = [c for c in codes if c != 0]
    assert result.details["children"]["FAILED"] == len(failed)
    # The tail names each failed child, so the task log says which slice to look at.
    for i, code in enumerate(codes):
        named = f"child parent:{i} exited" in result.tail
        assert named == (code != 0)


def test_the_cost_counts_every_attempt_failed_ones_included_from_batchs_clock():
    retried = {
        "jobId": "j1",
        "jobName": "embedfresh-train-r1-abc",
        "status": "SUCCEEDED",
        "attempts": [attempt(0, 40, None, HOST_LOST), attempt(100, 190, 0)],
    }
    cost = batch_cost(retried, [], instance_type="trn1.32xlarge", nodes=2)
    assert [a["seconds"] for a in cost["attempts"]] == [40.0, 90.0]
    assert cost["failed_attempts"] == 1
    assert cost["seconds"] == 130.0
    assert cost["instance_hours"] == pytest.approx(2 * 130 / 3600, abs=1e-6)
    assert cost["estimated_cost_usd"] == pytest.approx(
        2 * 130 / 3600 * PRICES_USD["trn1.32xlarge"], abs=1e-6
    )
    assert cost["attempts"][0]["started_at"].startswith("2025-11-24T")


def test_an_array_costs_the_sum_of_its_childrens_attempts():
    children = [
        child(0, "SUCCEEDED", attempt(0, 10, 0)),
        child(1, "SUCCEEDED", attempt(0, 3, 75), attempt(5, 17, 0)),
    ]
    cost = batch_cost(parent("SUCCEEDED", 2), children, instance_type="cpu")
    assert [(a["job_id"], a["array_index"], a["attempt"]) for a in cost["attempts"]] == [
        ("parent:0", 0, 1),
        ("parent:1", 1, 1),
        ("parent:1", 1, 2),
    ]
    assert cost["seconds"] == 25.0 and cost["failed_attempts"] == 1 and cost["children"] == 2


def test_an_attempt_that_never_started_a_container_costs_nothing():
    never = {
        "jobId": "j",
        "status": "FAILED",
        "attempts": [{"statusReason": "Task failed to start", "container": {}}],
    }
    cost = batch_cost(never, [], instance_type="cpu")
    assert cost["seconds"] == 0 and cost["attempts"][0]["seconds"] == 0.0


def runner() -> AwsBatchRunner:
    return AwsBatchRunner(BatchSettings(job_definition="d", job_queue="q"))


def spec(name: str, run_id: str = "scheduled__2026-01-02T00:00:00+00:00") -> JobSpec:
    return JobSpec("embed", {"run_id": run_id}, result=ResultTicket(name=name, attempt_id="a" * 32))


def test_the_job_name_is_one_per_task_instance_and_the_same_on_every_try():
    r = runner()
    first = r.job_name(spec("corpus_embeddings:embed:3"))
    # Another try of the same task instance has another attempt id, and the same name.
    retry = JobSpec("embed", {"run_id": "scheduled__2026-01-02T00:00:00+00:00"},
                    result=ResultTicket(name="corpus_embeddings:embed:3", attempt_id="b" * 32))  # fmt: skip
    assert r.job_name(retry) == first
    others = {
        r.job_name(spec("corpus_embeddings:embed:4")),
        r.job_name(spec("embedding_model_refresh:embed:3")),
        r.job_name(spec("corpus_embeddings:embed:3", run_id="manual__2026-01-03")),
    }
    assert first not in others and len(others) == 3
    long = r.job_name(spec("x" * 150, run_id="y" * 300))
    assert len(long) <= 128 and long.startswith("embedfresh-embed-")
    assert all(c.isalnum() or c in "-_" for c in first)


def test_an_array_request_carries_its_size_and_the_result_tags():
    request = runner().submit_job_request(
        JobSpec("embed", {"run_id": "r"}, result=ResultTicket("t", "c" * 32), array_size=12)
    )
    assert request["arrayProperties"] == {"size": 12}
    assert request["tags"] == {"embedfresh:result-name": "t", "embedfresh:attempt-id": "c" * 32}
    plain = runner().submit_job_request(JobSpec("embed", {"run_id": "r"}))
    assert "arrayProperties" not in plain and "tags" not in plain
    with pytest.raises(ValueError, match="array_size must be 1"):
        JobSpec("embed", array_size=10_001)
    multi = AwsBatchRunner(BatchSettings(job_definition="d", job_queue="q", num_nodes=2))
    with pytest.raises(ValueError, match="no multi-node job as an array"):
        multi.submit_job_request(JobSpec("embed", array_size=2))


def test_the_log_streams_are_every_attempts_oldest_first_then_the_running_one():
    job = {
        "attempts": [attempt(0, 1, None, HOST_LOST), attempt(2, 3, 75)],
        "container": {"logStreamName": "def/default/running"},
    }
    assert log_streams(job) == ["def/default/0", "def/default/2", "def/default/running"]
    assert log_streams({}) == []
