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
cache hits, where each ran, its artifact root and its database.
"""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from embedfresh.core.settings import INDEX_DSN_ENV
from tests.batch_harness import QUEUE, SINGLE, moto_batch_server, run_batch_executor
from tests.golden import REFRESH, fresh_database
from tests.test_dags import run_dag

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


@pytest.fixture
def batch(monkeypatch: pytest.MonkeyPatch):
    yield from moto_batch_server(monkeypatch)


@pytest.fixture
def executor(batch, monkeypatch: pytest.MonkeyPatch):
    # The "image's" python is this venv's, first on its PATH.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    yield from run_batch_executor(
        monkeypatch, runnable_delay=0.1, max_parallel=2, extra_env={"PATH": path}
    )


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
@pytest.mark.parametrize("fan_out", ["mapped", "array"])
def test_the_refresh_on_aws_batch_does_what_the_local_run_does(
    fan_out: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    golden_refresh,
    executor,
    pg_server: str,
    monkeypatch,
):
    # Each run its own database of one PostgreSQL with pgvector, as production has it:
    # the worker's EMBEDFRESH_INDEX_DSN for the local run (the golden run's, made by
    # tests/golden.py), the job definition's secret (the "image's" environment here) for
    # the Batch run.
    local = golden_refresh.run
    assert local.facts["state"] == "success", local.output
    # Every job step of the local run ran on the local runner, none on Batch: each step's
    # cost record (reports/cost/) says where it ran.
    costs = [json.loads(p.read_text()) for p in sorted((local.reports / "cost").rglob("*.json"))]
    assert sorted({c["job"] for c in costs}) == sorted(JOBS), costs
    assert {c["runner"] for c in costs} == {"local"}, costs
    want = xcoms(local, golden_refresh.database)

    monkeypatch.delenv(INDEX_DSN_ENV, raising=False)
    monkeypatch.setenv("EMBEDFRESH_EXECUTION_MODE", "aws_batch")
    monkeypatch.setenv("EMBEDFRESH_BATCH_JOB_QUEUE", QUEUE)
    monkeypatch.setenv("EMBEDFRESH_BATCH_JOB_DEFINITION", SINGLE)
    monkeypatch.setenv("EMBEDFRESH_BATCH_POLL_INTERVAL", "0.2")
    monkeypatch.setenv("EMBEDFRESH_EMBED_FAN_OUT", fan_out)
    database = f"{fan_out}_{uuid.uuid4().hex[:8]}"
    executor.extra_env[INDEX_DSN_ENV] = fresh_database(pg_server, database)
    run = run_dag(REFRESH, tmp_path, request)
    assert run.facts["state"] == "success", (
        run.facts["tasks"],
        run.output,
        job_outputs(executor)[-3000:],
    )
    names = " ".join(s["jobName"] for s in executor.submits)
    assert [j for j in JOBS if f"embedfresh-{j}-" not in names] == [], names
    got = xcoms(run, database)
    if fan_out == "array":  # one array job per corpus: no shard list, one embed summary
        assert got.pop("list_shards") is None and want.pop("list_shards")
        assert any(s.get("arrayProperties") for s in executor.submits)
        embed = got.pop("embed")  # the whole corpus's, where a mapped one has its group's
        assert embed["rows"] == want["verify"]["rows"] == 600, embed
        got["embed"] = want["embed"]
    assert got == want, (fan_out, differences(got, want))


def job_outputs(executor) -> str:
    """Every job attempt's command, exit code and output tail (for a failure's message)."""
    return "\n".join(
        f"{e.command} -> {e.exit_code} {e.status_reason}\n{e.stdout[-1500:]}{e.stderr[-3000:]}"
        for e in executor.executed
    )


def differences(got: Any, want: Any, at: str = "") -> list[str]:
    """Where two XCom trees differ, as ``path: got != want`` lines."""
    if isinstance(got, dict) and isinstance(want, dict):
        return [
            line
            for k in sorted(set(got) | set(want))
            for line in differences(got.get(k), want.get(k), f"{at}.{k}")
        ]
    return [] if got == want else [f"{at}: {got!r} != {want!r}"]
