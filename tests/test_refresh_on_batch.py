"""The refresh with every job step on AWS Batch, by the deployment's one setting
(``EMBEDFRESH_EXECUTION_MODE=aws_batch``, operators/resources.py), does what the local
run does.

``dag.test()`` of ``dags/embedding_model_refresh.py`` in a fresh interpreter reaches
moto's Batch over HTTP (``AWS_ENDPOINT_URL``); tests/batch_harness.py's executor runs
each submitted job as the container's command, a local process, with Batch's states,
attempts and CloudWatch log streams. The same refresh runs on the same generated data
on Batch, with the embed mapped over shard groups and with the embed as one array job
per corpus (a test each), and is compared with the local run: the session's golden run
(tests/golden.py, the refresh tests/test_dags.py checks; made once, read here). Their
XComs must be equal except what cannot be: timing, the run id (in versions and URLs),
cache hits, where each ran, its artifact root and its database; floats are equal to 1e-12
relative (a bootstrap quantile of the gate has differed by one ulp between two processes).

Each fan-out's Batch run is made once (the module's ``batch_refresh``) and read by two
tests: the XComs against the local run's, and each task's result record, which under
Batch is the only way a job's summary reaches its operator, written by that task's own
Batch job (tests/test_runner_results.py: a record no job wrote is refused).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from embedfresh.core import layout
from embedfresh.core.results import child_result_name
from embedfresh.core.settings import INDEX_DSN_ENV
from tests.batch_harness import (
    QUEUE,
    SINGLE,
    ExecutedJob,
    describe,
    moto_batch_server,
    run_batch_executor,
)
from tests.golden import REFRESH, Golden, fresh_database
from tests.test_dags import Run, run_dag

#: The jobs of the refresh's steps (as Batch job names start): each must have been submitted.
JOBS = (
    "health", "compile", "train", "evaluate", "gate", "embed", "embed_verify", "index_load",
    "search_check", "release",
)  # fmt: skip

#: XCom fields that differ between two runs of the same refresh by nature.
TIMING = re.compile(r"(^|_)(s|seconds?|ms|at|rate|elapsed|started|ended|duration|wall)(_|$)")
#: Where a step ran and what it found already there (the compile cache's hits: the runs
#: share no cache, but a second compile in one run may).
WHERE = {"runner", "host", "job_id", "log_url", "job_url", "pid", "cache_hit", "cache_hits"}
#: What a step's wall time prices.
COST = {"compute_hours", "estimated_cost_usd"}
#: A release's own table of the vector index (named after the release).
TABLE = re.compile(r"\bemb_[a-z0-9_]+_[0-9a-f]{12}\b")


@dataclass(frozen=True)
class BatchRefresh:
    """A refresh whose every job step ran on (moto's) AWS Batch."""

    fan_out: str
    run: Run
    database: str
    """Its index database's name on the session's server."""
    executed: list[ExecutedJob]
    """Every job attempt the executor ran, in order."""
    submits: list[dict[str, Any]]
    """Every SubmitJob request."""
    described: dict[str, dict[str, Any]]
    """Batch's own DescribeJobs record of each executed job, by job id."""


@pytest.fixture(scope="module", params=["mapped", "array"])
def batch_refresh(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    golden_session: Golden,
    pg_server: str,
) -> BatchRefresh:
    """The refresh on AWS Batch, the embed mapped over shard groups or one array job per
    corpus (``EMBEDFRESH_EMBED_FAN_OUT``), after the local one (so the golden run is
    made first, and on the local runner)."""
    fan_out = request.param
    # The "image's" python is this venv's, first on its PATH.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with (
        pytest.MonkeyPatch.context() as env,
        contextmanager(moto_batch_server)(env) as batch,
        contextmanager(run_batch_executor)(
            env, runnable_delay=0.1, max_parallel=2, extra_env={"PATH": path}
        ) as executor,
    ):
        # Each run its own database of one PostgreSQL with pgvector, as production has
        # it: the worker's EMBEDFRESH_INDEX_DSN for the local run, the job definition's
        # secret (the "image's" environment here) for the Batch run.
        env.delenv(INDEX_DSN_ENV, raising=False)
        env.setenv("EMBEDFRESH_EXECUTION_MODE", "aws_batch")
        env.setenv("EMBEDFRESH_BATCH_JOB_QUEUE", QUEUE)
        env.setenv("EMBEDFRESH_BATCH_JOB_DEFINITION", SINGLE)
        env.setenv("EMBEDFRESH_BATCH_POLL_INTERVAL", "0.2")
        env.setenv("EMBEDFRESH_EMBED_FAN_OUT", fan_out)
        database = f"{fan_out}_{uuid.uuid4().hex[:8]}"
        executor.extra_env[INDEX_DSN_ENV] = fresh_database(pg_server, database)
        run = run_dag(REFRESH, tmp_path_factory.mktemp(f"batch-{fan_out}"), request)
        assert run.facts["state"] == "success", (
            run.facts["tasks"],
            run.output,
            job_outputs(executor.executed)[-3000:],
        )
        executed = list(executor.executed)
        described = {e.job_id: describe(batch.client, e.job_id) for e in executed}
        return BatchRefresh(fan_out, run, database, executed, list(executor.submits), described)


