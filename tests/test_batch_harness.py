"""The test-side AWS Batch executor (tests/batch_harness.py), seen only through boto3.

Every check here reads what a product would read: DescribeJobs, ListJobs, GetLogEvents,
over moto's API (in process, and over HTTP for the server variant); the processes the
jobs run are small shell or Python one-liners so that each test takes a second or two.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from embedfresh.operators.runners.aws_batch import EVALUATE_ON_EXIT
from tests.batch_harness import (
    COMPUTE_ENV,
    LOG_GROUP,
    MULTI,
    PYTHON,
    QUEUE,
    REGION,
    SINGLE,
    BatchExecutor,
    BatchServer,
    InvalidAwsResponse,
    LocalBatchExecutor,
    describe,
    log_lines,
    moto_batch,
    moto_batch_server,
    refused_responses,
    retry_action,
    run_batch_executor,
    validate_response,
)

RETRY = {"attempts": 3, "evaluateOnExit": [dict(rule) for rule in EVALUATE_ON_EXIT]}


@pytest.fixture
def batch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    yield from moto_batch(monkeypatch)


@pytest.fixture
def executor(batch: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[BatchExecutor]:
    yield from run_batch_executor(monkeypatch)


@pytest.fixture
def logs(batch: Any) -> Any:
    import boto3

    return boto3.client("logs")


def submit(client: Any, name: str, script: str, **request: Any) -> str:
    """Submit ``sh -c script`` on the fixture's queue; the job id."""
    overrides = request.pop("containerOverrides", {})
    return client.submit_job(
        jobName=name,
        jobQueue=QUEUE,
        jobDefinition=SINGLE,
        containerOverrides={"command": ["sh", "-c", script], **overrides},
        **request,
    )["jobId"]


