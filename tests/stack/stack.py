"""The production-like stack on 127.0.0.1 for the tests: Airflow on a fresh PostgreSQL
database with the CeleryExecutor on Redis, an api-server, scheduler, dag-processor,
triggerer and two Celery workers in one process group (tests/airflow/server.py's
:class:`AirflowServer`, with a command and environment per component).

Settings come from tests/stack/settings.py, which docker-compose.yaml must agree with
(tests/test_compose.py). :func:`require_services` skips the stack tests with the missing
service's name, or fails them under ``CI=true``.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from embedfresh.operators.resources import pool_command
from tests.airflow.server import AirflowServer, end_session, free_port, start_session
from tests.conftest import ROOT
from tests.stack import settings

HOST = "127.0.0.1"
WORKERS = ("worker-a", "worker-b")
#: Seconds without a heartbeat after which the scheduler fails a task instance whose
#: worker is gone (``[scheduler] task_instance_heartbeat_timeout``; Airflow's default,
#: 300 s, is what production keeps). Task runners heartbeat every 5 s.
HEARTBEAT_TIMEOUT_S = 30


# --- the services the machine must run --------------------------------------------------


def unreachable(services: dict[str, int], host: str = HOST, timeout: float = 1.0) -> list[str]:
    """``name (host:port)`` of each service nobody answers for (a TCP connect)."""
    missing = []
    for name, port in services.items():
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError:
            missing.append(f"{name} ({host}:{port})")
    return missing


def require_services(services: dict[str, int] = settings.SERVICES) -> None:
    """Skip the calling test when a service is unreachable, naming it; under ``CI=true``
    fail instead (CI machines run them, so a missing one is a broken machine)."""
    missing = unreachable(services)
    if not missing:
        return
    message = (
        f"the PostgreSQL + Celery stack tests need {', '.join(missing)}: not reachable "
        "(../shared/FACTS.md says how to start one)"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


# --- a fresh database -------------------------------------------------------------------


def _admin_connection():
    import psycopg2

    conn = psycopg2.connect(
        host=HOST,
        port=settings.SERVICES["postgresql"],
        user="postgres",
        dbname="postgres",
        connect_timeout=10,
    )
    conn.autocommit = True
    return conn


def create_database() -> str:
    """A new empty database ``embedfresh_test_<random>``; its name."""
    name = f"embedfresh_test_{secrets.token_hex(6)}"
    conn = _admin_connection()
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return name


def drop_database(name: str) -> None:
    conn = _admin_connection()
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


def database_url(name: str) -> str:
    port = settings.SERVICES["postgresql"]
    return f"{settings.DATABASE_SCHEME}://postgres@{HOST}:{port}/{name}"


# --- the stack ----------------------------------------------------------------------------


def stack_env(database_url: str, broker_url: str, s3_endpoint: str) -> dict[str, str]:
    """The settings every component shares (tests/stack/settings.py)."""
    conn = settings.aws_connection(s3_endpoint, "us-east-1", "testing", "testing")
    return settings.airflow_settings(database_url, broker_url, conn)


def stack_commands(
    home: str | Path = "$AIRFLOW_HOME", queue: str = "$EMBEDFRESH_QUEUE"
) -> dict[str, tuple[str, ...]]:
    """``airflow <args>`` of each component, by name. The workers serve ``queue`` only
    (other stacks on the same Redis use their own) and keep their pid files apart."""
    commands: dict[str, tuple[str, ...]] = {
        name: (name,) for name in settings.AIRFLOW_COMMANDS if name != "celery worker"
    }
    for worker in WORKERS:
        commands[worker] = (
            "celery",
            "worker",
            "--celery-hostname",
            f"{worker}@%h",
            "--pid",
            f"{home}/{worker}.pid",
            "--queues",
            queue,
            *settings.WORKER_FLAGS,
        )
    return commands


def worker_env(worker: str) -> dict[str, str]:
    """What one worker's environment adds: its name as the task instances' hostname
    (tests/stack/worker_name.py) and a log server port of its own."""
    return {
        "EMBEDFRESH_TEST_WORKER": worker,
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "tests.stack.worker_name.hostname",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": f"${port_var(worker)}",
    }


def port_var(worker: str) -> str:
    """The variable holding ``worker``'s log server port."""
    return f"{worker.upper().replace('-', '_')}_LOG_PORT"


def command_lines() -> list[str]:
    """The shell commands that make the stack, as docs/STACK.md lists them: the database
    migration, then one line per component. ``$AIRFLOW_HOME``, ``$EMBEDFRESH_QUEUE`` and
    the workers' ``$WORKER_*_LOG_PORT`` come from the environment."""
    # The accelerator pool the DAGs' device steps take (operators/resources.py).
    lines = [f"airflow db migrate && {shlex.join(pool_command())}"]
    for name, args in stack_commands().items():
        env = [f"{k}={v}" for k, v in worker_env(name).items()] if name in WORKERS else []
        lines.append(" ".join(["env", *env, "airflow", *args] if env else ["airflow", *args]))
    return lines