def normal(value: Any, run_id: str) -> Any:
    """``value`` with the run id replaced and timing and whereabouts dropped."""
    if isinstance(value, dict):
        return {
            k: normal(v, run_id)
            for k, v in value.items()
            if not TIMING.search(k) and k not in WHERE | COST
        }
    if isinstance(value, list):
        return [normal(v, run_id) for v in value]
    if isinstance(value, str):
        return TABLE.sub("<table>", value.replace(run_id, "<run>"))
    return value


#: A mapped embed's report (one per map index; the XCom read back is any one of them).
EMBED_REPORT = re.compile(r"(reports/embed-[a-z0-9_]+)-\d+\.json")


def xcoms(run, database: str) -> dict[str, Any]:
    """The run's XComs, normal, with its own artifact root and database named alike."""
    text = json.dumps(normal(run.facts["xcom"], run.facts["run_id"]))
    text = EMBED_REPORT.sub(r"\1-<i>.json", text)
    return json.loads(text.replace(run.root, "<root>").replace(database, "<database>"))


@pytest.mark.slow
def test_the_refresh_on_aws_batch_does_what_the_local_run_does(
    batch_refresh: BatchRefresh, golden_refresh: Golden
):
    local = golden_refresh.run
    assert local.facts["state"] == "success", local.output
    # Every job step of the local run ran on the local runner, none on Batch: each step's
    # cost record (reports/cost/) says where it ran.
    costs = [json.loads(p.read_text()) for p in sorted((local.reports / "cost").rglob("*.json"))]
    assert sorted({c["job"] for c in costs}) == sorted(JOBS), costs
    assert {c["runner"] for c in costs} == {"local"}, costs
    want = xcoms(local, golden_refresh.database)

    run = batch_refresh.run
    names = " ".join(s["jobName"] for s in batch_refresh.submits)
    assert [j for j in JOBS if f"embedfresh-{j}-" not in names] == [], names
    got = xcoms(run, batch_refresh.database)
    if batch_refresh.fan_out == "array":  # one array job per corpus: no shard list
        assert got.pop("list_shards") is None and want.pop("list_shards")
        assert any(s.get("arrayProperties") for s in batch_refresh.submits)
        embed = got.pop("embed")  # the whole corpus's, where a mapped one has its group's
        assert embed["rows"] == want["verify"]["rows"] == 600, embed
        got["embed"] = want["embed"]
    assert differences(got, want) == [], batch_refresh.fan_out


#: The refresh's tasks that run a job, each leaving its result record (tasks mapped over
#: corpora or shard groups: one per map index).
RECORDED = (
    "health", "compile", "train", "evaluate", "gate", "embed", "verify", "load_index",
    "search_check", "release",
)  # fmt: skip