def watch(client: Any, job_id: str, timeout: float = 30) -> list[dict[str, Any]]:
    """DescribeJobs records of ``job_id`` every 20 ms until it ended."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.append(describe(client, job_id))
        if seen[-1]["status"] in ("SUCCEEDED", "FAILED"):
            return seen
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} still {seen[-1]['status']} after {timeout}s")


def gone(pid: int) -> bool:
    """No such process (or only its zombie entry, waiting for a reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


# --- one job ----------------------------------------------------------------------------


def test_a_job_runs_after_submit_returns_with_a_running_window_and_batchs_env(
    batch, executor, logs
):
    script = 'echo "id=$AWS_BATCH_JOB_ID attempt=$AWS_BATCH_JOB_ATTEMPT"; env | sort; sleep 0.6'
    submitted = time.time() * 1000
    job_id = submit(
        batch,
        "one",
        script,
        containerOverrides={"environment": [{"name": "FROM_DEFINITION", "value": "over"}]},
    )
    returned = time.time() * 1000
    seen = watch(batch, job_id)
    statuses = [s["status"] for s in seen]
    # Not ended inside SubmitJob: RUNNABLE first, then a RUNNING window, then the end.
    assert statuses[0] in ("SUBMITTED", "RUNNABLE") and statuses[-1] == "SUCCEEDED"
    order = [s for i, s in enumerate(statuses) if i == 0 or statuses[i - 1] != s]
    order = order[1:] if order[0] == "SUBMITTED" else order
    assert order in (
        ["RUNNABLE", "RUNNING", "SUCCEEDED"],
        ["RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED"],
    )
    running = [s for s in seen if s["status"] == "RUNNING"]
    assert len(running) >= 3  # ~0.6 s, looked at every 20 ms
    assert all("startedAt" in s and "stoppedAt" not in s for s in running)
    assert all(s["attempts"] == [] for s in running)  # attempts lists ended ones
    assert running[0]["container"]["logStreamName"].startswith(f"{SINGLE}/default/")

    job = seen[-1]
    [attempt] = job["attempts"]
    assert attempt["container"]["exitCode"] == 0 and job["container"]["exitCode"] == 0
    assert attempt["statusReason"] == job["statusReason"] == "Essential container in task exited"
    assert returned <= attempt["startedAt"] and submitted <= job["createdAt"] <= returned
    assert 550 <= attempt["stoppedAt"] - attempt["startedAt"] < 5000
    assert (job["startedAt"], job["stoppedAt"]) == (attempt["startedAt"], attempt["stoppedAt"])

    stream = attempt["container"]["logStreamName"]
    assert job["container"]["logStreamName"] == stream
    task_id = stream.removeprefix(f"{SINGLE}/default/")
    assert len(task_id) == 32 and int(task_id, 16) >= 0
    lines = log_lines(logs, stream)
    assert lines[0] == f"id={job_id} attempt=1"
    env = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    assert env["FROM_DEFINITION"] == "over"  # the overrides over the definition's
    assert env["AWS_BATCH_JQ_NAME"] == QUEUE and env["AWS_BATCH_CE_NAME"] == COMPUTE_ENV
    assert "AWS_BATCH_JOB_ARRAY_INDEX" not in env
    assert "AWS_SECRET_ACCESS_KEY" not in env  # the image's env, not the test's
    assert executor.by_job_id(job_id).stdout.splitlines() == lines


def test_the_call_record_and_list_jobs_as_aws_answers_it(batch, executor):
    job_id = submit(batch, "listed", "sleep 0.5")
    executor.wait_for(job_id, "RUNNING")
    # Without a status or a filter, ListJobs lists RUNNING jobs only (as AWS does).
    assert [j["jobId"] for j in batch.list_jobs(jobQueue=QUEUE)["jobSummaryList"]] == [job_id]
    executor.wait(job_id)
    assert batch.list_jobs(jobQueue=QUEUE)["jobSummaryList"] == []
    [found] = batch.list_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": ["listed"]}])[
        "jobSummaryList"
    ]
    assert found["jobId"] == job_id and found["status"] == "SUCCEEDED"
    assert found["container"]["exitCode"] == 0 and found["stoppedAt"] >= found["startedAt"]

    [call] = executor.calls_of("SubmitJob")
    assert call.job_id == job_id and call.request["jobName"] == "listed"
    assert executor.submits == [call.request]
    assert call.request["containerOverrides"]["command"] == ["sh", "-c", "sleep 0.5"]
    assert len(executor.calls_of("ListJobs")) == 3


# --- retries ----------------------------------------------------------------------------


def test_an_injected_host_fault_is_retried_by_evaluate_on_exit_with_both_attempts_timed(
    batch, executor, logs
):
    executor.fail(job_name="spot", attempt=1, fault="host", after=0.3)
    job_id = submit(
        batch, "spot", 'echo "attempt $AWS_BATCH_JOB_ATTEMPT"; sleep 0.8', retryStrategy=RETRY
    )
    job = executor.wait(job_id)
    assert job == describe(batch, job_id)
    assert job["status"] == "SUCCEEDED"
    lost, ran = job["attempts"]
    assert lost["statusReason"].startswith("Host EC2 (instance i-")
    assert lost["statusReason"].endswith(") terminated.")
    assert "exitCode" not in lost["container"]
    assert ran["container"]["exitCode"] == 0
    first = lost["stoppedAt"] - lost["startedAt"]
    second = ran["stoppedAt"] - ran["startedAt"]
    # Lost 0.3 s in, then a whole 0.8 s run: unequal, neither zero (slack for a busy box).
    assert 250 <= first < 2500 and 750 <= second < 10_000 and first != second
    assert lost["stoppedAt"] <= ran["startedAt"]
    assert job["startedAt"] == ran["startedAt"]  # the job's times are its last attempt's
    # Each attempt has its own log stream and knows its number.
    streams = [a["container"]["logStreamName"] for a in (lost, ran)]
    assert streams[0] != streams[1]
    assert [log_lines(logs, s) for s in streams] == [["attempt 1"], ["attempt 2"]]
    assert [e.attempt for e in executor.attempts_of(job_id)] == [1, 2]
    assert [e.exit_code for e in executor.attempts_of(job_id)] == [None, 0]
    assert len(executor.submits) == 1  # Batch retried, nobody submitted again