class CeleryStack(AirflowServer):
    """The stack in ``home`` on database ``database`` and Redis database ``redis_db``,
    started with :func:`command_lines`."""

    max_lifetime_s = 1800

    def __init__(
        self,
        home: Path,
        artifact_root: str,
        database: str,
        redis_db: int,
        s3_endpoint: str,
        index_dsn: str | None = None,
    ) -> None:
        self.queue = f"embedfresh-{secrets.token_hex(4)}"
        self.broker_url = f"redis://{HOST}:{settings.SERVICES['redis']}/{redis_db}"
        extra = {
            **stack_env(database_url(database), self.broker_url, s3_endpoint),
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": self.queue,
            "EMBEDFRESH_QUEUE": self.queue,
            # A worker killed in a test is found lost in seconds, not 5 minutes.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            **{port_var(worker): str(free_port()) for worker in WORKERS},
            # The workers' hostname_callable (tests/stack/worker_name.py) is imported
            # from the checkout.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        if index_dsn:  # the vector index every worker's jobs reach, as RDS would be
            extra["EMBEDFRESH_INDEX_DSN"] = index_dsn
        super().__init__(home, artifact_root, components=stack_commands(), extra_env=extra)
        #: Workers started again after a kill, each in a session of its own.
        self._restarted: list[subprocess.Popen[bytes]] = []

    def migrate(self, timeout: float = 600) -> float:
        """``airflow db migrate`` (the first of :func:`command_lines`) on the fresh
        database; seconds it took."""
        start = time.monotonic()
        proc = subprocess.run(
            ["sh", "-c", command_lines()[0]],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return time.monotonic() - start

    def component_lines(self) -> dict[str, str]:
        """Each component's line of :func:`command_lines` (all but the migration)."""
        return dict(zip(self.components, command_lines()[1:], strict=True))

    def start(self, timeout: float = 240) -> CeleryStack:
        """The components of :func:`command_lines` (all but the migration), each in the
        background with its own log, in one shell that leads a process group of its own
        (ended by ``timeout`` should pytest die before :meth:`stop`)."""
        parts = [
            f"{line} > {shlex.quote(str(self.log_file(name)))} 2>&1 &"
            for name, line in self.component_lines().items()
        ]
        self._proc = start_session(f"{' '.join(parts)} wait", self.env, self.max_lifetime_s)
        self.wait_for(self._api_answers, timeout, "the api-server to answer")
        return self

    # --- a worker lost, and brought back -------------------------------------------------

    def worker_pids(self, worker: str) -> list[int]:
        """Every process of ``worker``, as a lost host takes every process on it: the
        Celery worker and its pool, the task supervisors and runners, and the jobs they
        started. Found from the processes that still show the worker's variable in
        ``/proc/<pid>/environ`` or its Celery node name in their title (process titles
        overwrite the environment's memory), and all their descendants."""
        mark = f"EMBEDFRESH_TEST_WORKER={worker}".encode()
        node = f"{worker}@".encode()
        children: dict[int, list[int]] = {}
        roots = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                environ = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            pid, ppid = int(entry.name), int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(pid)
            # (The shells that start the workers name every worker: never a root.)
            shell = cmdline.split(b"\0")[0] in (b"sh", b"timeout")
            if mark in environ or (node in cmdline and b"celery" in cmdline and not shell):
                roots.append(pid)
        found: set[int] = set()
        while roots:
            pid = roots.pop()
            if pid not in found:
                found.add(pid)
                roots += children.get(pid, [])
        return sorted(found)

    def kill_worker(self, worker: str, timeout: float = 30) -> int:
        """SIGKILL every process of ``worker`` until none is left (a pool child forked
        meanwhile is killed too); how many there were."""
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while pids := self.worker_pids(worker):
            assert time.monotonic() < deadline, f"{worker} still has processes {pids}"
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed.update(pids)
            time.sleep(0.2)
        return len(killed)

    def start_worker(self, worker: str) -> None:
        """``worker`` started again with its line of :func:`command_lines` (a new host
        taking the lost one's place), ended by :meth:`stop`."""
        line = self.component_lines()[worker]
        log = shlex.quote(str(self.home / f"{worker}.restarted.log"))
        self._restarted.append(start_session(f"{line} > {log} 2>&1", self.env, self.max_lifetime_s))

    def stop(self, grace_s: float = 5) -> None:
        super().stop(grace_s)
        while self._restarted:
            end_session(self._restarted.pop(), grace_s)

    def forget_queue(self) -> None:
        """Remove the run's queue and kombu's keys for it from Redis (other stacks' keys
        stay: every key removed holds the run's random queue name)."""
        import redis

        client = redis.Redis.from_url(self.broker_url, socket_timeout=5)
        try:
            keys = list(client.scan_iter(match=f"*{self.queue}*"))
            if keys:
                client.delete(*keys)
        finally:
            client.close()
