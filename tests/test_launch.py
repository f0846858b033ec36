"""``python -m jobs.launch``: torchrun whose exit code is the failing worker's own."""

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
        [sys.executable, "-m", "jobs.launch", "--standalone", "--nproc-per-node", "2",
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