def test_exit_codes_retry_or_exit_per_the_rules(batch, executor):
    first_fails = '[ "$AWS_BATCH_JOB_ATTEMPT" = 1 ] && exit 75; exit 0'
    transient = submit(batch, "transient", first_fails, retryStrategy=RETRY)
    bad_input = submit(batch, "bad-input", "exit 2", retryStrategy=RETRY)
    # No rule matches exit 9: AWS retries it, up to the attempts.
    unmatched = submit(
        batch,
        "unmatched",
        'echo "$AWS_BATCH_JOB_ATTEMPT"; exit 9',
        retryStrategy={"attempts": 3, "evaluateOnExit": [{"onExitCode": "3", "action": "EXIT"}]},
    )
    job = executor.wait(transient)
    assert job["status"] == "SUCCEEDED"
    assert [a["container"]["exitCode"] for a in job["attempts"]] == [75, 0]
    job = executor.wait(bad_input)
    assert job["status"] == "FAILED" and job["statusReason"] == "Essential container in task exited"
    assert [a["container"]["exitCode"] for a in job["attempts"]] == [2]
    assert job["container"]["exitCode"] == 2
    job = executor.wait(unmatched)
    assert job["status"] == "FAILED" and len(job["attempts"]) == 3
    assert [e.stdout for e in executor.attempts_of(unmatched)] == ["1\n", "2\n", "3\n"]
    assert len(executor.submits) == 3


def test_an_exit_fault_and_a_pull_fault(batch, executor):
    executor.fail(job_name="pull", fault="pull")
    executor.fail(job_name="exit", attempt=1, fault="exit", exit_code=75, on_output="ready")
    pulled = submit(batch, "pull", "echo ran", retryStrategy=RETRY)
    script = 'echo ready; [ "$AWS_BATCH_JOB_ATTEMPT" = 1 ] && sleep 20; exit 0'
    exited = submit(batch, "exit", script, retryStrategy={"attempts": 2})
    job = executor.wait(pulled)
    assert job["status"] == "SUCCEEDED"
    failed, ok = job["attempts"]
    assert failed["statusReason"] == "Task failed to start"
    assert failed["container"]["reason"].startswith("CannotPullContainerError:")
    assert "exitCode" not in failed["container"] and ok["container"]["exitCode"] == 0
    assert [e.attempt for e in executor.attempts_of(pulled)] == [2]  # no process for 1

    job = executor.wait(exited)
    assert job["status"] == "SUCCEEDED"
    first, second = job["attempts"]
    # Ended when it printed "ready", reporting 75, well before its "sleep 20".
    assert first["container"]["exitCode"] == 75
    assert first["stoppedAt"] - first["startedAt"] < 5000
    assert second["container"]["exitCode"] == 0


def test_an_attempt_past_its_time_limit_is_killed_and_not_retried(
    batch, monkeypatch: pytest.MonkeyPatch
):
    executor = BatchExecutor(timeout=0.5).install(monkeypatch)
    try:
        job_id = submit(batch, "slow", "sleep 30", retryStrategy=RETRY)
        job = executor.wait(job_id, timeout=10)
        assert job["status"] == "FAILED"
        assert job["statusReason"] == "Job attempt duration exceeded timeout"
        [attempt] = job["attempts"]  # Batch does not retry a timed-out attempt
        assert "exitCode" not in attempt["container"]
        assert 450 <= attempt["stoppedAt"] - attempt["startedAt"] < 5000
        assert gone(executor.executed[0].pid)
    finally:
        executor.shutdown()


