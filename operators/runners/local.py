"""Local runner: the job as a subprocess of the Airflow worker, in its own process group."""

from __future__ import annotations

import collections
import json
import logging
import os
import selectors
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import psutil

from embedfresh.operators.job_spec import JobSpec
from embedfresh.operators.runners import forkserver
from embedfresh.operators.runners.base import JobResult

#: Environment every local job gets unless the worker or the spec says otherwise.
DEFAULT_ENV: Mapping[str, str] = {"HF_HUB_OFFLINE": "1"}


class LocalRunner:
    """Runs ``python -m embedfresh.jobs.<job>`` on the worker and streams its output into the task log.

    The job starts in a new session, so :meth:`kill` reaches everything it spawned
    (torchrun workers, data loader processes) through the process group.

    :param python: interpreter that runs the job; defaults to the worker's own.
    :param kill_grace_s: seconds between SIGTERM and SIGKILL in :meth:`kill`.
    :param tail_lines: stderr lines kept for :attr:`JobResult.tail`.
    :param cwd: working directory of the job; defaults to the worker's.
    """

    def __init__(
        self,
        *,
        python: str | None = None,
        kill_grace_s: float = 10.0,
        tail_lines: int = 40,
        cwd: str | None = None,
    ) -> None:
        self.python = python or sys.executable
        self.kill_grace_s = kill_grace_s
        self.tail_lines = tail_lines
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | forkserver.ForkedJob | None = None
        self._running = False

    def command(self, spec: JobSpec) -> list[str]:
        return spec.argv(self.python)

    def environment(self, extra: Mapping[str, str]) -> dict[str, str]:
        """Worker env + defaults (where unset) + the spec's env; unbuffered for streaming."""
        env = dict(os.environ)
        for key, value in DEFAULT_ENV.items():
            env.setdefault(key, value)
        env.update({k: str(v) for k, v in extra.items()})
        env["PYTHONUNBUFFERED"] = "1"
        # What the job may spend on a checkpoint after SIGTERM: this runner's own grace.
        env.setdefault("EMBEDFRESH_SIGTERM_GRACE_S", str(self.kill_grace_s))
        return env

    def run(self, spec: JobSpec, log: logging.Logger) -> JobResult:
        started = time.time()
        result = self.run_command(self.command(spec), spec.env, log)
        return replace(result, cost=local_cost(spec, started, time.time(), result.exit_code))

    def run_command(
        self, argv: Sequence[str], env: Mapping[str, str], log: logging.Logger
    ) -> JobResult:
        """Run any command the way :meth:`run` runs a job (the seam the tests use)."""
        log.info("Running: %s", shlex.join(argv))
        self._proc = proc = self._start(argv, self.environment(env), log)
        self._running = True
        last_stdout = ""
        stderr_tail: collections.deque[str] = collections.deque(maxlen=self.tail_lines)
        # One thread, one selector: lines reach the task log as they come, in order, and
        # the main thread never blocks in proc.wait() while the job runs, so kill() (from
        # on_kill's signal handler) can still poll the process.
        try:
            for stream, line in _lines(proc):
                log.info("%s", line)
                if stream == "stderr":
                    stderr_tail.append(line)
                elif line.strip():
                    last_stdout = line
            exit_code = proc.wait()
        finally:
            self._running = False
        if isinstance(proc, forkserver.ForkedJob) and proc.server_lost:
            log.error(
                "The fork server ended before the job (pid %s): its exit code is unknown", proc.pid
            )
        log.info("Job exited with code %s (pid %s)", exit_code, proc.pid)
        return JobResult(
            exit_code=exit_code, summary=_parse_summary(last_stdout), tail="\n".join(stderr_tail)
        )

    def _start(
        self, argv: Sequence[str], env: dict[str, str], log: logging.Logger
    ) -> subprocess.Popen[bytes] | forkserver.ForkedJob:
        """The job in a session of its own: forked from the fork server, which has torch
        imported already, when it can run the command; else a fresh interpreter."""
        if forkserver.enabled(env) and forkserver.module_command(argv, self.python):
            try:
                job = forkserver.start(argv, env, self.cwd)
            except forkserver.ForkServerUnavailable as e:
                log.warning("Fork server unavailable (%s): the job starts a fresh interpreter", e)
            else:
                log.info("Job forked by the fork server (pid %s): its imports were done", job.pid)
                return job
        return subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.cwd,
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGTERM the job's process tree, then SIGKILL it after ``kill_grace_s``.

        The tree, not only the process group: torchrun (:mod:`embedfresh.jobs.launch`) starts each
        worker in a session of its own, so signalling the group alone would leave the
        workers training.
        """
        proc = self._proc
        if proc is None or not self._running:
            return  # nothing started, or run() already returned: the group is not ours
        pgid = proc.pid  # start_new_session: the job leads its own process group
        tree = _descendants(proc.pid)
        if proc.poll() is None:
            _signal_tree(pgid, tree, signal.SIGTERM)
            deadline = time.monotonic() + self.kill_grace_s
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        # Also reaches children that outlived the leader (torchrun workers, loaders).
        _signal_tree(pgid, tree + _descendants(proc.pid), signal.SIGKILL)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_tree(pgid: int, tree: list[psutil.Process], sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for child in tree:
        try:
            child.send_signal(sig)  # psutil checks the pid still names the same process
        except psutil.Error:
            pass


def _lines(proc: subprocess.Popen[bytes] | forkserver.ForkedJob) -> Iterator[tuple[str, str]]:
    """Yield ``(stream name, line)`` from the job's stdout and stderr until both close."""
    assert proc.stdout is not None and proc.stderr is not None
    pending = {"stdout": b"", "stderr": b""}
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, "stdout")
        selector.register(proc.stderr, selectors.EVENT_READ, "stderr")
        while selector.get_map():
            for key, _ in selector.select():
                name = key.data
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    key.fileobj.close()
                    if pending[name]:
                        yield name, _decode(pending[name])
                    continue
                *complete, pending[name] = (pending[name] + chunk).split(b"\n")
                for raw in complete:
                    yield name, _decode(raw)


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\r")


def _parse_summary(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def local_cost(spec: JobSpec, started: float, stopped: float, exit_code: int) -> dict[str, Any]:
    """The cost record of one local execution: the process's wall time, priced as the
    instance the spec's backend would run on (:data:`embedfresh.core.cost.DEFAULT_INSTANCE`)."""
    import datetime as dt

    from embedfresh.core.cost import DEFAULT_INSTANCE, cost_record

    def iso(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()

    backend = str(spec.settings.get("backend", "cpu"))
    attempt = {
        "attempt": 1,
        "started_at": iso(started),
        "stopped_at": iso(stopped),
        "seconds": round(stopped - started, 3),
        "exit_code": exit_code,
    }
    return cost_record(
        [attempt],
        instance_type=DEFAULT_INSTANCE.get(backend, "cpu"),
        nodes=1,
        runner="local",
        job=spec.job,
    )
