"""A real Airflow (api-server, scheduler with the LocalExecutor, dag-processor: what
``airflow standalone`` runs, less the triggerer) on 127.0.0.1 for the end-to-end tests,
and a small client for its REST API.

The components run in one session of their own, so stopping ends the whole process group:
the components, the LocalExecutor's workers and any job they started. Every port
(API, the scheduler's and triggerer's log servers) is picked free at start, so several
of these can run side by side on one box. :meth:`AirflowServer.stop` is idempotent and
waits for the group to be gone.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx

from tests.airflow_home import AIRFLOW, airflow_home
from tests.conftest import ROOT

#: What runs: the REST and execution API, the scheduler with its LocalExecutor workers, and
#: the DAG parser. ``airflow standalone`` would add a triggerer (no task here defers) and
#: re-check the database migration first: ~30 s more start-up on a loaded 2-core box.
COMPONENTS = ("api-server", "scheduler", "dag-processor")

#: The project's main DAG, which the scheduler tests run.
REFRESH = "embedding_model_refresh"

#: Dag run states after which nothing moves any more.
FINISHED_RUN_STATES = ("success", "failed")


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The users of the test Airflow and their roles (SimpleAuthManager's role names).
ROLES = {"admin": "admin", "viewer": "viewer"}


def passwords_file(home: Path) -> Path:
    """The users' passwords (JSON ``{user: password}``, mode 0600), written once: the
    auth manager reads it and generates none."""
    path = home / "passwords.json"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({user: secrets.token_urlsafe(16) for user in ROLES}))
    return path


def server_env(home: Path, artifact_root: str) -> dict[str, str]:
    """Environment of the Airflow components in ``home``: a migrated SQLite database, the
    project's DAGs, free ports on 127.0.0.1, and settings for a 2-core box."""
    env = airflow_home(home, artifact_root)
    port = free_port()
    env.update(
        {
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__WORKERS": "1",
            # Task runners talk to the api-server; its default URL has port 8080.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            # The components start at once, so each would generate its own secrets into a
            # new airflow.cfg; the scheduler's task tokens must verify at the api-server.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            # Real users with roles, as a team runs it: an admin and a viewer (who may
            # look but not trigger); their passwords are in USERS_FILE (mode 0600).
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                f"{user}:{role}" for user, role in ROLES.items()
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file(home)),
            # LocalExecutor starts `parallelism` workers: 32 by default, too many here.
            "AIRFLOW__CORE__PARALLELISM": "2",
            # The DAG files do not change during a test: parse them once.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        }
    )
    return env