def test_what_the_executor_refuses_is_refused_as_batch_refuses(batch, executor):
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError, match="dependsOn"):
        submit(batch, "after", "true", dependsOn=[{"jobId": "x"}])
    with pytest.raises(ClientError, match="between 2 and 10000"):
        submit(batch, "one-child", "true", arrayProperties={"size": 1})
    with pytest.raises(ClientError, match="does not exist"):
        batch.submit_job(jobName="nowhere", jobQueue="no-such-queue", jobDefinition=SINGLE)
    assert executor.jobs == {} and len(executor.submits) == 3  # each request recorded


def test_retry_rules_follow_aws():
    rules = [dict(rule) for rule in EVALUATE_ON_EXIT]
    assert retry_action(rules, 75, "", "Essential container in task exited") == "RETRY"
    assert retry_action(rules, None, "", "Host EC2 (instance i-0abc) terminated.") == "RETRY"
    assert retry_action(rules, None, "CannotPullContainerError: x", "Task failed to start") == (
        "RETRY"
    )
    for code in (1, 2, 3, 4, 137):
        assert retry_action(rules, code, "", "Essential container in task exited") == "EXIT"
    # No rule matches: AWS retries; every given condition of a rule must match.
    assert retry_action([{"onExitCode": "3", "action": "EXIT"}], 4, "", "") == "RETRY"
    both = [{"onExitCode": "1*", "onStatusReason": "Host*", "action": "exit"}]
    assert retry_action(both, 12, "", "Host EC2") == "EXIT"
    assert retry_action(both, 12, "", "Essential") == "RETRY"
    assert retry_action([], 1, "", "") == "RETRY"


# --- arrays -----------------------------------------------------------------------------


def test_an_array_job_runs_every_child_two_at_a_time_and_sums_them_up_on_the_parent(
    batch, executor, logs
):
    executor.fail(job_name="array", array_index=1, attempt=1, fault="host", after=0.2)
    script = (
        'echo "$AWS_BATCH_JOB_ARRAY_INDEX/$AWS_BATCH_JOB_ARRAY_SIZE $AWS_BATCH_JOB_ID"; sleep 0.4'
    )
    parent_id = submit(batch, "array", script, arrayProperties={"size": 3}, retryStrategy=RETRY)
    seen = watch(batch, parent_id)
    statuses = [s["status"] for s in seen]
    assert statuses[0] in ("SUBMITTED", "PENDING") and statuses[-1] == "SUCCEEDED"
    assert "PENDING" in statuses and "RUNNING" in statuses
    during = [s["arrayProperties"]["statusSummary"] for s in seen if s["status"] == "RUNNING"]
    assert all(sum(counts.values()) == 3 for counts in during)
    assert max(counts["RUNNING"] + counts["STARTING"] for counts in during) <= 2
    parent = seen[-1]
    assert parent["arrayProperties"]["size"] == 3
    assert parent["arrayProperties"]["statusSummary"]["SUCCEEDED"] == 3
    assert parent["attempts"] == [] and "container" not in parent

    children = [describe(batch, f"{parent_id}:{i}") for i in range(3)]
    assert [c["arrayProperties"] for c in children] == [{"index": i} for i in range(3)]
    assert [len(c["attempts"]) for c in children] == [1, 2, 1]  # child 1 lost a host
    assert parent["startedAt"] == min(a["startedAt"] for c in children for a in c["attempts"])
    assert parent["stoppedAt"] == max(c["stoppedAt"] for c in children)
    for i, child in enumerate(children):
        stream = child["attempts"][-1]["container"]["logStreamName"]
        assert log_lines(logs, stream) == [f"{i}/3 {parent_id}:{i}"]
    # Never more than two processes at once.
    runs = executor.executed
    assert len(runs) == 4
    edges = sorted([(r.started_at, 1) for r in runs] + [(r.stopped_at, -1) for r in runs])
    assert max(sum(step for _, step in edges[: i + 1]) for i in range(len(edges))) == 2
    # ListJobs: the parent on the queue, the children under arrayJobId.
    listed = batch.list_jobs(jobQueue=QUEUE, jobStatus="SUCCEEDED")["jobSummaryList"]
    assert [j["jobId"] for j in listed] == [parent_id]
    kids = batch.list_jobs(arrayJobId=parent_id, jobStatus="SUCCEEDED")["jobSummaryList"]
    assert sorted(j["jobId"] for j in kids) == [f"{parent_id}:{i}" for i in range(3)]