@pytest.mark.slow
def test_each_task_returns_the_record_its_own_batch_job_wrote(batch_refresh: BatchRefresh):
    """Each Batch job that ran a task's step wrote that task instance's result record,
    naming the job; the job printed exactly the record's summary, which is the task's
    XCom; the task's cost record is Batch's own clock of that job's attempts. Nothing
    failed or ran twice."""
    run, executed = batch_refresh.run, batch_refresh.executed
    results = run.artifacts / layout.results("tiny", run.facts["run_id"])
    records = {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}
    named: dict[str, dict[str, Any]] = {}  # record name -> the record its job wrote
    jobs_of: dict[str, set[str]] = {}  # a task's result name -> its Batch jobs
    for job in executed:
        assert job.exit_code == 0, job_outputs([job])
        assert batch_refresh.described[job.job_id]["status"] == "SUCCEEDED"
        task = name = job.command[job.command.index("--result-name") + 1]
        if job.array_index is not None:  # an array child's: its parent's, suffixed
            name = child_result_name(name, job.array_index)
        record = records[name]
        assert record["execution"]["aws_batch_job_id"] == job.job_id, name
        assert record["name"] == name and record["config"]["run_id"] == run.facts["run_id"]
        assert job.stdout.strip().splitlines()[-1] == json.dumps(record["summary"], sort_keys=True)
        assert name not in named, f"{name}: written by two jobs"
        named[name] = record
        jobs_of.setdefault(task, set()).add(job.job_id)
    # Every other record is an array embed's plan, which the operator runs on the worker.
    on_worker = {n: r for n, r in records.items() if n not in named}
    assert all(n.endswith("+plan") for n in on_worker), sorted(on_worker)
    assert bool(on_worker) == (batch_refresh.fan_out == "array"), sorted(on_worker)
    assert not [r for r in on_worker.values() if "aws_batch_job_id" in r["execution"]]

    # Each task's XCom is its record's summary (a mapped task's: one of its instances').
    for task in RECORDED:
        mine = re.compile(rf"embedding_model_refresh:{task}(:\d+)?(\+\d+)?")
        summaries = [r["summary"] for n, r in named.items() if mine.fullmatch(n)]
        assert summaries, f"{task}: no record of it in {sorted(named)}"
        if task == "embed" and batch_refresh.fan_out == "array":
            continue  # the operator's sum over its children's; its rows are checked above
        assert run.facts["xcom"][task] in summaries, task

    costs = {p.stem: json.loads(p.read_text()) for p in (run.reports / "cost").rglob("*.json")}
    assert sorted(c["task"] for c in costs.values()) == sorted([*jobs_of, *on_worker])
    for stem, cost in costs.items():
        assert stem == cost["attempt_id"] and cost["failed_attempts"] == 0, cost
        assert cost["estimated_cost_usd"] > 0, cost
        if cost["task"] in on_worker:  # an array embed's plan: the worker's clock
            assert cost["runner"] == "local", cost
            continue
        assert cost["runner"] == "aws_batch", cost
        # Batch's clock of exactly this task's jobs, one attempt each.
        assert {a["job_id"] for a in cost["attempts"]} == jobs_of[cost["task"]], cost
        assert len(cost["attempts"]) == len(jobs_of[cost["task"]]), cost
        for attempt in cost["attempts"]:
            [batch] = batch_refresh.described[attempt["job_id"]]["attempts"]
            assert attempt["seconds"] == (batch["stoppedAt"] - batch["startedAt"]) / 1000


def job_outputs(executed: list[ExecutedJob]) -> str:
    """Each job attempt's command, exit code and output tail (for a failure's message)."""
    return "\n".join(
        f"{e.command} -> {e.exit_code} {e.status_reason}\n{e.stdout[-1500:]}{e.stderr[-3000:]}"
        for e in executed
    )


class _Missing:
    """A key one side of a comparison lacks: equal to nothing, ``None`` included."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def differences(got: Any, want: Any, at: str = "") -> list[str]:
    """Where two XCom trees differ, as ``path: got != want`` lines; two floats differ
    when they do beyond 1e-12 relative (the last bits of a bootstrap quantile of the
    gate have differed between two processes)."""
    if isinstance(got, dict) and isinstance(want, dict):
        return [
            line
            for k in sorted(set(got) | set(want))
            for line in differences(got.get(k, MISSING), want.get(k, MISSING), f"{at}.{k}")
        ]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [
            line
            for i, pair in enumerate(zip(got, want, strict=True))
            for line in differences(*pair, f"{at}[{i}]")
        ]
    if isinstance(got, float) and isinstance(want, float):
        return [] if math.isclose(got, want, rel_tol=1e-12) else [f"{at}: {got!r} != {want!r}"]
    return [] if got == want else [f"{at}: {got!r} != {want!r}"]
