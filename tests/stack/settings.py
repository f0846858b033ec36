"""The production-like stack's settings, in one place: the executor, the metadata
database, the Celery broker and result backend, the ``aws_default`` connection and the
Airflow commands that make the stack.

The test stack (tests/stack/test_celery_stack.py) builds its environment with
:func:`airflow_settings`; ``docker-compose.yaml`` cannot import Python, so
tests/test_compose.py reduces both to their :func:`shape` (executor, URL schemes, result
backend on the metadata database, connection type and keys, commands) and requires them
equal: the compose file cannot drift from what the tests run. Hosts, ports, users and
database names differ on purpose (containers there, 127.0.0.1 and a fresh database here).
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

EXECUTOR = "CeleryExecutor"
#: SQLAlchemy URL scheme of the metadata database (PostgreSQL through psycopg2).
DATABASE_SCHEME = "postgresql+psycopg2"
#: Celery's broker: Redis. (RabbitMQ, ``amqp://``, works too; production picks one.)
BROKER_SCHEME = "redis"
#: Celery's result backend: SQLAlchemy on the metadata database itself, same driver
#: (SQLAlchemy 2.1's default for ``postgresql://`` is psycopg 3, which is not installed).
RESULT_BACKEND_PREFIX = "db+"
#: The ``aws_default`` connection: its type and the keys of its extra.
AWS_CONN_TYPE = "aws"
AWS_EXTRA_KEYS = ("endpoint_url", "region_name")

#: The services the stack needs from the machine, by the port they listen on (127.0.0.1).
SERVICES = {"postgresql": 5432, "redis": 6379}

#: What runs: ``airflow <command>`` for each; ``celery worker`` once per worker.
AIRFLOW_COMMANDS = ("api-server", "scheduler", "dag-processor", "triggerer", "celery worker")
#: Flags every Celery worker gets (one task at a time, no chatter between workers).
WORKER_FLAGS = ("--concurrency", "1", "--without-mingle", "--without-gossip")
#: Task slots of the whole stack (the scheduler's limit): one per worker here.
PARALLELISM = "2"


def result_backend(database_url: str) -> str:
    """Celery's result backend on the metadata database ``database_url``."""
    return f"{RESULT_BACKEND_PREFIX}{database_url}"


def aws_connection(endpoint_url: str, region: str, login: str, password: str) -> str:
    """``AIRFLOW_CONN_AWS_DEFAULT``: the connection as JSON."""
    extra = {"region_name": region, "endpoint_url": endpoint_url}
    return json.dumps(
        {"conn_type": AWS_CONN_TYPE, "login": login, "password": password, "extra": extra}
    )


def airflow_settings(database_url: str, broker_url: str, aws_conn: str) -> dict[str, str]:
    """The environment every component of the stack shares."""
    return {
        "AIRFLOW__CORE__EXECUTOR": EXECUTOR,
        "AIRFLOW__CORE__PARALLELISM": PARALLELISM,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url,
        "AIRFLOW__CELERY__BROKER_URL": broker_url,
        "AIRFLOW__CELERY__RESULT_BACKEND": result_backend(database_url),
        "AIRFLOW_CONN_AWS_DEFAULT": aws_conn,
    }


def shape(env: dict[str, str], commands: list[str]) -> dict[str, object]:
    """What must agree between the compose file and the test stack: the settings of
    :func:`airflow_settings` without hosts, users and names, and the commands run."""
    db = urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    backend = env["AIRFLOW__CELERY__RESULT_BACKEND"]
    conn = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
    return {
        "executor": env["AIRFLOW__CORE__EXECUTOR"],
        "parallelism": env["AIRFLOW__CORE__PARALLELISM"],
        "database_scheme": db.scheme,
        "broker_scheme": urlsplit(env["AIRFLOW__CELERY__BROKER_URL"]).scheme,
        "result_backend_is_the_database": backend == result_backend(db.geturl()),
        "aws_conn_type": conn["conn_type"],
        "aws_extra_keys": sorted(conn["extra"]),
        "commands": sorted({_name(c) for c in commands}),
        "worker_flags": sorted(
            {_flags(c) for c in commands if _name(c) == "celery worker"}, key=str
        ),
    }


#: Flags that name one worker (differ between workers by design): left out of the shape.
_OWN_FLAGS = {"--celery-hostname", "-H", "--pid", "--queues", "-q"}


def _name(command: str) -> str:
    return command.split(" -")[0].strip()


def _flags(command: str) -> tuple[str, ...]:
    words = command.split()[len(_name(command).split()) :]
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in _OWN_FLAGS:
            skip = True
        else:
            kept.append(word)
    return tuple(kept)