def test_an_array_job_fails_once_every_child_ended_and_one_failed(batch, executor):
    script = '[ "$AWS_BATCH_JOB_ARRAY_INDEX" = 0 ] && exit 3; sleep 0.5'
    parent_id = submit(batch, "array-bad", script, arrayProperties={"size": 3}, retryStrategy=RETRY)
    first = executor.wait(f"{parent_id}:0")
    assert first["status"] == "FAILED" and first["container"]["exitCode"] == 3
    assert describe(batch, parent_id)["status"] in ("PENDING", "RUNNING")  # others still run
    parent = executor.wait(parent_id)
    assert parent["status"] == "FAILED"
    summary = parent["arrayProperties"]["statusSummary"]
    assert (summary["FAILED"], summary["SUCCEEDED"]) == (1, 2)


# --- stopping ---------------------------------------------------------------------------


def test_terminate_kills_the_process_group_and_ends_the_job_without_another_attempt(
    batch, executor, logs
):
    job_id = submit(batch, "stop-me", "sleep 30 & echo $!; wait", retryStrategy=RETRY)
    executor.wait_for(job_id, "RUNNING")
    deadline = time.monotonic() + 10
    while not executor.live_pids() or not log_lines(
        logs, describe(batch, job_id)["container"]["logStreamName"]
    ):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    [sleeper] = log_lines(logs, describe(batch, job_id)["container"]["logStreamName"])
    assert not gone(int(sleeper))
    batch.terminate_job(jobId=job_id, reason="Airflow task marked failed")
    job = executor.wait(job_id, timeout=10)
    assert job["status"] == "FAILED" and job["statusReason"] == "Airflow task marked failed"
    [attempt] = job["attempts"]  # Batch does not retry a terminated job
    assert attempt["container"]["exitCode"] == 143  # SIGTERM, as Docker reports it
    assert gone(int(sleeper)) and executor.live_pids() == []
    assert [c.request for c in executor.calls_of("TerminateJob")] == [
        {"jobId": job_id, "reason": "Airflow task marked failed"}
    ]


def test_terminating_an_array_parent_stops_every_child(batch, executor):
    parent_id = submit(batch, "stop-all", "sleep 30", arrayProperties={"size": 3})
    for index in (0, 1):  # two run, the third waits for a slot
        executor.wait_for(f"{parent_id}:{index}", "RUNNING")
    batch.terminate_job(jobId=parent_id, reason="cancelled by the user")
    parent = executor.wait(parent_id, timeout=10)
    assert parent["status"] == "FAILED"
    assert parent["arrayProperties"]["statusSummary"]["FAILED"] == 3
    children = [describe(batch, f"{parent_id}:{i}") for i in range(3)]
    assert {c["statusReason"] for c in children} == {"cancelled by the user"}
    assert [len(c["attempts"]) for c in children] == [1, 1, 0]  # the third never started
    assert executor.live_pids() == []


def test_cancel_stops_a_job_before_it_starts_and_leaves_a_running_one(
    batch, monkeypatch: pytest.MonkeyPatch
):
    executor = BatchExecutor(runnable_delay=0.5).install(monkeypatch)
    try:
        waiting = submit(batch, "waiting", "echo never")
        batch.cancel_job(jobId=waiting, reason="not needed")
        job = describe(batch, waiting)
        assert job["status"] == "FAILED" and job["statusReason"] == "not needed"
        assert job["attempts"] == [] and "startedAt" not in job

        running = submit(batch, "running", "sleep 0.8")
        executor.wait_for(running, "RUNNING")
        batch.cancel_job(jobId=running, reason="too late")  # AWS: a no-op once started
        assert executor.wait(running)["status"] == "SUCCEEDED"
        assert executor.executed[0].job_id == running  # the cancelled one never ran
    finally:
        executor.shutdown()


