"""The fork server: ``python -m embedfresh.jobs.forkserver --socket PATH``.

A job started as ``python -m embedfresh.jobs.<name>`` pays a fresh interpreter and the
import of torch (about 2 s on a quiet 2-core box, 3-5 s on a busy one) before its own
clock starts, on every task. The fork server pays it once: it imports torch and the
data plane's heavy modules, listens on a Unix socket, and forks one child per request;
each child is the job process, exactly as ``python -m`` would have run it (its argv,
environment, working directory and ``sys.path[0]``, a session and process group of its
own, the caller's stdin/stdout/stderr passed over the socket), and its exit status goes
back on the same connection. The local runner (``operators/runners/forkserver.py``)
starts a server on first use and reuses it for every later job of the same code and
environment.

What a job could inherit from the server is only what happened at import time, so a
server serves one environment (the runner keys its socket by every variable but
Airflow's per-task ones, and by the code's files) and runs no torch op: no OpenMP
thread pool and no CUDA context exist when it forks. With one BLAS thread
(``OMP_NUM_THREADS=1``) it holds no thread but its own (tested); with more, numpy's
OpenBLAS keeps its worker threads, the state ``multiprocessing``'s fork start method
(PyTorch's DataLoader default on Linux) forks from too. The server never handles a
job's work, so a crashing job cannot take it down, and it exits by itself after
``--idle-s`` seconds with no job running.

Protocol (one request per connection): the client sends one JSON line ``{"argv": [...],
"env": {...}, "cwd": "..."}`` with three file descriptors (stdin, stdout, stderr) as
``SCM_RIGHTS``; the server answers ``{"pid": N}`` once the child runs and ``{"exit":
code}`` when it ends (negative: killed by that signal, as ``subprocess`` reports it).

A job ends as the interpreter would end it (non-daemon threads joined, ``atexit``
handlers run, streams flushed, the same exit status and traceback) but without the
interpreter's finalisation (:func:`end_job` says what that skips): tearing down torch
and the other preloaded modules took 0.65-0.9 s in every job on a 2-core box, more
than the rest of its start and end together (docs/BENCHMARKS.md, "Pipeline overhead
... fork server off and on", 2026-11-27).
"""

from __future__ import annotations

import argparse
import array
import atexit
import ctypes
import errno
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import NoReturn

#: Modules every job imports: what the server pays once instead of each job. Not
#: pyarrow: its import starts jemalloc's background thread, and a fork copies only the
#: forking thread (the jobs import it after the fork, as before).
PRELOAD = (
    "torch",
    "numpy",
    "safetensors.torch",
    "tokenizers",
    "embedfresh.core.cli",
    "embedfresh.core.storage",
)
#: Largest request (argv and environment as JSON).
MAX_REQUEST = 1 << 20


@dataclass
class Request:
    """One job to run: ``python -m`` arguments (without the interpreter), environment,
    working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: str


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfresh.jobs.forkserver")
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on")
    parser.add_argument(
        "--idle-s", type=float, default=600.0, help="exit after this long with no job running"
    )
    args = parser.parse_args(argv)
    for module in PRELOAD:
        __import__(module)
    child = serve(args.socket, args.idle_s)
    if child is None:
        return 0
    end_job(run_job(*child))


def serve(path: str, idle_s: float) -> tuple[Request, list[int]] | None:
    """Answer requests until idle; in a forked child, return its request and fds so that
    :func:`main` runs the job at the top of the stack and ends it (:func:`end_job`)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return None  # another server got there first
        raise
    listener.listen(64)
    listener.setblocking(False)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wake the selector, reap below
    signal.signal(signal.SIGTERM, lambda *_: None)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "signal")
    last_busy = time.monotonic()
    server_pid = os.getpid()
    try:
        while True:
            for key, _ in selector.select(timeout=1.0):
                if key.data == "signal":
                    drained = os.read(wake_r, 4096)
                    if signal.SIGTERM in drained and not children:
                        return None
                    continue
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    continue
                got = _receive(conn)
                if got is None:
                    conn.close()
                    continue
                request, fds = got
                pid = os.fork()
                if pid == 0:
                    # The job's own signals: Python's defaults, nothing into the server's pipe.
                    signal.set_wakeup_fd(-1)
                    for sig in (signal.SIGCHLD, signal.SIGTERM):
                        signal.signal(sig, signal.SIG_DFL)
                    selector.close()
                    listener.close()
                    for other in (conn, *children.values()):
                        other.close()
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    return request, fds
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                _send(conn, {"pid": pid})
            _reap(children)
            if children:
                last_busy = time.monotonic()
            elif time.monotonic() - last_busy > idle_s:
                return None
    finally:
        # Only the server removes its socket (a forked child passes here on its way out),
        # its empty log first: a client that finds no socket starts a server whose log
        # this one must not remove.
        if os.getpid() == server_pid:
            for leftover in (f"{path}.log", path):
                try:
                    if leftover == path or os.path.getsize(leftover) == 0:
                        os.unlink(leftover)  # the socket, and its log unless it says something
                except OSError:
                    pass


