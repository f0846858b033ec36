"""``python -m embedfresh.jobs.launch``: torchrun whose exit code is the failing worker's own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, job_env

WORKER = """
import os, signal, sys
rank = int(os.environ["RANK"])
action = sys.argv[1]
if rank == 1 and action == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(action) if rank == 1 and action.isdigit() else 0)
"""


def launch(tmp_path: Path, action: str) -> subprocess.CompletedProcess[str]:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    return subprocess.run(
        [sys.executable, "-m", "embedfresh.jobs.launch", "--standalone", "--nproc-per-node", "2",
         str(worker), action],
        cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("code", [2, 3, 4, 75])
def test_the_failing_workers_contract_code_is_the_exit_code(tmp_path: Path, code: int) -> None:
    proc = launch(tmp_path, str(code))
    assert proc.returncode == code, proc.stderr[-2000:]
    assert f"rank 1 failed first; exiting with its code {code}" in proc.stderr


def test_success_exits_0(tmp_path: Path) -> None:
    proc = launch(tmp_path, "0")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_worker_killed_by_a_signal_exits_128_plus_signal(tmp_path: Path) -> None:
    proc = launch(tmp_path, "kill")
    assert proc.returncode == 128 + 9, proc.stderr[-2000:]


SLEEPER = """
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], os.environ["RANK"]).write_text(str(os.getpid()))
time.sleep(600)
"""


def test_killing_the_local_runner_ends_every_torchrun_worker(tmp_path: Path) -> None:
    """torchrun puts each worker in a session of its own: on_kill must still reach them."""
    import logging
    import threading
    import time

    import psutil

    from embedfresh.operators.runners import LocalRunner

    worker = tmp_path / "sleeper.py"
    worker.write_text(SLEEPER)
    pids = tmp_path / "pids"
    pids.mkdir()
    # No grace: the launcher is SIGKILLed before it can forward SIGTERM to its workers.
    runner = LocalRunner(kill_grace_s=0)
    argv = [sys.executable, "-m", "embedfresh.jobs.launch", "--standalone", "--nproc-per-node", "2"]
    thread = threading.Thread(
        target=runner.run_command,
        args=([*argv, str(worker), str(pids)], job_env(), logging.getLogger("test")),
    )
    thread.start()
    deadline = time.monotonic() + 120
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    workers = [int(p.read_text()) for p in pids.iterdir()]
    assert len(workers) == 2
    assert all(psutil.pid_exists(pid) for pid in workers)
    runner.kill()
    thread.join(timeout=60)
    assert not thread.is_alive()
    time.sleep(0.5)
    alive = [p for p in workers if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert alive == []


STOPPER = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))  # what a training worker does
pathlib.Path(sys.argv[1], os.environ["RANK"]).write_text(str(os.getpid()))
time.sleep(600)
"""


def test_sigterm_to_the_launcher_reaches_the_workers_and_exits_75(tmp_path: Path) -> None:
    """Batch stopping a multi-node main container, or the runner's kill: the launcher
    forwards SIGTERM, its workers checkpoint and exit 75, and so does the launch (it
    exited 1 with torchrun's SignalException traceback before)."""
    import signal
    import time

    worker = tmp_path / "stopper.py"
    worker.write_text(STOPPER)
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedfresh.jobs.launch", "--standalone", "--nproc-per-node", "2",
         str(worker), str(pids)],
        cwd=ROOT, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(list(pids.iterdir())) == 2, "the workers did not start"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 75, stderr[-2000:]
    assert "launch: stopped by signal SIGTERM" in stderr
    assert "Traceback" not in stderr