def test_shutdown_kills_what_still_runs_and_joins_every_thread(batch, monkeypatch):
    executor = BatchExecutor().install(monkeypatch)
    job_id = submit(batch, "left", "sleep 30 & sleep 30; wait")
    executor.wait_for(job_id, "RUNNING")
    [pid] = executor.live_pids()
    threads = set(threading.enumerate())
    assert any(t.name.startswith("batch-executor-") for t in threads)
    started = time.monotonic()
    executor.shutdown()
    assert time.monotonic() - started < 5
    assert gone(pid)
    left = [t.name for t in threading.enumerate() if t.name.startswith(("batch-executor-", job_id))]
    assert left == []


def test_installed_without_the_fixture_it_shuts_down_with_the_monkeypatch(batch):
    """``LocalBatchExecutor().install(monkeypatch)`` (the older tests' way): each job ends
    inside SubmitJob, and the monkeypatch's undo kills and joins what is left."""
    with pytest.MonkeyPatch.context() as patch:
        executor = LocalBatchExecutor().install(patch)
        done = submit(batch, "at-once", "echo done")
        assert describe(batch, done)["status"] == "SUCCEEDED"  # ended before SubmitJob returned
        executor.sync_submit = False
        left = submit(batch, "left-behind", "sleep 30")
        executor.wait_for(left, "RUNNING")
        [pid] = executor.live_pids()
    assert gone(pid)
    assert not [t for t in threading.enumerate() if t.name.startswith("batch-executor-")]


# --- logs -------------------------------------------------------------------------------


def test_log_lines_stream_while_the_job_runs(batch, executor, logs):
    job_id = submit(batch, "chatty", "echo first; echo warn >&2; sleep 0.8; echo second")
    executor.wait_for(job_id, "RUNNING")
    stream = describe(batch, job_id)["container"]["logStreamName"]
    deadline = time.monotonic() + 5
    while len(log_lines(logs, stream)) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert describe(batch, job_id)["status"] == "RUNNING"
    assert sorted(log_lines(logs, stream)) == ["first", "warn"]
    executor.wait(job_id)
    events = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=stream, startFromHead=True)[
        "events"
    ]
    assert [e["message"] for e in events][-1] == "second"
    assert events[-1]["timestamp"] - events[0]["timestamp"] >= 700  # when each was printed
    run = executor.by_job_id(job_id)
    assert (run.stdout, run.stderr) == ("first\nsecond\n", "warn\n")


def test_more_lines_than_one_page_of_get_log_events(batch, executor, logs):
    count = 12_345
    code = f"import sys\nfor i in range({count}): print(f'line {{i}} MARK-7f3a')"
    job_id = batch.submit_job(
        jobName="long-log",
        jobQueue=QUEUE,
        jobDefinition=SINGLE,
        containerOverrides={"command": [PYTHON, "-c", code]},
    )["jobId"]
    job = executor.wait(job_id)
    stream = job["container"]["logStreamName"]
    page = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=stream, startFromHead=True)
    assert 0 < len(page["events"]) < count  # one page does not hold it
    assert log_lines(logs, stream) == [f"line {i} MARK-7f3a" for i in range(count)]


# --- over HTTP --------------------------------------------------------------------------


@pytest.fixture
def batch_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[BatchServer]:
    yield from moto_batch_server(monkeypatch)


