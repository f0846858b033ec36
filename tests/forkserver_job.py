"""A job for tests/test_forkserver.py: ``python -m tests.forkserver_job ACTION [ARG]``.

- ``describe``: prints, as its last stdout line, what a job can see of how it was
  started (argv, working directory, ``sys.path[0]``, a variable, its session, its
  parent, whether torch was imported before it ran), writes a line to stderr and exits
  with the code in ``$FORK_TEST_EXIT`` (default 0).
- ``crash``: ends itself with SIGSEGV, as a native crash would.
- ``grandchild PIDS_FILE``: starts a sleeping child, writes both pids to PIDS_FILE and
  sleeps (for the kill tests).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

TORCH_BEFORE = "torch" in sys.modules


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


if __name__ == "__main__":
    action = sys.argv[1]
    if action == "describe":
        describe()
    elif action == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif action == "grandchild":
        grandchild(sys.argv[2])
