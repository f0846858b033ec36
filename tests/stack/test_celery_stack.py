"""The refresh DAG on the production-like stack: Airflow on a fresh PostgreSQL database,
CeleryExecutor on Redis, api-server, scheduler, dag-processor, triggerer and two Celery
workers (concurrency 1 each) on 127.0.0.1, started once for the module and stopped at
its end, the database dropped (tests/stack/stack.py). One refresh runs on it, with a
worker lost in ``train`` and another in ``embed`` (the ``refresh`` fixture); the tests
assert on that one run.

Without PostgreSQL or Redis on 127.0.0.1 the stack tests skip, naming the missing
service; under ``CI=true`` they fail.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psutil
import pyarrow.parquet as pq
import pytest

from embedfresh.core import layout
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import WEIGHTS
from tests.airflow.server import REFRESH, free_port, job_pids, task_states
from tests.conftest import DATA, ROOT, job_env, run_job, write_demo_store
from tests.reliability.index_state import IndexSnapshots
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


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str, pg_server: str
) -> Iterator[CeleryStack]:
    """The stack with the demo store as its default artifact root, moto's S3 server as
    its ``aws_default`` endpoint (every component has its ``AWS_*`` variables) and a
    database of the session's PostgreSQL + pgvector as its vector index (as RDS would be:
    an S3 root has no embedded index), the refresh DAG parsed and unpaused (the
    scheduler's run of yesterday marked failed: the tests trigger their own)."""
    require_services()
    index = IndexSnapshots(pg_server, "celery_stack")
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
            s3_endpoint=s3_endpoint,
            index_dsn=index.dsn,
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


#: The refresh's settings: 6 epochs of 32 steps, checkpoints at steps 50, 100 and 150 (a
#: kill after the first leaves 142 steps to go, never a race with the end). On the tests'
#: 1,024 training rows the sixth epoch overfits: log-loss against the random-init
#: baseline turns INCONCLUSIVE, so the gate decides on the others.
CONF = {"epochs": 6, "day": "2026-01-01", "gate_metrics": ["accuracy", "auc", "recall_at_10"]}

#: The train job's settings in that refresh (what IncrementalTrainingOperator gives it,
#: but the root and run id), for the reference run. A drift from the DAG's shows as
#: another ``config_hash`` in the two reports.
REFERENCE_TRAIN = (
    "model=tiny",
    "backend=cpu",
    f"data_interval_start={CONF['day']}",
    f"data_interval_end={dt.date.fromisoformat(CONF['day']) + dt.timedelta(days=1)}",
    f"epochs={CONF['epochs']}",
    "parallelism=ddp",
)
#: Train report fields that say two runs did the same math on the same kernels.
SAME_MATH = ("config_hash", "threads", "backend", "device", "torch", "steps", "init")


def weights_sha(store: ArtifactStore, version: str) -> str:
    return hashlib.sha256(
        store.read_bytes(f"{layout.model_version('tiny', version)}/{WEIGHTS}")
    ).hexdigest()


def worker_of(pid: int) -> str:
    """The stack worker a process belongs to: the ``EMBEDFRESH_TEST_WORKER`` of it or of
    its nearest ancestor that still shows its environment (a job forked by the fork
    server shows its command as its title, over the environment's memory)."""
    for proc in [psutil.Process(pid), *psutil.Process(pid).parents()]:
        worker = proc.environ().get("EMBEDFRESH_TEST_WORKER")
        if worker:
            return worker
    raise AssertionError(f"process {pid} belongs to no stack worker")


def tries(stack: CeleryStack, run_id: str, task_id: str, map_index: int = -1) -> list[dict]:
    path = f"/dags/{REFRESH}/dagRuns/{run_id}/taskInstances/{task_id}"
    path += f"/{map_index}/tries" if map_index >= 0 else "/tries"
    return sorted(stack.api("GET", path)["task_instances"], key=lambda t: t["try_number"])


def reference_train(root: str) -> dict:
    """The refresh's train job run once as a plain job (``python -m
    embedfresh.jobs.train``, nothing killed) on the demo store ``root``: its report and
    weights' sha256, what the resumed train of the refresh must equal."""
    done = run_job("train", f"artifact_root={root}", "run_id=reference", *REFERENCE_TRAIN)
    assert done.returncode == 0, done.stderr[-3000:]
    store = ArtifactStore(root)
    return {
        "report": store.read_json(layout.report("tiny", "reference", "train")),
        "weights_sha": weights_sha(store, "reference"),
    }


@pytest.fixture(scope="module")
def refresh(stack: CeleryStack, s3_endpoint: str) -> dict:
    """The one refresh of the module, with its artifact root on S3 (moto's server), a
    worker lost twice:

    1. every process of the worker that runs ``train`` (Celery worker, pool, task runner,
       job) SIGKILLed after the first committed checkpoint; while the scheduler finds the
       task without a heartbeat, the same train job runs once as a plain job on the
       stack's ``file://`` demo store (the bit-exact reference, on the cores the stack
       leaves idle); the lost worker comes back once train's retry has started;
    2. the worker that runs the first ``embed`` job SIGKILLed.

    What happened, for the tests: the run's task instances, the tries, the lost workers,
    the checkpoint step of the kill and the reference's report and weights."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    bucket, prefix, run_id = "celery-stack", "prod", "lost-worker"
    s3.create_bucket(Bucket=bucket)
    root = f"s3://{bucket}/{prefix}"
    write_demo_store(root)
    store = ArtifactStore(root)
    started = time.monotonic()
    stack.trigger(REFRESH, run_id, "2026-01-02T00:00:00Z", {"artifact_root": root, **CONF})

    # 1. The worker running train is lost after its first checkpoint.
    checkpoints = f"{prefix}/{layout.checkpoints('tiny', run_id)}/"

    def committed() -> list[str]:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=checkpoints).get("Contents", [])
        return sorted(o["Key"] for o in listed if o["Key"].endswith("/COMMIT"))

    first = stack.wait_for(committed, 300, "a committed checkpoint", every=0.1)[0]
    (pid,) = job_pids("embedfresh.jobs.train", run_id)
    lost = worker_of(pid)
    killed = stack.kill_worker(lost)
    killed_at = int(first.split("/")[-2].removeprefix("step-"))
    assert not store.exists(layout.report("tiny", run_id, "train")), "train ended before the kill"
    survivor = next(w for w in WORKERS if w != lost)

    with ThreadPoolExecutor(max_workers=1) as pool:
        reference = pool.submit(reference_train, stack.env["EMBEDFRESH_ARTIFACT_ROOT"])

        def retry_started() -> dict | None:
            found = tries(stack, run_id, "train")
            running = ("running", "success")
            return found[-1] if len(found) == 2 and found[-1]["state"] in running else None

        retry = stack.wait_for(retry_started, 240, "train's retry to start")
        stack.start_worker(lost)  # a new host in the lost one's place

        # 2. The worker running the first embed job is lost.
        embed_pids = stack.wait_for(
            lambda: job_pids("embedfresh.jobs.embed", run_id), 600, "an embed job", 0.1
        )
        lost_embed = worker_of(embed_pids[0])
        stack.kill_worker(lost_embed)

        run = stack.wait_for_run(REFRESH, run_id, timeout=900)
        assert run["state"] == "success", stack.explain(REFRESH, run_id)
        seconds = time.monotonic() - started
        shards = DATA["corpus_rows"] // DATA["corpus_shard_rows"]
        return {
            "run_id": run_id,
            "root": root,
            "seconds": seconds,
            "tis": stack.task_instances(REFRESH, run_id),
            "lost": lost,
            "killed": killed,
            "killed_at": killed_at,
            "survivor": survivor,
            "retry": retry,
            "lost_embed": lost_embed,
            "train_tries": tries(stack, run_id, "train"),
            "embed_tries": [tries(stack, run_id, "embed", i) for i in range(shards)],
            "reference": reference.result(),
        }


@pytest.mark.slow
def test_refresh_runs_on_postgres_and_two_celery_workers(stack: CeleryStack, refresh: dict):
    tis = refresh["tis"]
    # Every task of the DAG ran and succeeded, embed once per corpus shard.
    states = task_states(tis)
    dag_tasks = {t["task_id"] for t in stack.api("GET", f"/dags/{REFRESH}/tasks")["tasks"]}
    shards = DATA["corpus_rows"] // DATA["corpus_shard_rows"]
    assert {k.split("[")[0] for k in states} == dag_tasks
    assert [k for k in states if k.startswith("embed[")] == [f"embed[{i}]" for i in range(shards)]
    assert set(states.values()) == {"success"}, states

    # Every task ran on a Celery worker of this stack (the hostname only the workers'
    # task runners report), from this stack's queue, the lost tries too; the embeds'
    # first tries on both workers (one task at a time each: the second embed goes to the
    # idle one, before the kill leaves one).
    every_try = [*tis, *refresh["train_tries"], *(t for ts in refresh["embed_tries"] for t in ts)]
    assert {ti["hostname"] for ti in every_try} <= set(WORKERS), every_try
    assert {ti["queue"] for ti in every_try} == {stack.queue}
    first_embeds = {ts[0]["hostname"] for ts in refresh["embed_tries"]}
    assert first_embeds == set(WORKERS), [
        [(x["try_number"], x["hostname"], x["state"]) for x in ts] for ts in refresh["embed_tries"]
    ]
    print(
        f"\nstack timings: {stack.timings}, refresh run {refresh['seconds']:.0f} s; "
        f"hosts {sorted((k, ti['hostname']) for k, ti in zip(states, tis, strict=True))}"
    )

    registry = ArtifactStore(refresh["root"]).read_bytes(layout.registry("tiny")).decode()
    assert refresh["run_id"] in registry


@pytest.mark.slow
def test_a_lost_worker_on_s3_train_resumes_bit_exact_and_embed_loses_no_shard(
    stack: CeleryStack, refresh: dict
):
    """The worker lost in ``train``: the scheduler finds the task without a heartbeat, its
    retry runs on the other worker and resumes from the checkpoint, and the weights are
    sha256-equal to the same job's run nothing killed. The worker lost in ``embed``: its
    retry runs on the surviving worker, and the embeddings hold every corpus id once."""
    run_id, store = refresh["run_id"], ArtifactStore(refresh["root"])
    lost, survivor = refresh["lost"], refresh["survivor"]
    assert refresh["killed"] >= 4  # worker, pool child, task runner, job at least
    assert refresh["retry"]["hostname"] == survivor

    train_tries = refresh["train_tries"]
    assert [t["hostname"] for t in train_tries] == [lost, survivor]
    assert train_tries[0]["state"] != "success" and train_tries[1]["state"] == "success"
    train = store.read_json(layout.report("tiny", run_id, "train"))
    assert train["resumed_from"]["step"] == refresh["killed_at"], train["resumed_from"]
    assert train["steps"] == 192
    # Bit-exact against the reference: the same math (settings, data, kernels) first,
    # then the weights.
    reference = refresh["reference"]
    assert reference["report"]["resumed_from"] is None
    same = {k: (train[k], reference["report"][k]) for k in SAME_MATH}
    assert all(a == b for a, b in same.values()), same
    assert weights_sha(store, run_id) == reference["weights_sha"]

    embed_tries = refresh["embed_tries"]
    retried = [t for t in embed_tries if len(t) == 2]
    assert len(retried) == 1, [
        [(x["try_number"], x["hostname"], x["state"]) for x in t] for t in embed_tries
    ]
    lost_embed = refresh["lost_embed"]
    assert retried[0][0]["hostname"] == lost_embed and retried[0][1]["hostname"] != lost_embed
    assert retried[0][1]["state"] == "success"

    # No shard lost, none duplicated: the parts hold every corpus id once.
    out = layout.embeddings("tiny", run_id, "products")
    manifest = store.read_json(f"{out}/_MANIFEST.json")
    assert manifest["rows"] == DATA["corpus_rows"]
    ids = [
        i
        for name in sorted(n for n in store.listdir(out) if n.endswith(".parquet"))
        for i in pq.read_table(io.BytesIO(store.read_bytes(f"{out}/{name}")), columns=["id"])[
            "id"
        ].to_pylist()
    ]
    corpus = layout.corpus("products")
    corpus_ids = [
        i
        for name in sorted(n for n in store.listdir(corpus) if n.endswith(".parquet"))
        for i in pq.read_table(io.BytesIO(store.read_bytes(f"{corpus}/{name}")), columns=["id"])[
            "id"
        ].to_pylist()
    ]
    assert len(ids) == len(set(ids)) == DATA["corpus_rows"]
    assert sorted(ids) == sorted(corpus_ids)


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