def test_the_server_variant_runs_jobs_that_other_processes_see(batch_server, monkeypatch):
    from moto.batch.models import batch_backends

    executor = BatchExecutor().install(monkeypatch)
    try:
        client = batch_server.client
        assert os.environ["AWS_ENDPOINT_URL"] == batch_server.endpoint_url
        executor.fail(job_name="served", attempt=1, fault="host", after=0.2)
        job_id = submit(client, "served", "echo served; sleep 0.5", retryStrategy=RETRY)
        executor.wait_for(job_id, "RUNNING")
        # Another process, through the endpoint in its environment, sees the same job.
        code = (
            "import boto3, sys; "
            "print(boto3.client('batch').describe_jobs(jobs=[sys.argv[1]])['jobs'][0]['jobName'])"
        )
        seen = subprocess.run(
            [sys.executable, "-c", code, job_id], capture_output=True, text=True, timeout=60
        )
        assert seen.stdout.strip() == "served", seen.stderr
        job = executor.wait(job_id)
        assert describe(client, job_id) == job
        assert job["status"] == "SUCCEEDED" and len(job["attempts"]) == 2
        stream = job["container"]["logStreamName"]
        assert log_lines(batch_server.logs, stream) == ["served"]
        assert [c.job_id for c in executor.calls_of("SubmitJob")] == [job_id]
        # One state: the server's backends are this process's.
        assert any(job_id in b._jobs for a in batch_backends.values() for b in a.values())
    finally:
        executor.shutdown()


def test_the_server_variant_resets_its_batch_state_between_tests(batch_server):
    # The previous test's job is gone, and the queue was created afresh.
    assert (
        batch_server.client.list_jobs(jobQueue=QUEUE, jobStatus="SUCCEEDED")["jobSummaryList"] == []
    )


# --- multi-node -------------------------------------------------------------------------


def test_a_multi_node_job_runs_a_process_per_node_and_ends_with_its_main_node(
    batch, executor, logs
):
    script = (
        'echo "node=$AWS_BATCH_JOB_NODE_INDEX/$AWS_BATCH_JOB_NUM_NODES'
        " main=$AWS_BATCH_JOB_MAIN_NODE_INDEX"
        ' at=${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:-self} id=$AWS_BATCH_JOB_ID";'
        ' [ "$AWS_BATCH_JOB_NODE_INDEX" = 0 ] && sleep 0.5 && exit 3; sleep 30'
    )
    job_id = batch.submit_job(
        jobName="nodes",
        jobQueue=QUEUE,
        jobDefinition=MULTI,
        nodeOverrides={
            "numNodes": 3,
            "nodePropertyOverrides": [
                {"targetNodes": "0:", "containerOverrides": {"command": ["sh", "-c", script]}}
            ],
        },
    )["jobId"]
    executor.wait_for(job_id, "RUNNING")
    assert [describe(batch, f"{job_id}#{i}")["status"] for i in range(3)] == ["RUNNING"] * 3
    job = executor.wait(job_id, timeout=20)
    # The main node exited 3 after 0.5 s: the job ended then, the other nodes stopped.
    assert job["status"] == "FAILED" and job["nodeProperties"]["numNodes"] == 3
    # As AWS: the job runs no container of its own (no log stream, no exit code); its
    # nodes are jobs of their own, each with its attempts and log stream.
    assert "container" not in job and "nodeDetails" not in job
    [attempt] = job["attempts"]
    assert "container" not in attempt
    assert attempt["stoppedAt"] - attempt["startedAt"] < 10_000
    nodes = [describe(batch, f"{job_id}#{i}") for i in range(3)]
    assert [n["nodeDetails"] for n in nodes] == [
        {"nodeIndex": i, "isMainNode": i == 0} for i in range(3)
    ]
    for node in nodes:
        [node_attempt] = node["attempts"]
        assert node_attempt["container"]["logStreamName"] == node["container"]["logStreamName"]
    assert len({n["container"]["logStreamName"] for n in nodes}) == 3
    assert nodes[0]["container"]["exitCode"] == 3 and nodes[0]["status"] == "FAILED"
    assert [n["container"]["exitCode"] for n in nodes[1:]] == [137, 137]  # stopped
    for i, node in enumerate(nodes):
        at = "self" if i == 0 else "127.0.0.1"
        assert log_lines(logs, node["container"]["logStreamName"]) == [
            f"node={i}/3 main=0 at={at} id={job_id}#{i}"
        ]
    assert executor.live_pids() == []


