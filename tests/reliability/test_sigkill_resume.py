"""Twenty SIGKILLs of training: five runs, each killed four times at seeded random steps
(two on checkpoint boundaries, two between them) and restarted with the same run id.
Every run ends with weights bit-identical (sha256) to the uninterrupted run.

Per kill it records the time from the restart (process start) to the first new step
logged, and the steps lost: the last step logged before the kill minus the step the
restart resumed from, at most one checkpoint interval.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tests.conftest import ROOT, job_env, run_job
from tests.reliability import figures
from tests.test_train_resume import TRAIN, weights_sha

CHECKPOINT_EVERY = 7  # as in TRAIN
STEPS = 64  # 1024 rows / batch 32 x 2 epochs
RUNS = 5
KILLS_PER_RUN = 4

_STEP = re.compile(r" step (\d+)/(\d+) ")
_RESUMED = re.compile(r"resuming from .* \(step (\d+)\)")


def kill_steps(seed: int) -> list[int]:
    """Four increasing steps, two on checkpoint boundaries and two between, at least
    three steps apart so each restart has room to reach its target."""
    rng = random.Random(seed)
    while True:
        on = rng.sample(range(CHECKPOINT_EVERY, STEPS - 3, CHECKPOINT_EVERY), 2)
        between = rng.sample(
            [s for s in range(3, STEPS - 3) if s % CHECKPOINT_EVERY], KILLS_PER_RUN - 2
        )
        steps = sorted(on + between)
        if all(b - a >= 3 for a, b in itertools.pairwise(steps)):
            return steps


@dataclass
class Attempt:
    resumed_from: int  # 0 when it started from scratch
    first_step_s: float | None  # process start to the first new step logged
    last_step: int  # last step logged before it ended
    returncode: int


def attempt(root: str, run_id: str, kill_at: int | None) -> Attempt:
    """One training process; SIGKILLed right after it logs step ``kill_at`` (None: let it
    finish). A restart that resumed at or past ``kill_at`` is killed at its next step."""
    cmd = [sys.executable, "-m", "embedfresh.jobs.train"]
    for s in (f"artifact_root={root}", f"run_id={run_id}", *TRAIN):
        cmd += ["--set", s]
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=job_env(),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    resumed, first, first_step, last, target = 0, None, None, 0, kill_at
    tail: list[str] = []
    try:
        for line in iter(proc.stderr.readline, ""):
            tail = [*tail[-30:], line]
            if m := _RESUMED.search(line):
                resumed = int(m.group(1))
                if target is not None and target <= resumed:
                    target = resumed + 1
            elif m := _STEP.search(line):
                last = int(m.group(1))
                if first is None:
                    first, first_step = time.perf_counter() - started, last
                if target is not None and last >= target:
                    os.kill(proc.pid, signal.SIGKILL)
                    target = None  # once; read on: lines already written still count
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    expected = 0 if kill_at is None else -signal.SIGKILL
    assert proc.returncode == expected, "".join(tail)
    assert first_step == resumed + 1, "".join(tail)  # the first new step follows the checkpoint
    return Attempt(resumed, first, last, proc.returncode)


@pytest.fixture(scope="module")
def root(data_template, tmp_path_factory) -> str:
    import shutil

    dest = tmp_path_factory.mktemp("sigkill") / "artifacts"
    shutil.copytree(data_template, dest)
    return f"file://{dest}"


@pytest.fixture(scope="module")
def reference(root: str) -> str:
    result = run_job("train", f"artifact_root={root}", "run_id=uninterrupted", *TRAIN)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == STEPS and summary["resumed_from"] is None
    return weights_sha(root, "uninterrupted")


def test_kill_steps_fall_on_and_between_checkpoints():
    for seed in range(RUNS):
        steps = kill_steps(seed)
        assert len(steps) == KILLS_PER_RUN and steps == sorted(set(steps))
        on = [s for s in steps if s % CHECKPOINT_EVERY == 0]
        assert len(on) == 2, steps
        assert all(3 <= s < STEPS - 2 for s in steps), steps


@pytest.mark.parametrize("seed", range(RUNS))
def test_four_sigkills_then_the_run_is_bit_exact(root, reference, seed):
    run_id = f"killed-{seed}"
    targets = kill_steps(seed)
    attempts = [attempt(root, run_id, kill_at) for kill_at in targets]
    attempts.append(attempt(root, run_id, None))
    for n, (killed, restart) in enumerate(itertools.pairwise(attempts), start=1):
        lost = killed.last_step - restart.resumed_from
        figures.record(
            "kills",
            run=run_id,
            kill=n,
            target_step=targets[n - 1],
            killed_after_step=killed.last_step,
            resumed_from=restart.resumed_from,
            steps_lost=lost,
            restart_to_first_step_s=round(restart.first_step_s, 3),
            checkpoint_every=CHECKPOINT_EVERY,
        )
        assert restart.resumed_from % CHECKPOINT_EVERY == 0
        assert 0 <= lost <= CHECKPOINT_EVERY, (n, killed, restart)
    assert attempts[-1].last_step == STEPS
    assert weights_sha(root, run_id) == reference