def _reap(children: dict[int, socket.socket]) -> None:
    """Tell each ended child's client how it ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        try:
            _send(conn, {"exit": code})
        except OSError:
            pass  # the client is gone (its task was killed): nobody to tell
        conn.close()


def _receive(conn: socket.socket) -> tuple[Request, list[int]] | None:
    """One request line and its three file descriptors, or None when malformed."""
    conn.setblocking(True)
    conn.settimeout(10)
    fds = array.array("i")
    data = b""
    try:
        while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
            msg, ancdata, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
            if not msg:
                break
            data += msg
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        body = json.loads(data)
        request = Request(argv=list(body["argv"]), env=dict(body["env"]), cwd=str(body["cwd"]))
    except (OSError, ValueError, KeyError, TypeError):
        for fd in fds:
            os.close(fd)
        return None
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    conn.settimeout(None)
    return request, list(fds)


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def run_job(request: Request, fds: list[int]) -> int:
    """In the forked child: become the job ``python -m`` would have started, run it, and
    return its exit status (an uncaught exception's traceback printed, as Python would)."""
    import logging
    import random
    import runpy

    import numpy

    os.setsid()
    # First, while the server's environment still spans the memory the title may use.
    _set_title(request.argv)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request.env)
    # The job's own streams on fds 0-2; written through when it asked for unbuffered.
    unbuffered = bool(request.env.get("PYTHONUNBUFFERED"))
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    if unbuffered:
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    # A fresh interpreter's random state, not the server's shared by every child.
    random.seed()
    numpy.random.seed()
    os.chdir(request.cwd)
    sys.path[0] = request.cwd  # as `python -m` puts the working directory first
    logging.root.handlers.clear()
    if request.argv[:1] != ["-m"] or len(request.argv) < 2:
        print(f"fork server: not a `-m module` command: {request.argv}", file=sys.stderr)
        return 2
    module = request.argv[1]
    sys.argv = [module, *request.argv[2:]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return exit_status(e.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        return BY_SIGINT
    except BaseException:  # noqa: BLE001 - what the interpreter does with any other
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


#: :func:`run_job`'s status for an uncaught KeyboardInterrupt: Python ends itself by
#: SIGINT then (128 + SIGINT where SIGINT is blocked).
BY_SIGINT = -1


def exit_status(code: object) -> int:
    """The status (0-255) ``sys.exit(code)`` gives a process: None is 0; an int its low
    8 bits (-1 is 255, 256 is 0), 255 beyond a C long; anything else is printed to
    stderr and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -(2**63) <= code < 2**63 else 255
    print(code, file=sys.stderr)
    return 1


def end_job(status: int) -> NoReturn:
    """End the forked job as the interpreter would, less its finalisation: run
    threading's exit hooks and join its non-daemon threads, run its ``atexit`` handlers
    (logging's flush among them), flush Python's and C's stdio (a failed flush ends it
    with 120, as Python does), then ``os._exit``. ``status``: 0-255, or
    :data:`BY_SIGINT`.

    Skipped, with the teardown of the server's modules: the finalisers of objects still
    referenced at exit (``__del__``, ``weakref.finalize``, a file object left open and
    unflushed in a module's global), C ``atexit`` handlers and C++ static destructors.
    The project's jobs close what they open; a job that relies on those runs under
    ``EMBEDFRESH_FORK_SERVER=0``."""
    # What the interpreter runs first on its way out: threading's exit hooks (they stop
    # the workers of a thread pool never shut down), then a join of non-daemon threads.
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    else:  # not CPython's threading: join what it would have joined
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None or stream.closed:
            continue
        try:
            stream.flush()
        except OSError:
            status = 120  # Python's status when it cannot flush its streams at exit
    ctypes.CDLL(None).fflush(None)  # what native code printed (C stdout is block-buffered)
    if status == BY_SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 128 + signal.SIGINT  # SIGINT blocked: Python's status then
    os._exit(status)


def _set_title(argv: list[str]) -> None:
    """The process's title: the command it runs, as ``ps`` would show a spawned job."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(" ".join([os.path.basename(sys.executable), *argv]))


if __name__ == "__main__":
    sys.exit(main())