def test_the_runners_multi_node_launcher_runs_on_every_node(batch, executor, tmp_path, logs):
    """The product's own request for 2 nodes (its torchrun launcher), run node by node."""
    from embedfresh.operators import AwsBatchRunner, BatchSettings, JobSpec

    fake_python = tmp_path / "python"
    # Prints its arguments; the main node waits for the other (Batch ends the job, and
    # stops the other nodes, when the main node exits).
    fake_python.write_text(
        '#!/bin/sh\nprintf "%s\\n" "$@"\ntouch "$0.$AWS_BATCH_JOB_NODE_INDEX"\n'
        'n=0; while [ ! -e "$0.1" ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n+1)); done\n'
    )
    fake_python.chmod(0o755)
    runner = AwsBatchRunner(
        BatchSettings(
            job_definition=MULTI,
            job_queue=QUEUE,
            num_nodes=2,
            python=str(fake_python),
            aws_conn_id=None,
            region_name=REGION,
        )
    )
    job_id = runner.submit(JobSpec("train", nproc_per_node=4), logging.getLogger("test"))
    job = executor.wait(job_id)
    assert job["status"] == "SUCCEEDED"
    for i in range(2):
        node = describe(batch, f"{job_id}#{i}")
        argv = log_lines(logs, node["container"]["logStreamName"])
        assert argv[:8] == [
            "-m", "embedfresh.jobs.launch", "--nnodes", "2", "--node_rank", str(i),
            "--nproc-per-node", "4",
        ]  # fmt: skip
        master = argv[argv.index("--master_addr") + 1]
        assert master == "127.0.0.1" if i else master  # node 0: its own address


# --- AWS's shapes -----------------------------------------------------------------------


def test_a_field_of_the_wrong_type_fails_botocores_validation():
    record = {
        "jobId": "j", "jobName": "n", "jobQueue": "q", "jobDefinition": "d",
        "status": "RUNNING", "startedAt": 1_700_000_000_000,
    }  # fmt: skip
    validate_response("batch", "DescribeJobs", {"jobs": [record]})
    with pytest.raises(InvalidAwsResponse, match="startedAt"):
        validate_response("batch", "DescribeJobs", {"jobs": [{**record, "startedAt": "today"}]})
    with pytest.raises(InvalidAwsResponse, match="attempts"):
        validate_response("batch", "DescribeJobs", {"jobs": [{**record, "attempts": {}}]})
    with pytest.raises(InvalidAwsResponse, match="nextForwardToken"):
        validate_response("logs", "GetLogEvents", {"events": [], "nextForwardToken": 3})
    # botocore marks startedAt required; AWS leaves it out until the job starts.
    validate_response("batch", "DescribeJobs", {"jobs": [{**record, "status": "RUNNABLE"}]})
    with pytest.raises(InvalidAwsResponse, match="startedAt"):
        validate_response("batch", "DescribeJobs", {"jobs": [{**record, "startedAt": None}]})


def test_a_wrong_type_planted_in_a_record_is_refused_as_the_harness_answers(batch, executor):
    job_id = submit(batch, "planted", "sleep 30")
    executor.wait_for(job_id, "RUNNING")
    assert describe(batch, job_id)["status"] == "RUNNING"  # the real record passes
    job = executor.jobs[job_id]
    with executor.lock:
        started, job.started_ms = job.started_ms, "2026-11-28T10:00:00Z"  # not epoch ms
    with pytest.raises(Exception, match="startedAt"):
        describe(batch, job_id)  # moto answers, and the harness refuses it
    with pytest.raises(InvalidAwsResponse, match="startedAt"):
        executor.wait_for(job_id, "RUNNING")
    assert refused_responses and "startedAt" in str(refused_responses[0])
    with executor.lock:
        job.started_ms = started
    refused_responses.clear()  # planted: the fixture's teardown would fail the test
    batch.terminate_job(jobId=job_id, reason="planted")
