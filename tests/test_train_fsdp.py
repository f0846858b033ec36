"""Sharded training on cpu (gloo): ``parallelism=fsdp`` under the project's launcher.

FSDP2 trains what DDP trains (the same global batch: the same weights up to the order
of the sums); each rank holds half of the weights, gradients and AdamW state; a sharded
checkpoint is every rank's shards through ``torch.distributed.checkpoint`` into the
store, committed by one marker; a run killed twice resumes bit-exactly; a checkpoint
saved by 4 ranks resumes on 2 (DCP reshards it) and the loss goes on where it was; and
what cannot run is refused before anything is written."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from embedfresh.ml.parallel.store_dcp import METADATA, rank_file
from tests.conftest import ROOT, job_env, run_job
from tests.sharded import DDP_REFERENCE, DDP_REFERENCE_RANKS, Run
from tests.test_train_ddp import free_port, kill_tree, report, weights

# init=auto: base weights in these fresh stores (no production version yet)
BASE = ("data_interval_start=2026-01-01", "log_every=1")
# No dropout and no in-batch contrastive term: the mean of the ranks' gradients is then
# the same sum however the ranks hold the model.
SAME_MATH = ("contrastive_weight=0", "dropout=0")
TIMEOUT_S = 600


def launch(root: str, run_id: str, nproc: int, *sets: str) -> list[str]:
    """The train job under the project's launcher (torchrun keeping the exit codes)."""
    cmd = [sys.executable, "-m", "embedfresh.jobs.launch", "--nproc-per-node", str(nproc)]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    cmd += ["-m", "embedfresh.jobs.train"]
    for s in (f"artifact_root={root}", f"run_id={run_id}", *BASE, *sets):
        cmd += ["--set", s]
    return cmd


