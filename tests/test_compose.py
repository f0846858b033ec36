"""docker-compose.yaml is valid for Debian's docker-compose (no Docker engine needed), and
its stack's settings agree with those the test stack runs (tests/stack/settings.py).

CI installs docker-compose (.ci/run); elsewhere the test is skipped when it is absent."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT
from tests.stack import settings
from tests.stack.stack import stack_commands, stack_env

SERVICES = {
    "index",
    "postgres",
    "redis",
    "minio",
    "minio-init",
    "airflow-init",
    "api-server",
    "scheduler",
    "dag-processor",
    "triggerer",
    "worker-a",
    "worker-b",
}
#: The services that run Airflow (all but the init job), by the command they run.
AIRFLOW_SERVICES = SERVICES - {"index", "postgres", "redis", "minio", "minio-init", "airflow-init"}


@pytest.fixture(scope="module")
def config() -> dict:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose not installed")
    proc = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yaml"), "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def test_compose_config_is_valid_and_complete(config: dict):
    assert SERVICES <= set(config["services"])
    scheduler = config["services"]["scheduler"]
    env = scheduler["environment"]
    assert env["EMBEDFRESH_ARTIFACT_ROOT"].startswith("s3://")
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert "aws" in env["AIRFLOW_CONN_AWS_DEFAULT"]
    # An S3 artifact root has no embedded index: the stack names its PostgreSQL + pgvector.
    assert env["EMBEDFRESH_INDEX_DSN"].startswith("postgresql://")
    assert "@index:5432/" in env["EMBEDFRESH_INDEX_DSN"]
    assert config["services"]["index"]["image"].startswith("pgvector/pgvector:")
    assert scheduler["build"]["context"] == str(ROOT)


def test_compose_stack_agrees_with_the_tested_stack(config: dict):
    """Executor, database and broker schemes, result backend, parallelism, the
    aws_default connection, the commands run and the workers' flags: the same in the
    compose file as in the stack tests/stack/test_celery_stack.py starts."""
    services = {name: config["services"][name] for name in AIRFLOW_SERVICES}
    envs = [service["environment"] for service in services.values()]
    assert all(env == envs[0] for env in envs), "Airflow services differ in environment"
    compose = settings.shape(envs[0], [s["command"] for s in services.values()])

    env = stack_env(
        "postgresql+psycopg2://postgres@127.0.0.1:5432/embedfresh_test_x",
        "redis://127.0.0.1:6379/3",
        "http://127.0.0.1:1",
    )
    tested = settings.shape(env, [" ".join(c) for c in stack_commands("/tmp/h", "q").values()])
    assert compose == tested
    # Two workers, each its own Celery node name.
    workers = [s["command"] for s in services.values() if s["command"].startswith("celery")]
    assert len(workers) == 2 and len({w.split()[3] for w in workers}) == 2


def test_shape_sees_a_drift():
    """The comparison above can fail: a compose file on another executor, broker or
    worker concurrency has another shape."""
    env = stack_env("postgresql+psycopg2://u@h/d", "redis://h:6379/0", "http://h:1")
    commands = [" ".join(c) for c in stack_commands("/tmp/h", "q").values()]
    base = settings.shape(env, commands)
    for key, value in [
        ("AIRFLOW__CORE__EXECUTOR", "LocalExecutor"),
        ("AIRFLOW__CELERY__BROKER_URL", "amqp://guest@h:5672//"),
        ("AIRFLOW__CELERY__RESULT_BACKEND", "db+postgresql://u@other/d"),
    ]:
        assert settings.shape({**env, key: value}, commands) != base, key
    drifted = [c.replace("--concurrency 1", "--concurrency 4") for c in commands]
    assert settings.shape(env, drifted) != base
