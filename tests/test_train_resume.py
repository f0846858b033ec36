"""Bit-exact resume: a training process SIGKILLed at random steps and restarted ends
with the same weights (sha256) as an uninterrupted run."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, job_env, run_job

TRAIN = (
    "data_interval_start=2026-01-01",
    "epochs=2",
    "checkpoint_every=7",
    "keep_last=2",
    "log_every=1",
    "init=base",
)


def weights_sha(root: str, version: str) -> str:
    path = Path(root.removeprefix("file://")) / "models/tiny/versions" / version
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def train_until_killed(
    root: str,
    run_id: str,
    kill_at: int,
    sets: tuple[str, ...] = TRAIN,
    env: dict[str, str] | None = None,
) -> int:
    """Start training, SIGKILL it once it logs step ``kill_at`` (or, when it resumed at or
    past that step, three steps after its resume point); returns the step it aimed at.
    ``sets`` and ``env`` replace the module's training overrides and add to the env."""
    cmd = [
        sys.executable,
        "-m",
        "embedfresh.jobs.train",
        "--set",
        f"artifact_root={root}",
        "--set",
        f"run_id={run_id}",
    ]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=job_env(env),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    target = kill_at
    try:
        for line in iter(proc.stderr.readline, ""):
            resumed = re.search(r"resuming from .* \(step (\d+)\)", line)
            if resumed and int(resumed.group(1)) + 3 > target:
                target = int(resumed.group(1)) + 3
            if f" step {target}/" in line:
                os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, "training finished before it could be killed"
    return target


def train(root: str, run_id: str) -> dict:
    result = run_job("train", f"artifact_root={root}", f"run_id={run_id}", *TRAIN)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def root(data_template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One store for the module: the runs below differ by run id."""
    dest = tmp_path_factory.mktemp("resume") / "artifacts"
    shutil.copytree(data_template, dest)
    return f"file://{dest}"


@pytest.fixture(scope="module")
def reference(root: str) -> str:
    summary = train(root, "uninterrupted")
    assert summary["resumed_from"] is None
    assert summary["steps"] == 64  # 1024 rows / batch 32 x 2 epochs
    return weights_sha(root, "uninterrupted")


# Random kill points at scale (20 SIGKILLs over 5 runs): tests/reliability/test_sigkill_resume.py.
@pytest.mark.parametrize("seed", [1])
def test_sigkill_at_random_step_then_resume_is_bit_exact(root, reference, seed):
    kill_at = random.Random(seed).randint(8, 55)
    run_id = f"killed-{seed}"
    train_until_killed(root, run_id, kill_at)
    summary = train(root, run_id)
    assert summary["resumed_from"] is not None, "the restart did not resume"
    assert 0 < summary["resumed_from"]["step"] < 64
    assert summary["resumed_from"]["kernels_changed"] == []  # the same thread count
    assert weights_sha(root, run_id) == reference


def test_two_kills_in_one_run_still_bit_exact(root, reference):
    train_until_killed(root, "twice", 10)
    train_until_killed(root, "twice", 40)
    summary = train(root, "twice")
    assert summary["resumed_from"]["step"] >= 28
    assert weights_sha(root, "twice") == reference


def test_a_resume_under_another_thread_count_says_it_is_not_bit_exact(root):
    """The checkpoint records the kernels' thread count; a resume under another one still
    finishes, but says its weights are no longer bit-exact and how to restore that."""
    train_until_killed(root, "threads", 10, env={"OMP_NUM_THREADS": "1"})
    result = run_job(
        "train", f"artifact_root={root}", "run_id=threads", *TRAIN, env={"OMP_NUM_THREADS": "2"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"]["kernels_changed"] == ["threads 1 -> 2"]
    assert "will not be bit-exact with an uninterrupted run's" in result.stderr
    assert "OMP_NUM_THREADS=1" in result.stderr
