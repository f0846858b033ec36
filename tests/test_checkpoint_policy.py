"""The checkpoint manager's policy (which steps are saved, which one loads) and the
training state a checkpoint records, in-process: the loop offers every step and the
manager decides."""

from __future__ import annotations

import logging

import pytest
import torch

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import WEIGHTS, Checkpoint, CheckpointManager
from embedfresh.ml.training import TrainState

RUN = ("tiny", "run-p")


def _weights(step: int) -> dict[str, torch.Tensor]:
    return {"layer.weight": torch.full((2, 2), float(step))}


def _state(step: int) -> dict:
    return {"optimizer": {"state": {}, "step": step}, "rng": {"torch": torch.get_rng_state()}}


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(f"file://{tmp_path / 'root'}")


def _manager(store: ArtifactStore, every: int | None, keep_last: int = 2) -> CheckpointManager:
    return CheckpointManager(store, *RUN, keep_last, "hash-p", every=every)


def test_save_decides_which_steps_are_due(store):
    mgr = _manager(store, every=3, keep_last=10)
    written = {}
    for step in range(1, 10):
        written[step] = mgr.save(step, _weights(step), _state(step), {}, last_step=step == 9)
    # Multiples of 3 only, and never the last step (its weights become the model version).
    assert [s for s, url in written.items() if url is not None] == [3, 6]
    assert written[3] == store.url(layout.checkpoint(*RUN, 3))
    assert mgr.committed_steps() == [3, 6]
    assert [mgr.due(s) for s in (3, 4, 9)] == [True, False, True]
    assert not mgr.due(9, last_step=True)


def test_without_an_interval_every_explicit_save_is_due(store):
    mgr = _manager(store, every=None)
    assert mgr.due(1) and mgr.due(17)
    assert not mgr.due(17, last_step=True)
    assert mgr.save(5, _weights(5), _state(5), {}) is not None
    assert mgr.save(6, _weights(6), _state(6), {}, last_step=True) is None
    assert mgr.committed_steps() == [5]


def test_purge_after_save_keeps_the_last_k(store):
    mgr = _manager(store, every=2, keep_last=2)
    for step in range(1, 11):
        mgr.save(step, _weights(step), _state(step), {})
    assert mgr.committed_steps() == [8, 10]
    assert store.listdir(layout.checkpoints(*RUN)) == [layout.checkpoint_name(s) for s in (8, 10)]


def test_interval_must_be_positive(store):
    with pytest.raises(BadInputError, match="checkpoint_every"):
        _manager(store, every=0)


def test_load_newest_by_default_and_a_given_step_on_request(store, caplog):
    mgr = _manager(store, every=None, keep_last=3)
    for step in (4, 8, 12):
        mgr.save(step, _weights(step), _state(step), {"mark": step})
    assert mgr.load().step == 12 and mgr.load(-1).step == 12
    assert mgr.load_latest().step == 12
    eight = mgr.load(8)
    assert eight.step == 8 and eight.meta["mark"] == 8
    assert torch.equal(eight.weights["layer.weight"], _weights(8)["layer.weight"])
    with pytest.raises(BadInputError, match="no valid committed checkpoint"):
        mgr.load(5)
    # A corrupt newest one is skipped with a warning by load(-1), refused by load(12).
    rel = f"{layout.checkpoint(*RUN, 12)}/{WEIGHTS}"
    store.write_bytes(rel, store.read_bytes(rel)[:10])
    with caplog.at_level(logging.WARNING, logger="embedfresh.ml.checkpoint"):
        assert mgr.load().step == 8
    assert any("skipping corrupt checkpoint" in r.getMessage() for r in caplog.records)
    with pytest.raises(BadInputError, match="step-00000012"):
        mgr.load(12)


@pytest.mark.parametrize(
    ("step", "epoch", "position"),
    [(0, 0, 0), (1, 0, 1), (7, 0, 7), (8, 0, 8), (9, 1, 1), (16, 1, 8), (17, 2, 1)],
)
def test_train_state_position(step, epoch, position):
    """The epoch of the last step done and the steps done in it: the end of an epoch is
    position ``per_epoch`` of that epoch, not position 0 of the next."""
    state = TrainState(per_epoch=8, samples_per_step=64, init={"source": "base"}, step=step)
    assert (state.epoch, state.position_in_epoch, state.samples_seen) == (
        epoch,
        position,
        step * 64,
    )


def test_train_state_round_trips_through_a_checkpoint(store):
    state = TrainState(8, 32, {"source": "base"}, step=11)
    state.loss_curve.append([10, 0.5])
    state.eval_curve.append({"step": 10, "metrics": {"recall@10": 0.1}})
    mgr = _manager(store, every=None)
    mgr.save(state.step, _weights(11), _state(11), state.meta(evaluating=True))
    loaded = mgr.load()
    assert isinstance(loaded, Checkpoint)
    assert loaded.meta["epoch"] == 1 and loaded.meta["position_in_epoch"] == 3
    assert loaded.meta["samples_seen"] == 11 * 32
    resumed = TrainState.resume(loaded, per_epoch=8, samples_per_step=32)
    assert resumed == state
    # An attempt that does not evaluate stores no evaluation curve.
    assert state.meta(evaluating=False)["eval_curve"] == []
