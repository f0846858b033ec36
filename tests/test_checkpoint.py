"""The checkpoint manager: keep-last-K, commit markers, config hashes, and skipping a
corrupt newest checkpoint, both in-process and end to end (SIGKILL, corrupt, resume)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from embedfresh.core import layout, markers
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import STATE, WEIGHTS, CheckpointManager
from tests.conftest import ROOT, job_env, run_job

# -- in-process unit tests ------------------------------------------------------------


def _weights(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {
        "layer.weight": torch.randn(4, 3, generator=g),
        "layer.bias": torch.randn(4, generator=g),
    }


def _state(step: int) -> dict:
    return {
        "optimizer": {"state": {0: {"exp_avg": torch.full((4,), float(step))}}, "lr": 0.1},
        "rng": {"torch": torch.get_rng_state()},
        "step_seen": step,
    }


def _manager(store: ArtifactStore, keep_last: int = 3, config_hash: str = "hash-a"):
    return CheckpointManager(store, "tiny", "run-1", keep_last, config_hash)


def _dir(step: int) -> str:
    return layout.checkpoint("tiny", "run-1", step)


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(f"file://{tmp_path / 'root'}")


def test_round_trip_restores_weights_state_and_meta(store):
    mgr = _manager(store)
    mgr.save(5, _weights(5), _state(5), {"epoch": 0, "position_in_epoch": 5})
    ck = mgr.load_latest()
    assert ck is not None and ck.step == 5
    for name, tensor in _weights(5).items():
        assert torch.equal(ck.weights[name], tensor)
    assert torch.equal(ck.state["optimizer"]["state"][0]["exp_avg"], torch.full((4,), 5.0))
    assert ck.state["step_seen"] == 5
    assert ck.meta["position_in_epoch"] == 5
    assert ck.meta["config_hash"] == "hash-a"
    assert ck.url == store.url(_dir(5))


def test_keep_last_purges_to_exactly_k_committed(store):
    mgr = _manager(store, keep_last=3)
    for step in (7, 14, 21, 28, 35):
        mgr.save(step, _weights(step), _state(step), {})
    assert mgr.committed_steps() == [21, 28, 35]
    # Nothing of the purged ones is left behind, committed or not.
    assert store.listdir(layout.checkpoints("tiny", "run-1")) == [
        layout.checkpoint_name(s) for s in (21, 28, 35)
    ]
    assert mgr.load_latest().step == 35


def test_keep_last_one(store):
    mgr = _manager(store, keep_last=1)
    for step in (1, 2, 3):
        mgr.save(step, _weights(step), _state(step), {})
    assert mgr.committed_steps() == [3]
    assert torch.equal(mgr.load_latest().weights["layer.bias"], _weights(3)["layer.bias"])


def test_keep_last_must_be_positive(store):
    with pytest.raises(BadInputError, match="keep_last"):
        _manager(store, keep_last=0)


def test_directory_without_commit_is_ignored(store):
    mgr = _manager(store)
    mgr.save(10, _weights(10), _state(10), {})
    # An attempt that died while writing step 20: files there, no COMMIT.
    mgr.save(20, _weights(20), _state(20), {})
    store.remove(f"{_dir(20)}/{markers.COMMIT}")
    assert store.exists(f"{_dir(20)}/{WEIGHTS}")
    assert mgr.committed_steps() == [10]
    ck = mgr.load_latest()
    assert ck.step == 10
    assert torch.equal(ck.weights["layer.weight"], _weights(10)["layer.weight"])


def test_nothing_committed_loads_nothing(store):
    mgr = _manager(store)
    assert mgr.load_latest() is None
    store.write_bytes(f"{_dir(3)}/{WEIGHTS}", b"half")
    assert mgr.load_latest() is None


def test_config_hash_mismatch_is_refused(store):
    _manager(store, config_hash="hash-a").save(4, _weights(4), _state(4), {})
    with pytest.raises(BadInputError, match="another configuration") as info:
        _manager(store, config_hash="hash-b").load_latest()
    assert "hash-a" in str(info.value) and "hash-b" in str(info.value)


def _truncate(store: ArtifactStore, rel: str) -> None:
    data = store.read_bytes(rel)
    store.write_bytes(rel, data[: len(data) // 2])


def _flip(store: ArtifactStore, rel: str) -> None:
    data = bytearray(store.read_bytes(rel))
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    store.write_bytes(rel, bytes(data))


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda s, d: _truncate(s, f"{d}/{WEIGHTS}"), id="truncated-weights"),
        pytest.param(lambda s, d: _flip(s, f"{d}/{STATE}"), id="flipped-state"),
        pytest.param(lambda s, d: s.remove(f"{d}/{STATE}"), id="missing-state"),
        pytest.param(
            lambda s, d: s.write_bytes(f"{d}/{markers.COMMIT}", b"{trunc"), id="garbage-commit"
        ),
    ],
)
def test_corrupt_newest_is_skipped_with_a_warning(store, caplog, corrupt):
    mgr = _manager(store)
    for step in (7, 14):
        mgr.save(step, _weights(step), _state(step), {})
    corrupt(store, _dir(14))
    with caplog.at_level(logging.WARNING, logger="embedfresh.ml.checkpoint"):
        ck = mgr.load_latest()
    assert ck is not None and ck.step == 7
    assert torch.equal(ck.weights["layer.weight"], _weights(7)["layer.weight"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("skipping corrupt checkpoint" in w and "step-00000014" in w for w in warnings)


def test_all_corrupt_loads_nothing(store):
    mgr = _manager(store)
    for step in (7, 14):
        mgr.save(step, _weights(step), _state(step), {})
        _truncate(store, f"{_dir(step)}/{WEIGHTS}")
    assert mgr.load_latest() is None


def test_unparseable_content_with_matching_checksums_is_skipped(store, caplog):
    """A marker that lists the bytes as written (checksums match) but whose state.pt is
    not a torch file: skipped as unreadable, never unpickled as code."""
    mgr = _manager(store)
    mgr.save(7, _weights(7), _state(7), {})
    mgr.save(14, _weights(14), _state(14), {})
    directory = _dir(14)
    files = {n: store.read_bytes(f"{directory}/{n}") for n in (WEIGHTS, STATE, "meta.json")}
    files[STATE] = b"not a torch file at all"
    store.write_bytes(f"{directory}/{STATE}", files[STATE])
    markers.write_marker(store, directory, files, meta={"step": 14})
    with caplog.at_level(logging.WARNING, logger="embedfresh.ml.checkpoint"):
        assert mgr.load_latest().step == 7
    assert any("skipping unreadable checkpoint" in r.getMessage() for r in caplog.records)


def test_resuming_below_a_corrupt_newer_checkpoint_keeps_the_new_one(store):
    """Resumed from step 7 because step 14 was corrupt; saving step 7 again must not
    purge it in favour of the corrupt 14 (keep_last=1), or a second failure before step
    14 would lose every checkpoint of the run."""
    mgr = _manager(store, keep_last=1)
    mgr.save(7, _weights(7), _state(7), {})
    mgr.save(14, _weights(14), _state(14), {})
    assert mgr.committed_steps() == [14]
    _truncate(store, f"{_dir(14)}/{WEIGHTS}")
    assert mgr.load_latest() is None
    # The restarted run trains from scratch and checkpoints step 7 again.
    mgr.save(7, _weights(7), _state(7), {})
    ck = mgr.load_latest()
    assert ck is not None and ck.step == 7
    # Then it overwrites the corrupt 14 and the purge applies as usual.
    mgr.save(14, _weights(14), _state(14), {})
    assert mgr.committed_steps() == [14]
    assert mgr.load_latest().step == 14


# -- end to end: SIGKILL, corrupt the newest checkpoint, restart ------------------------

TRAIN = (
    "data_interval_start=2026-01-01",
    "epochs=1",
    "checkpoint_every=7",
    "keep_last=3",
    "log_every=1",
    "init=base",
)
STEPS = 32  # 1024 rows / batch 32, one epoch


def train_args(root: str, run_id: str) -> list[str]:
    return [f"artifact_root={root}", f"run_id={run_id}", *TRAIN]


def _weights_sha(root: str, version: str) -> str:
    path = Path(root.removeprefix("file://")) / "models/tiny/versions" / version / WEIGHTS
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train_ok(root: str, run_id: str) -> subprocess.CompletedProcess:
    result = run_job("train", *train_args(root, run_id))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def kill_after_step(root: str, run_id: str, kill_at: int) -> None:
    """Run training and SIGKILL it once it has logged step ``kill_at``."""
    cmd = [sys.executable, "-m", "embedfresh.jobs.train"]
    for s in train_args(root, run_id):
        cmd += ["--set", s]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=job_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if f" step {kill_at}/" in line:
                os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, "".join(seen[-20:])


@pytest.fixture(scope="module")
def e2e_root(data_template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    dest = tmp_path_factory.mktemp("ckpt-e2e") / "artifacts"
    shutil.copytree(data_template, dest)
    return f"file://{dest}"


@pytest.fixture(scope="module")
def reference(e2e_root: str) -> str:
    summary = json.loads(train_ok(e2e_root, "uninterrupted").stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] is None
    assert summary["steps"] == STEPS
    return _weights_sha(e2e_root, "uninterrupted")


@pytest.mark.parametrize(
    "corrupt, reason",
    [
        pytest.param(_truncate, "model.safetensors has", id="truncated-weights"),
        pytest.param(_flip, "state.pt checksum", id="flipped-state"),
    ],
)
def test_corrupt_newest_checkpoint_resumes_from_previous(e2e_root, reference, corrupt, reason):
    run_id = f"corrupt-{corrupt.__name__.strip('_')}"
    store = ArtifactStore(e2e_root)
    kill_after_step(e2e_root, run_id, kill_at=24)
    mgr = CheckpointManager(store, "tiny", run_id, keep_last=3, config_hash="unused")
    # The kill lands a little after step 24 was logged; read what actually got committed.
    committed = mgr.committed_steps()
    assert len(committed) >= 2 and committed[-1] >= 21, committed
    newest, previous = committed[-1], committed[-2]
    assert not store.exists(layout.model_version("tiny", run_id))
    newest_dir = layout.checkpoint("tiny", run_id, newest)
    corrupt(store, f"{newest_dir}/{WEIGHTS if corrupt is _truncate else STATE}")

    result = train_ok(e2e_root, run_id)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"]["step"] == previous
    assert summary["resumed_from"]["url"] == store.url(layout.checkpoint("tiny", run_id, previous))
    warning = [ln for ln in result.stderr.splitlines() if "skipping corrupt checkpoint" in ln]
    assert len(warning) == 1, result.stderr[-3000:]
    assert store.url(newest_dir) in warning[0] and reason in warning[0]
    report = store.read_json(layout.report("tiny", run_id, "train"))
    assert report["steps_this_attempt"] == STEPS - previous
    assert _weights_sha(e2e_root, run_id) == reference