class AirflowServer:
    """The Airflow :data:`COMPONENTS` started in one process group of their own."""

    #: Seconds after which the server stops itself, whatever happens to the test process.
    #: The session's server serves every Airflow test of its worker: on 2 busy cores they
    #: outlived 20 minutes (the last one found the server gone), so an hour.
    max_lifetime_s = 3600

    def __init__(
        self,
        home: Path,
        artifact_root: str,
        *,
        components: Iterable[str] = COMPONENTS,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.home = home
        self.components = tuple(components)
        self.env = {**server_env(home, artifact_root), **(extra_env or {})}
        self.base_url = f"http://127.0.0.1:{self.env['AIRFLOW__API__PORT']}"
        self._proc: subprocess.Popen[bytes] | None = None
        self.passwords: dict[str, str] = json.loads(passwords_file(home).read_text())
        self._tokens: dict[str, str] = {}
        #: The SMTP server the deployment's notifications go to, when a test gives one.
        self.mailbox: Any = None

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = 180) -> AirflowServer:
        # One shell leads the session and its process group; the components are its
        # children, each logging to its own file. `timeout` ends the group by itself
        # should pytest die before stop().
        script = " ".join(
            f"{shlex.quote(AIRFLOW)} {part} > {shlex.quote(str(self.log_file(part)))} 2>&1 &"
            for part in self.components
        )
        self._proc = start_session(f"{script} wait", self.env, self.max_lifetime_s)
        self.wait_for(self._api_answers, timeout, "the api-server to answer")
        return self

    def log_file(self, component: str) -> Path:
        return self.home / f"{component}.log"

    def _api_answers(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(
                f"the Airflow components exited ({self._proc.returncode}):\n{self.log_tail()}"
            )
        try:
            return httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, grace_s: float = 5) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after ``grace_s``."""
        proc, self._proc = self._proc, None
        if proc is not None:
            end_session(proc, grace_s)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of each component's log, for failure messages."""
        tails = []
        for part in self.components:
            try:
                text = self.log_file(part).read_text(errors="replace")[-chars:]
            except OSError:
                text = "(no log)"
            tails.append(f"--- {part} ---\n{text}")
        return "\n".join(tails)

    def wait_for(self, condition: Callable[[], Any], timeout: float, what: str, every: float = 1):
        """Poll ``condition`` until it returns something truthy; fail with the server log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(every)
        raise TimeoutError(f"waited {timeout:.0f} s for {what}; server log:\n{self.log_tail()}")

    # --- REST API (/api/v2) -------------------------------------------------------------

    @property
    def token(self) -> str:
        """The admin's token."""
        return self.token_for("admin")

    def token_for(self, user: str) -> str:
        """A JWT for ``user`` from the api-server's login endpoint, as a script gets one."""
        if user not in self._tokens:
            body = {"username": user, "password": self.passwords[user]}
            response = httpx.post(f"{self.base_url}/auth/token", json=body, timeout=30)
            response.raise_for_status()
            self._tokens[user] = response.json()["access_token"]
        return self._tokens[user]

    def request(
        self, method: str, path: str, *, user: str = "admin", **kwargs: Any
    ) -> httpx.Response:
        """One REST call as ``user``; a request the api-server lost to SQLite's single
        writer lock (500 "Database error": nothing was committed) is sent again, up to 5
        times."""
        for attempt in range(5):
            response = httpx.request(
                method,
                f"{self.base_url}/api/v2{path}",
                headers={"Authorization": f"Bearer {self.token_for(user)}"},
                timeout=60,
                **kwargs,
            )
            if response.status_code != 500 or "Database error" not in response.text:
                break
            time.sleep(1 + attempt)
        return response

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """One REST call as the admin; its JSON answer. An error status fails the test."""
        response = self.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise AssertionError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> dict[str, Any]:
        """The DAG once the dag-processor has parsed and serialised it."""

        def parsed() -> dict[str, Any] | None:
            response = httpx.get(
                f"{self.base_url}/api/v2/dags/{dag_id}",
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=30,
            )
            return response.json() if response.status_code == 200 else None

        return self.wait_for(parsed, timeout, f"DAG {dag_id} to be parsed")

    def unpause(self, dag_id: str) -> dict[str, Any]:
        return self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def trigger(
        self, dag_id: str, run_id: str, logical_date: str, conf: dict[str, Any]
    ) -> dict[str, Any]:
        body = {"dag_run_id": run_id, "logical_date": logical_date, "conf": conf}
        return self.api("POST", f"/dags/{dag_id}/dagRuns", json=body)

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 300) -> dict[str, Any]:
        """The run once it is finished (success or failed)."""

        def finished() -> dict[str, Any] | None:
            run = self.dag_run(dag_id, run_id)
            return run if run["state"] in FINISHED_RUN_STATES else None

        return self.wait_for(finished, timeout, f"run {run_id} of {dag_id} to finish", every=2)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of the run, mapped ones included (one per map index)."""
        page = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100")
        return page["task_instances"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """A task try's log as text, one line per event (exceptions included), read
        through the API."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        content = self.api("GET", f"{path}?full_content=true")["content"]
        if isinstance(content, str):
            return content
        return "\n".join(_log_line(e) for e in content)

    def explain(self, dag_id: str, run_id: str, lines: int = 30) -> str:
        """Task states and the log tail of every failed task: a failure message."""
        tis = self.task_instances(dag_id, run_id)
        parts = [f"task states: {task_states(tis)}"]
        for ti in tis:
            if ti["state"] == "failed":
                log = self.task_log(dag_id, run_id, ti["task_id"], ti["try_number"])
                tail = "\n".join(log.splitlines()[-lines:])
                parts.append(f"--- {ti['task_id']} (try {ti['try_number']}) ---\n{tail}")
        return "\n".join(parts)


def job_pids(module: str, run_id: str) -> list[int]:
    """Pids of ``python -m <module> ... --set run_id=<run_id>`` processes."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # A job forked by the fork server shows its command as its title, one string.
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").split()
        except OSError:
            continue  # gone meanwhile
        if b"-m" in argv and module.encode() in argv and f"run_id={run_id}".encode() in argv:
            found.append(int(entry.name))
    return found


def task_states(tis: Iterable[dict[str, Any]]) -> dict[str, str]:
    """``{task_id: state}`` of unmapped tasks, ``{task_id[i]: state}`` of mapped ones."""
    return {
        ti["task_id"] if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]": ti["state"]
        for ti in tis
    }


def _log_line(event: Any) -> str:
    """A structured task log event as text, with its exception (type: message) if any."""
    if not isinstance(event, dict):
        return str(event)
    errors = [f"{e.get('exc_type')}: {e.get('exc_value')}" for e in event.get("error_detail") or ()]
    return " | ".join([str(event.get("event", "")), *errors])


def start_session(script: str, env: dict[str, str], lifetime_s: float) -> subprocess.Popen:
    """``sh -c script`` leading a session (and process group) of its own, in the
    checkout, ended by ``timeout`` after ``lifetime_s`` should the tests die first."""
    return subprocess.Popen(
        ["timeout", "-k", "10", str(lifetime_s), "sh", "-c", script],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def end_session(proc: subprocess.Popen, grace_s: float = 5) -> None:
    """SIGTERM the process group ``proc`` leads (started with ``start_new_session``),
    SIGKILL what is left after ``grace_s``."""
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        proc.poll()
        time.sleep(0.2)
    _signal_group(pgid, signal.SIGKILL)
    proc.wait(timeout=30)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
