"""A job for tests/test_forkserver.py: ``python -m tests.forkserver_job ACTION [ARG]``.

- ``describe``: prints, as its last stdout line, what a job can see of how it was
  started (argv, working directory, ``sys.path[0]``, a variable, its session, its
  parent, whether torch was imported before it ran), writes a line to stderr and exits
  with the code in ``$FORK_TEST_EXIT`` (default 0).
- ``crash``: ends itself with SIGSEGV, as a native crash would.
- ``grandchild PIDS_FILE``: starts a sleeping child, writes both pids to PIDS_FILE and
  sleeps (for the kill tests).
- ``finish FILE``: leaves a non-daemon thread that writes FILE after a pause, a thread
  pool never shut down, an ``atexit`` handler and a buffered log record that print on
  the way out, unflushed output of Python's and of C's stdio, then exits with
  ``$FORK_TEST_EXIT`` (default 0).
- ``raise``: raises an uncaught ``ValueError``; ``interrupt``: an uncaught
  ``KeyboardInterrupt``; ``exit-message``: ``sys.exit("a message")``; ``exit``:
  ``sys.exit($FORK_TEST_EXIT)``.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

TORCH_BEFORE = "torch" in sys.modules
POOL: ThreadPoolExecutor | None = None


def describe() -> None:
    print("from the job", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    facts = {
        "argv": sys.argv[1:],
        "name": __name__,
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "variable": os.environ.get("FORK_TEST_VARIABLE"),
        "session_leader": os.getsid(0) == os.getpid(),
        "parent": os.getppid(),
        "pid": os.getpid(),
        "torch_before": TORCH_BEFORE,
    }
    print(json.dumps(facts), flush=True)
    sys.exit(int(os.environ.get("FORK_TEST_EXIT", "0")))


def grandchild(pids_file: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(pids_file, "w") as f:
        f.write(json.dumps([os.getpid(), child.pid]))
    time.sleep(120)


def finish(path: str) -> None:
    def late_write() -> None:
        time.sleep(0.5)
        with open(path, "w") as f:
            f.write("written by a non-daemon thread")

    threading.Thread(target=late_write).start()
    # An executor never shut down: its worker is a non-daemon thread that only the
    # interpreter's own shutdown (threading's exit hooks) tells to stop.
    global POOL
    POOL = ThreadPoolExecutor(1)
    POOL.submit(lambda: None).result()
    atexit.register(lambda: print("atexit handler ran"))
    # Held back until logging's own atexit hook flushes it (capacity far above 1 record).
    handler = logging.handlers.MemoryHandler(1000, target=logging.StreamHandler(sys.stderr))
    logging.getLogger("forkserver_job").addHandler(handler)
    logging.getLogger("forkserver_job").warning("a log record on the way out")
    sys.stdout.reconfigure(write_through=False, line_buffering=False)
    sys.stdout.write("unflushed python output\n")
    ctypes.CDLL(None).printf(b"unflushed C output\n")
    sys.exit(int(os.environ.get("FORK_TEST_EXIT", "0")))


if __name__ == "__main__":
    action = sys.argv[1]
    if action == "describe":
        describe()
    elif action == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif action == "grandchild":
        grandchild(sys.argv[2])
    elif action == "finish":
        finish(sys.argv[2])
    elif action == "raise":
        raise ValueError("an uncaught error")
    elif action == "interrupt":
        raise KeyboardInterrupt
    elif action == "exit-message":
        sys.exit("a message")
    elif action == "exit":
        sys.exit(int(os.environ["FORK_TEST_EXIT"]))