def train(root: str, run_id: str, nproc: int, *sets: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        launch(root, run_id, nproc, *sets),
        cwd=ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def killed_after(root: str, run_id: str, nproc: int, words: tuple[str, ...], *sets: str) -> str:
    """Start the run and SIGKILL every process of it at the first log line holding every
    word (read behind the run); the log up to there."""
    proc = subprocess.Popen(
        launch(root, run_id, nproc, *sets),
        cwd=ROOT,
        env=job_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen = []
    try:
        for line in iter(proc.stderr.readline, ""):
            seen.append(line)
            if all(w in line for w in words):
                kill_tree(proc.pid)
                break
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    assert proc.returncode == -signal.SIGKILL, "the run ended before the kill:\n" + "".join(
        seen[-20:]
    )
    return "".join(seen)


def checkpoint_dir(root: str, run_id: str, step: int) -> Path:
    return Path(root.removeprefix("file://"), "runs/tiny", run_id, f"checkpoints/step-{step:08d}")


def test_fsdp_trains_what_ddp_trains_holding_half_of_it_per_rank(
    root: str, ddp_reference: Run
) -> None:
    # DDP on 2 ranks is the suite's shared reference run (tests/sharded.py): the same
    # settings here, FSDP2, and activation checkpointing on as well (it recomputes, it
    # changes no number).
    sets = (*DDP_REFERENCE, "parallelism=fsdp", "activation_checkpointing=true")
    fsdp = train(root, "fsdp", DDP_REFERENCE_RANKS, *sets)
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    assert "2 blocks and the root sharded over a mesh 2 (shard)" in fsdp.stderr
    assert "activation checkpointing: 2 blocks" in fsdp.stderr

    a, b = weights(root, "fsdp"), ddp_reference.weights()
    assert a.keys() == b.keys()  # the version is the whole model, under its own names
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)

    sharded, whole = report(root, "fsdp"), ddp_reference.report()
    assert sharded["parallelism"] == {
        "parallelism": "fsdp", "mesh": {"shard": 2}, "param_dtype": "fp32", "reduce_dtype": "fp32",
    }  # fmt: skip
    assert whole["parallelism"] == {"parallelism": "ddp"}
    for part in ("weights", "gradients", "optimizer"):
        full = whole["tensor_bytes_per_rank"][0][part]
        for rank in sharded["tensor_bytes_per_rank"]:
            assert abs(rank[part] - full / 2) <= 0.02 * full, (part, rank, full)

    # The checkpoint: each rank's shards, DCP's metadata, the run's state; one COMMIT
    # listing them all with size and sha256, as every checkpoint's.
    folder = checkpoint_dir(root, "fsdp", 3)
    marker = json.loads((folder / "COMMIT").read_text())
    listed = set(marker["files"])
    assert listed == {rank_file(0), rank_file(1), METADATA, "state.pt", "meta.json"}
    assert {p.name for p in folder.iterdir()} == listed | {"COMMIT"}
    meta = json.loads((folder / "meta.json").read_text())
    assert (meta["format"], meta["world_size"], meta["global_batch"]) == ("dcp", 2, 32)

    # The version is any version: evaluated and gated (against the base) as every one is.
    evaluated = run_job("evaluate", f"artifact_root={root}", "run_id=fsdp")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    gated = run_job("gate", f"artifact_root={root}", "run_id=fsdp", "refusal_exits=false")
    assert gated.returncode == 0, gated.stderr[-2000:]
    decision = json.loads(
        Path(root.removeprefix("file://"), "runs/tiny/fsdp/reports/gate.json").read_text()
    )
    assert decision["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE") and decision["metrics"]


def test_fsdp_killed_at_two_steps_then_preempted_resumes_bit_exactly(root: str) -> None:
    """Dropout and the contrastive term on: every rank's RNG stream must resume too. Two
    SIGKILLs (off the checkpoint interval), then a SIGTERM to rank 1 alone: every rank
    stops at one step, writes its shards of that step's checkpoint, and the launch exits
    75; the last attempt resumes from it."""
    from tests.reliability.test_preemption import _rank, sigterm_after

    sets = ("batch_size=8", "max_steps=12", "checkpoint_every=3", "parallelism=fsdp")
    whole = train(root, "whole", 2, *sets)
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed_after(root, "killed", 2, ("step 5/12",), *sets)  # past step 3's checkpoint
    resumed = killed_after(root, "killed", 2, ("step 8/12",), *sets)
    assert "(step 3)" in resumed  # it resumed from step 3, then was killed past step 6
    stopped = sigterm_after(launch(root, "killed", 2, *sets), 10, lambda proc: _rank(proc, 1))
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    steps = re.findall(
        r"SIGTERM: stopped after step (\d+)/12; checkpoint step \d+ committed", stopped.stderr
    )
    assert len(steps) == 2 and len(set(steps)) == 1, stopped.stderr[-3000:]  # both ranks, one step
    at = int(steps[0])
    assert 10 <= at < 12 and checkpoint_dir(root, "killed", at).joinpath("COMMIT").exists()
    done = train(root, "killed", 2, *sets)
    assert done.returncode == 0, done.stderr[-3000:]
    assert report(root, "killed")["resumed_from"]["step"] == at
    a, b = weights(root, "killed"), weights(root, "whole")
    assert all(torch.equal(a[k], b[k]) for k in b), "the sharded resume is not bit-exact"


def test_a_checkpoint_of_4_ranks_resumes_on_2_and_the_loss_goes_on(root: str) -> None:
    sets = ("max_steps=8", "checkpoint_every=4", "parallelism=fsdp", *SAME_MATH)
    # The suite's one launch of 4 processes on one host (4 workers on a 2-core box): keep
    # it the only one (tests/sharded.py).
    whole = train(root, "whole4", 4, "batch_size=8", *sets)
    assert whole.returncode == 0, whole.stderr[-3000:]
    # What a 4-rank run killed after its checkpoint left: that very checkpoint, under
    # another run id (a run id is not part of what a checkpoint must match).
    shutil.copytree(checkpoint_dir(root, "whole4", 4), checkpoint_dir(root, "resharded", 4))

    # Two ranks with the same per-rank batch would change the global batch: refused,
    # naming the batch size that keeps it, before anything is written.
    before = sorted(p.name for p in checkpoint_dir(root, "resharded", 4).parent.parent.rglob("*"))
    refused = train(root, "resharded", 2, "batch_size=8", *sets)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "global batch of 32 (4 ranks)" in refused.stderr
    assert "set batch_size=16 to resume it with 2 ranks" in refused.stderr
    after = sorted(p.name for p in checkpoint_dir(root, "resharded", 4).parent.parent.rglob("*"))
    assert after == before

    done = train(root, "resharded", 2, "batch_size=16", *sets)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "written by 4 ranks and this run has 2" in done.stderr
    got, ref = report(root, "resharded"), report(root, "whole4")
    assert got["resumed_from"]["step"] == 4 and got["resumed_from"]["world_size_changed"] == [4, 2]
    # The same global batches from the same resharded weights and moments: training goes
    # on as the 4-rank run's did, but for the order of the sums. (The logged loss is rank
    # 0's own rows: a quarter of the global batch there, half of it here.)
    assert got["loss_curve"][:4] == ref["loss_curve"][:4]  # the 4 ranks' own steps
    assert [s for s, _ in got["loss_curve"]] == [s for s, _ in ref["loss_curve"]]
    a, b = weights(root, "resharded"), weights(root, "whole4")
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def test_what_a_sharded_run_cannot_do_is_refused_before_any_write(root: str) -> None:
    store = Path(root.removeprefix("file://"))
    one = run_job("train", f"artifact_root={root}", "run_id=one", *BASE, "parallelism=fsdp")
    assert one.returncode == 2, one.stderr[-2000:]
    assert "launch with nproc_per_node >= 2" in one.stderr
    xla = run_job(
        "train", f"artifact_root={root}", "run_id=xla", *BASE, "parallelism=fsdp", "backend=neuron"
    )
    assert xla.returncode == 2 and "NeuronX Distributed" in xla.stderr, xla.stderr[-2000:]
    assert not (store / "runs").exists()

    hsdp = train(root, "hsdp", 2, "parallelism=hsdp", "shard_size=3")
    assert hsdp.returncode == 2, hsdp.stderr[-2000:]
    assert "world size 2 is not a multiple of it" in hsdp.stderr
    assert not (store / "runs").exists()

    # A whole-model checkpoint of a run id, then the same run id sharded: they do not
    # convert, and the message says how to go on.
    sets = ("max_steps=4", "checkpoint_every=2")
    ddp = run_job("train", f"artifact_root={root}", "run_id=mixed", *BASE, *sets)
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    files = sorted(str(p) for p in (store / "runs/tiny/mixed").rglob("*"))
    sharded = train(root, "mixed", 2, *sets, "parallelism=fsdp")
    assert sharded.returncode == 2, sharded.stderr[-2000:]
    assert "is whole-model (ddp), written with parallelism=ddp" in sharded.stderr
    assert "Resume with parallelism=ddp, or start a new run id" in sharded.stderr
    assert sorted(str(p) for p in (store / "runs/tiny/mixed").rglob("*")) == files


def test_a_teams_own_mpnet_trains_data_parallel_and_sharded_to_one_model(
    root: str, tmp_path: Path
) -> None:
    """The generic transformers path (MPNet, whose unused NSP pooler once failed DDP with
    "parameters that were not used in producing loss"): ddp and fsdp on 2 ranks, the
    blocks being MPNet's own layers, end at the same weights."""
    from tests.own_model import build_own_model, last_json

    source = build_own_model(tmp_path / "acme-mpnet", "mpnet")
    last_json(run_job("publish_model", f"artifact_root={root}", "model=acme", f"source={source}"))
    sets = ("model=acme", "batch_size=8", "max_steps=3", "checkpoint_every=2", *SAME_MATH)
    ddp = train(root, "ddp", 2, *sets)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    fsdp = train(root, "fsdp", 2, *sets, "parallelism=fsdp")
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    assert "blocks and the root sharded over a mesh 2 (shard)" in fsdp.stderr
    a, b = (
        load_file(
            Path(root.removeprefix("file://"), "models/acme/versions", v, "model.safetensors")
        )
        for v in ("fsdp", "ddp")
    )
    assert a.keys() == b.keys() and any("pooler" in k for k in a)  # the model's own weights
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
