"""Multi-rank training runs shared by the tests that compare against them.

A run of several ranks on this suite's 2-core hosts costs tens of seconds; the tests
that need the same uninterrupted run as their reference read one (a session fixture of
``tests/conftest.py``, built once per pytest-xdist worker) instead of each training its
own. What a test checks of the reference itself (exit code, report, checkpoints) it
still checks, on the shared run; what it trains to compare with it, it trains in its
own store. Nothing writes into a shared run's store.

- :data:`DDP_REFERENCE`: data parallel on 2 ranks under the project's launcher, no
  dropout and no in-batch contrastive term (the mean of the ranks' gradients is then the
  same sum however the ranks hold the model or wherever they run), 6 steps of a global
  batch of 32, a checkpoint at step 3. ``tests/test_train_ddp.py`` (one process with the
  global batch), ``tests/test_train_fsdp.py`` (FSDP2 on 2 ranks) and
  ``tests/test_multinode_netns.py`` (2 ranks on two hosts, bit-exact) compare with it:
  fixture ``ddp_reference``.

Launches of 4 processes on one host (4 workers on a 2-core box, the dearest runs here):
one in the suite, the 4-rank FSDP run whose checkpoint ``tests/test_train_fsdp.py``
resumes on 2 ranks. ``tests/test_multinode_netns.py``'s hsdp run is 4 ranks over two
hosts of 2 (what it tests); its single-host ddp side trains the same global batch on 2.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.conftest import ROOT, files_sha256, job_env

TIMEOUT_S = 600
#: The reference's settings, every one: a test that trains what it compares with the
#: reference starts from these (plus its own ``run_id``, ``artifact_root``, parallelism).
DDP_REFERENCE = (
    "data_interval_start=2026-01-01",
    "init=base",
    "log_every=1",
    "contrastive_weight=0",
    "dropout=0",
    "batch_size=16",
    "max_steps=6",
    "checkpoint_every=3",
)
DDP_REFERENCE_RANKS = 2


def as_settings(sets: tuple[str, ...]) -> dict[str, object]:
    """``key=value`` settings as a job spec's dict (values read as the job reads them)."""
    settings: dict[str, object] = {}
    for s in sets:
        key, value = s.split("=", 1)
        try:
            settings[key] = json.loads(value)
        except json.JSONDecodeError:
            settings[key] = value
    return settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(root: str, run_id: str, nproc: int, *sets: str, job: str = "train") -> list[str]:
    """``job`` under the project's launcher (torchrun keeping the exit codes), ``nproc``
    processes on this host."""
    cmd = [sys.executable, "-m", "embedfresh.jobs.launch", "--nproc-per-node", str(nproc)]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    cmd += ["-m", f"embedfresh.jobs.{job}"]
    for s in (f"artifact_root={root}", f"run_id={run_id}", *sets):
        cmd += ["--set", s]
    return cmd


@dataclass(frozen=True)
class Run:
    """A finished run in a store of its own: read it, never write to it."""

    root: str
    run_id: str
    stderr: str

    @property
    def store(self) -> Path:
        return Path(self.root.removeprefix("file://"))

    def weights(self) -> dict[str, torch.Tensor]:
        return load_file(self.store / "models/tiny/versions" / self.run_id / "model.safetensors")

    def weights_path(self) -> Path:
        return self.store / "models/tiny/versions" / self.run_id / "model.safetensors"

    def report(self) -> dict:
        return json.loads(
            (self.store / "runs/tiny" / self.run_id / "reports/train.json").read_text()
        )

    def snapshot(self) -> dict[str, str]:
        """Every file of the store with its sha256."""
        return files_sha256(self.store)

    def checkpoints(self) -> list[str]:
        return sorted(
            p.name for p in (self.store / "runs/tiny" / self.run_id / "checkpoints").iterdir()
        )


def ddp_reference(data_template: Path, where: Path) -> Run:
    """:data:`DDP_REFERENCE` trained in a copy of the generated data at ``where``."""
    store = where / "artifacts"
    shutil.copytree(data_template, store)
    root = f"file://{store}"
    done = subprocess.run(
        launch(root, "ddp", DDP_REFERENCE_RANKS, *DDP_REFERENCE),
        cwd=ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, "the shared DDP reference run failed:\n" + done.stderr[-3000:]
    return Run(root, "ddp", done.stderr)
