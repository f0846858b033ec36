"""Data parallel training on cpu under ``torchrun --nproc-per-node 2`` (gloo): each rank
trains on its shard of the epoch order, DDP averages the gradients, rank 0 alone writes
checkpoints, the version and the report, and a killed run resumes bit-exactly. The 2-rank
run one process is compared with is the suite's shared one (tests/sharded.py, under the
project's launcher); the killed run is started by ``torch.distributed.run`` itself."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import torch
from safetensors.torch import load_file

from tests import sharded
from tests.conftest import ROOT, job_env, run_job

BASE = ("data_interval_start=2026-01-01", "init=base", "log_every=1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(root: str, run_id: str, *sets: str) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    cmd += ["-m", "embedfresh.jobs.train"]
    for s in (f"artifact_root={root}", f"run_id={run_id}", *BASE, *sets):
        cmd += ["--set", s]
    return cmd


def weights(root: str, version: str) -> dict[str, torch.Tensor]:
    path = Path(root.removeprefix("file://")) / "models/tiny/versions" / version
    return load_file(path / "model.safetensors")


def report(root: str, run_id: str) -> dict:
    path = Path(root.removeprefix("file://")) / "runs/tiny" / run_id / "reports/train.json"
    return json.loads(path.read_text())


def test_two_ranks_match_one_process_with_the_global_batch(root: str, ddp_reference) -> None:
    # No dropout and no in-batch contrastive term: then the mean of the two ranks'
    # gradients is the gradient of one process over both shards together. The 2-rank run
    # is the suite's shared one (tests/sharded.py, DDP_REFERENCE: batch 16 a rank).
    ranks = sharded.DDP_REFERENCE_RANKS
    assert ranks == 2 and "batch_size=16" in sharded.DDP_REFERENCE
    one_process = [s for s in sharded.DDP_REFERENCE if not s.startswith("batch_size=")]
    single = run_job(
        "train", f"artifact_root={root}", "run_id=single", *one_process, "batch_size=32"
    )
    assert single.returncode == 0, single.stderr[-3000:]

    ddp, one = ddp_reference.report(), report(root, "single")
    assert ddp["world_size"] == 2 and (ddp["nodes"], ddp["devices_per_node"]) == (1, 2)
    assert ddp["compute_hours"] > 0 and ddp["estimated_cost_usd"] > 0
    assert ddp["steps"] == one["steps"] == 6
    a, b = ddp_reference.weights(), weights(root, "single")
    assert a.keys() == b.keys()
    start = weights_at_init(root)
    moved = max(float((b[k] - start[k]).abs().max()) for k in b)
    assert moved > 1e-3, "training did not move the weights"
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    # rank 0 alone wrote: one report, one version, the checkpoint listed once
    assert ddp_reference.checkpoints() == ["step-00000003"]


def weights_at_init(root: str) -> dict[str, torch.Tensor]:
    from embedfresh.ml.data.schema import DEMO_FEATURES
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec

    spec = get_spec("tiny").model_copy(update={"features": DEMO_FEATURES})  # the demo's head
    return {k: v.detach().clone() for k, v in versions.build_model(spec, 0).state_dict().items()}


def kill_tree(pid: int) -> None:
    """SIGKILL torchrun and its workers: torchrun starts each worker in a session of its
    own, so killing torchrun's process group alone leaves them training."""
    parent = psutil.Process(pid)
    for proc in [*parent.children(recursive=True), parent]:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue


def test_killed_ddp_run_resumes_bit_exactly(root: str) -> None:
    sets = ("batch_size=16", "max_steps=32", "checkpoint_every=4")
    reference = subprocess.run(
        torchrun(root, "whole", *sets), cwd=ROOT, env=job_env(), capture_output=True, timeout=600
    )
    assert reference.returncode == 0, reference.stderr[-3000:]

    proc = subprocess.Popen(
        torchrun(root, "killed", *sets),
        cwd=ROOT,
        env=job_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        committed = False
        for line in iter(proc.stderr.readline, ""):
            # the log is read behind the run: kill at the first commit seen
            if "checkpoint step" in line and "committed" in line:
                committed = True
                kill_tree(proc.pid)
                break
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    assert committed and proc.returncode == -signal.SIGKILL, "the run ended before the kill"

    resumed = subprocess.run(
        torchrun(root, "killed", *sets), cwd=ROOT, env=job_env(), capture_output=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 4 <= report(root, "killed")["resumed_from"]["step"] < 32
    a, b = weights(root, "killed"), weights(root, "whole")
    assert all(torch.equal(a[k], b[k]) for k in b), "resume is not bit-exact"
