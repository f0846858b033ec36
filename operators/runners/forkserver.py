"""The local runner's fast start: jobs forked from a server that has torch imported.

``python -m embedfresh.jobs.forkserver`` (the server, in the data plane) imports torch
and the other heavy modules once and forks each job from there, so a task's job starts
in milliseconds instead of paying a fresh interpreter and torch's import every time
(docs/BENCHMARKS.md, "Pipeline overhead"). This module is the worker's side: it finds
or starts the server for the job's interpreter, code and environment, and hands back a
:class:`ForkedJob` that the runner streams, waits on and kills like a
:class:`subprocess.Popen`.

One server serves one key: the interpreter, the working directory, the code's files
(path, size, mtime of every ``.py`` of the ``embedfresh`` package the job imports, and
of the preloaded packages' entry points) and every environment variable but Airflow's
own (``AIRFLOW*``: per task, and never read by the data plane, which does not import
Airflow). Anything a job could see differently from a fresh interpreter was settled at
the server's import time, so a changed file or variable means another server, never a
stale one. Servers live in a 0700 directory of the user's under the temp directory and
exit after :data:`IDLE_S` seconds with no job. ``EMBEDFRESH_FORK_SERVER=0`` turns the
fast start off (every job a fresh interpreter, as before).
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

#: The server program.
SERVER_MODULE = "embedfresh.jobs.forkserver"
#: Packages the server imports before it forks (their files are part of the key).
PRELOADED = ("torch", "numpy", "safetensors", "tokenizers", "fsspec", "pydantic", "yaml")
#: Seconds a server waits for the next job before it exits.
IDLE_S = 300.0
#: Seconds to wait for a new server to listen (it imports torch first).
START_TIMEOUT_S = 120.0
#: Modules the server runs: the project's jobs, which import nothing that runs torch at
#: import time (a job must not start threads or CUDA before it runs).
FORKABLE = ("embedfresh.jobs.",)
#: The switch: ``0`` starts every job in a fresh interpreter.
ENV_SWITCH = "EMBEDFRESH_FORK_SERVER"


class ForkServerUnavailable(RuntimeError):
    """No server could be reached or started; the runner starts the job itself."""


def enabled(env: Mapping[str, str]) -> bool:
    return env.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def module_command(argv: Sequence[str], python: str) -> bool:
    """Whether ``argv`` is ``<this interpreter> -m embedfresh.jobs.<job> ...``: what the
    server can run (torchrun's launcher and other interpreters start as before)."""
    return (
        len(argv) >= 3
        and os.path.abspath(argv[0]) == os.path.abspath(sys.executable)
        and os.path.abspath(python) == os.path.abspath(sys.executable)
        and argv[1] == "-m"
        and argv[2].startswith(FORKABLE)
        and argv[2] not in (SERVER_MODULE, "embedfresh.jobs.launch")
    )


class ForkedJob:
    """A job forked by the server, with the parts of :class:`subprocess.Popen` the
    runner uses: ``pid``, ``stdout``, ``stderr``, :meth:`poll`, :meth:`wait`,
    ``returncode``. The server is the job's parent and reports its exit status; a
    server lost meanwhile leaves the status unknown, reported as exit code 1 (a crash:
    retried per the task's policy) once the job's output has closed."""

    def __init__(self, conn: socket.socket, pid: int, stdout: IO[bytes], stderr: IO[bytes]):
        self._conn = conn
        self._buffer = b""
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self.server_lost = False

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(block=False)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked job {self.pid}", timeout or 0)
            self._read(block=True, timeout=0.5)
        return self.returncode

    def _read(self, block: bool, timeout: float = 0.0) -> None:
        self._conn.settimeout(timeout if block else 0.0)
        try:
            chunk = self._conn.recv(4096)
        except (BlockingIOError, TimeoutError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.server_lost = True
            self.returncode = 1
            self._conn.close()
            return
        self.take(chunk)

    def take(self, chunk: bytes) -> None:
        """Messages from the server: the exit line sets :attr:`returncode`."""
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "exit" in message:
                self.returncode = int(message["exit"])
                self._conn.close()
                return


def start(argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> ForkedJob:
    """Fork ``argv`` (a :func:`module_command`) from the server for ``env`` and ``cwd``,
    starting that server first when none listens.

    :raises ForkServerUnavailable: no server could be reached or started.
    """
    cwd = os.path.abspath(cwd or os.getcwd())
    path = socket_path(env, cwd)
    conn = _connect(path)
    if conn is None:
        with _lock(path):
            conn = _connect(path)
            if conn is None:
                conn = _start_server(path, env, cwd)
    return _request(conn, argv[1:], env, cwd)


def server_key(env: Mapping[str, str], cwd: str) -> str:
    """What a server is for (see the module docstring), as a short hex digest."""
    digest = hashlib.sha256()
    digest.update(os.path.abspath(sys.executable).encode())
    digest.update(b"\0" + cwd.encode())
    for name, value in sorted(env.items()):
        if not _airflows(name):
            digest.update(b"\0" + name.encode() + b"=" + value.encode())
    for path in _code_files(cwd):
        try:
            st = path.stat()
        except OSError:
            continue
        digest.update(f"\0{path}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


def _airflows(name: str) -> bool:
    """Airflow's own variables (``AIRFLOW__...``, ``AIRFLOW_CTX_...``, the task runner's
    ``_AIRFLOW_...`` and ``__AIRFLOW_SUPERVISOR_FD``): left out of the key."""
    return name.lstrip("_").startswith("AIRFLOW")


def socket_path(env: Mapping[str, str], cwd: str) -> str:
    return str(_server_dir() / f"{server_key(env, cwd)}.sock")


def _code_files(cwd: str) -> Iterator[Path]:
    """The ``embedfresh`` package a ``-m`` job in ``cwd`` imports (the working directory
    comes first on its path), and the preloaded packages' entry points."""
    local = Path(cwd) / "embedfresh"
    if (local / "__init__.py").exists():
        yield from sorted(local.rglob("*.py"))
    else:
        spec = importlib.util.find_spec("embedfresh")
        if spec is not None and spec.origin:
            yield from sorted(Path(spec.origin).parent.rglob("*.py"))
    for name in PRELOADED:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            yield Path(spec.origin)


def _server_dir() -> Path:
    path = Path(tempfile.gettempdir()) / f"embedfresh-forkserver-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ForkServerUnavailable(f"{path} is not a private directory of this user")
    return path


@contextlib.contextmanager
def _lock(path: str) -> Iterator[None]:
    """One lock for every server start of this user (starts are rare; no lock file per
    key is left behind)."""
    with open(Path(path).parent / "start.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _connect(path: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as e:
        conn.close()
        if e.errno == errno.ECONNREFUSED:
            with contextlib.suppress(OSError):
                os.unlink(path)  # a server that died without removing its socket
        return None
    return conn


def _start_server(path: str, env: Mapping[str, str], cwd: str) -> socket.socket:
    # Not the task's own variables: the server outlives the task that started it.
    server_env = {k: v for k, v in env.items() if not k.startswith(("AIRFLOW_CTX_", "_"))}
    proc = _spawn(path, server_env, cwd)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        conn = _connect(path)
        if conn is not None:
            return conn
        if proc.poll() == 0:
            # It found the socket of a server closing down (it exits 0 then), which
            # removes the socket as it goes: start another.
            proc = _spawn(path, server_env, cwd)
        elif proc.poll() is not None:
            try:
                tail = Path(f"{path}.log").read_text(errors="replace")[-500:]
            except OSError:
                tail = "(no log)"
            raise ForkServerUnavailable(f"the fork server exited with {proc.returncode}: {tail}")
        time.sleep(0.05)
    proc.kill()
    raise ForkServerUnavailable(f"the fork server did not listen within {START_TIMEOUT_S:.0f} s")


def _spawn(path: str, env: Mapping[str, str], cwd: str) -> subprocess.Popen[bytes]:
    with open(f"{path}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, "--socket", path, "--idle-s", str(IDLE_S)],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def _request(
    conn: socket.socket, args: Sequence[str], env: Mapping[str, str], cwd: str
) -> ForkedJob:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        body = json.dumps({"argv": list(args), "env": dict(env), "cwd": cwd}).encode() + b"\n"
        conn.sendmsg(
            [body],
            [
                (
                    socket.SOL_SOCKET,
                    socket.SCM_RIGHTS,
                    array.array("i", (devnull, out_w, err_w)).tobytes(),
                )
            ],
        )
        conn.settimeout(30)
        answer = b""
        while b"\n" not in answer:
            chunk = conn.recv(4096)
            if not chunk:
                raise ForkServerUnavailable("the fork server closed the connection")
            answer += chunk
        first, rest = answer.split(b"\n", 1)
        pid = int(json.loads(first)["pid"])
    except (OSError, ValueError, KeyError) as e:
        for fd in (out_r, err_r):
            os.close(fd)
        conn.close()
        raise ForkServerUnavailable(f"the fork server did not take the job: {e}") from e
    finally:
        for fd in (devnull, out_w, err_w):
            os.close(fd)
    job = ForkedJob(conn, pid, os.fdopen(out_r, "rb", buffering=0), os.fdopen(err_r, "rb", 0))
    job.take(rest)  # the exit line, when the job ended before the pid line was read
    return job
