"""The refresh DAG on the production-like stack: Airflow on a fresh PostgreSQL database,
CeleryExecutor on Redis, api-server, scheduler, dag-processor, triggerer and two Celery
workers (concurrency 1 each) on 127.0.0.1, started once for the module and stopped at
its end, the database dropped (tests/stack/stack.py).

Without PostgreSQL or Redis on 127.0.0.1 the stack tests skip, naming the missing
service; under ``CI=true`` they fail.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.airflow.server import REFRESH, free_port, task_states
from tests.conftest import DATA, ROOT, job_env
from tests.stack import settings
from tests.stack.stack import (
    WORKERS,
    CeleryStack,
    command_lines,
    create_database,
    drop_database,
    require_services,
    stack_env,
)


def write_demo_store(root: str) -> None:
    """The demo store at the tests' small sizes (as tests/airflow/conftest.py's demo_store)."""
    sizes = {
        "--train-rows": DATA["train_rows"],
        "--eval-rows": DATA["eval_rows"],
        "--corpus-rows": DATA["corpus_rows"],
        "--corpus-shard-rows": DATA["corpus_shard_rows"],
    }
    done = subprocess.run(
        [sys.executable, "-m", "embedfresh.jobs.generate_data", "--root", root]
        + [str(x) for kv in sizes.items() for x in kv],
        cwd=ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CeleryStack]:
    """The stack with the demo store as its default artifact root, the refresh DAG
    parsed and unpaused (the scheduler's run of yesterday marked failed: the test
    triggers its own)."""
    require_services()
    started = time.monotonic()
    root = f"file://{tmp_path_factory.mktemp('stack-artifacts')}"
    write_demo_store(root)
    database = create_database()
    try:
        # A Redis database of its own (1-15; 0 is everyone's default) and a queue of its
        # own: two test runs on one Redis never take each other's tasks.
        server = CeleryStack(
            tmp_path_factory.mktemp("stack-home"),
            root,
            database,
            redis_db=random.randint(1, 15),
            s3_endpoint=f"http://127.0.0.1:{free_port()}",
        )
        server.timings = {"migrate_s": server.migrate()}
        try:
            server.start()
            server.wait_for_dag(REFRESH, timeout=300)
            server.unpause(REFRESH)

            def scheduled_runs() -> list[dict]:
                runs = server.api("GET", f"/dags/{REFRESH}/dagRuns")["dag_runs"]
                return [r for r in runs if r["run_type"] == "scheduled"]

            for run in server.wait_for(scheduled_runs, 120, "the scheduler's run of yesterday"):
                path = f"/dags/{REFRESH}/dagRuns/{run['dag_run_id']}"
                server.api("PATCH", path, json={"state": "failed"})
            server.timings["ready_s"] = time.monotonic() - started
            yield server
        finally:
            server.stop()
            server.forget_queue()
    finally:
        drop_database(database)


@pytest.mark.slow
def test_refresh_runs_on_postgres_and_two_celery_workers(stack: CeleryStack):
    root = stack.env["EMBEDFRESH_ARTIFACT_ROOT"]
    run_id = "celery-stack"
    started = time.monotonic()
    stack.trigger(
        REFRESH,
        run_id,
        "2026-01-02T00:00:00Z",
        {"artifact_root": root, "epochs": 3, "day": "2026-01-01"},
    )
    run = stack.wait_for_run(REFRESH, run_id, timeout=900)
    run_s = time.monotonic() - started
    tis = stack.task_instances(REFRESH, run_id)
    assert run["state"] == "success", stack.explain(REFRESH, run_id)

    # Every task of the DAG ran and succeeded, embed once per corpus shard.
    states = task_states(tis)
    dag_tasks = {t["task_id"] for t in stack.api("GET", f"/dags/{REFRESH}/tasks")["tasks"]}
    shards = DATA["corpus_rows"] // DATA["corpus_shard_rows"]
    assert {k.split("[")[0] for k in states} == dag_tasks
    assert [k for k in states if k.startswith("embed[")] == [f"embed[{i}]" for i in range(shards)]
    assert set(states.values()) == {"success"}, states

    # Every task ran on a Celery worker of this stack (the hostname only the workers'
    # task runners report), from this stack's queue; the embeds on both workers.
    assert {ti["hostname"] for ti in tis} <= set(WORKERS), {ti["hostname"] for ti in tis}
    assert {ti["queue"] for ti in tis} == {stack.queue}
    embed_hosts = {ti["hostname"] for ti in tis if ti["task_id"] == "embed"}
    assert embed_hosts == set(WORKERS), [(ti["map_index"], ti["hostname"]) for ti in tis]
    print(
        f"\nstack timings: {stack.timings}, refresh run {run_s:.0f} s; "
        f"hosts {sorted((k, ti['hostname']) for k, ti in zip(states, tis, strict=True))}"
    )

    registry = Path(root.removeprefix("file://")) / "models/tiny/registry.json"
    assert run_id in registry.read_text()


# --- the services probe, cheaply --------------------------------------------------------


def test_a_missing_service_skips_naming_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"redis \(127\.0\.0\.1:\d+\)"):
        require_services({"redis": free_port()})


def test_a_missing_service_fails_under_ci(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"postgresql \(127\.0\.0\.1:\d+\)"):
        require_services({"postgresql": free_port()})


def test_services_that_answer_pass(monkeypatch: pytest.MonkeyPatch):
    import socket

    monkeypatch.setenv("CI", "true")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        require_services({"something": listener.getsockname()[1]})


def test_the_stack_settings_name_postgres_and_redis():
    assert set(settings.SERVICES) == {"postgresql", "redis"}


def test_the_pinned_celery_provider_imports_its_executor():
    """The pins hold together without the services: the provider's executor imports
    (celery 5.7.0 removed ``celery.backends.database.retry``, which provider 3.26.0
    imports; requirements.txt pins celery 5.6.3)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import airflow.providers.celery.executors.celery_executor"],
        cwd=ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_docs_stack_md_lists_the_commands_the_stack_runs():
    """docs/STACK.md's command block is :func:`command_lines`, which the stack fixture
    runs (migration, then every component): the page cannot show other commands."""
    text = (ROOT / "docs/STACK.md").read_text()
    block = re.search(r"<!-- stack-commands[^>]*-->\n```text\n(.*?)\n```", text, re.S)
    assert block, "docs/STACK.md lost its stack-commands block"
    assert block[1].splitlines() == command_lines()
    env = stack_env("postgresql+psycopg2://u@h/d", "redis://h:6379/1", "http://h:1")
    assert all(f"`{key}`" in text for key in env), "a setting of the stack is not on the page"
