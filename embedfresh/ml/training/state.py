"""Where a training run stands, and the random-number state that makes a resume
bit-exact.

:class:`TrainState` is the loop's own state in one object: the steps done, the epoch
and position in it, the samples seen, the loss and evaluation curves and where the
start weights came from. It is what a checkpoint's ``meta.json`` records and what a
resume starts from. The optimizer, schedule and RNG states travel in ``state.pt``
(:func:`checkpoint_state`, :func:`restore_checkpoint_state`).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from embedfresh.ml.backends import Backend
from embedfresh.ml.checkpoint import Checkpoint

log = logging.getLogger("embedfresh.jobs.train")


@dataclass
class TrainState:
    """The loop's state after ``step`` steps of a run of ``per_epoch`` steps an epoch.

    :param samples_per_step: rows of one global step (batch size x ranks).
    :param init: where the start weights came from (``resolve_init``'s answer, or the
        checkpoint's record of it on a resume).
    :param loss_curve: ``[step, loss]`` pairs at the logged steps.
    :param eval_curve: ``{step, metrics}`` of the evaluation points
        (``TrainConfig.eval_every``); the evaluator appends to this very list.
    """

    per_epoch: int
    samples_per_step: int
    init: dict[str, Any]
    step: int = 0
    loss_curve: list[list[float]] = field(default_factory=list)
    eval_curve: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def resume(cls, checkpoint: Checkpoint, per_epoch: int, samples_per_step: int) -> TrainState:
        """The state a checkpoint recorded (its curves; older ones may lack them)."""
        meta = checkpoint.meta
        return cls(
            per_epoch,
            samples_per_step,
            meta["init"],
            checkpoint.step,
            meta.get("loss_curve", []),
            meta.get("eval_curve", []),
        )

    @property
    def epoch(self) -> int:
        """The epoch of the last step done (0 before any)."""
        return (self.step - 1) // self.per_epoch if self.step else 0

    @property
    def position_in_epoch(self) -> int:
        """Steps done within :attr:`epoch` (``per_epoch`` at its end, not 0)."""
        return self.step - self.epoch * self.per_epoch

    @property
    def samples_seen(self) -> int:
        return self.step * self.samples_per_step

    def meta(self, evaluating: bool) -> dict[str, Any]:
        """A checkpoint's ``meta.json`` (the manager adds ``step`` and ``config_hash``).
        ``evaluating``: whether this attempt evaluates; if not, the curve is stored
        empty, as a run without evaluation has always stored it."""
        return {
            "init": self.init,
            "epoch": self.epoch,
            "position_in_epoch": self.position_in_epoch,
            "samples_seen": self.samples_seen,
            "loss_curve": self.loss_curve,
            "eval_curve": self.eval_curve if evaluating else [],
        }


def kernel_route(backend: Backend) -> dict[str, Any]:
    """What decides the order of a step's sums, hence the last bits of the weights: the
    device, torch's version, its CPU kernels' vector ISA and the intra-op thread count.
    A checkpoint records it; a resume under another one is no longer bit-exact with an
    uninterrupted run (:func:`route_changes`)."""
    return {
        "device": backend.device.type,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }


def route_changes(recorded: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """``"threads 2 -> 1"`` for each part of :func:`kernel_route` that differs from the
    checkpoint's record ([] for a checkpoint written before it was recorded)."""
    if not recorded:
        return []
    return [
        f"{name} {recorded[name]} -> {current[name]}"
        for name in current
        if name in recorded and recorded[name] != current[name]
    ]


def checkpoint_state(
    optimizer_state: dict[str, Any],
    schedule: torch.optim.lr_scheduler.LRScheduler,
    rngs: list[dict[str, Any]],
    world_size: int,
) -> dict[str, Any]:
    """A checkpoint's ``state.pt``: optimizer, schedule and RNG states.

    ``optimizer_state``: the optimizer's ``state_dict()``, or for a sharded run only its
    ``param_groups`` (the moments are shards, written by every rank). ``rngs``: every
    rank's :func:`rng_state` in rank order (``Backend.gather``); all of them are kept
    when data parallel so each rank resumes its own dropout stream."""
    state = {
        "optimizer": optimizer_state,
        "schedule": schedule.state_dict(),
        "rng": rngs[0],
    }
    if world_size > 1:
        state["rng_ranks"] = rngs
    return state


def restore_checkpoint_state(
    checkpoint: Checkpoint,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    backend: Backend,
    seed: int,
) -> None:
    """Load what :func:`checkpoint_state` saved into ``optimizer`` (a sharded one's is
    loaded with its shards) and ``schedule`` and this rank's RNGs: its own, or when the
    checkpoint was written by another number of ranks (a sharded run resumed under
    another world size), a stream seeded by (seed, step, rank), said in the log."""
    if not checkpoint.sharded:
        optimizer.load_state_dict(checkpoint.state["optimizer"])
    schedule.load_state_dict(checkpoint.state["schedule"])
    ranks = checkpoint.state.get("rng_ranks") or [checkpoint.state["rng"]]
    stream = seed * 1_000_003 + checkpoint.step
    if len(ranks) == backend.world_size:
        set_rng_state(ranks[backend.rank], backend, seed=stream)
        return
    if backend.world_size == 1 or not checkpoint.sharded:  # rank 0's, as before
        set_rng_state(ranks[0], backend, seed=stream)
        return
    log.warning(
        "checkpoint step %d was written by %d ranks and this run has %d: each rank's "
        "dropout stream restarts from (seed, step, rank), so the run is not bit-exact "
        "with an uninterrupted one (its weights and optimizer state are: DCP resharded them)",
        checkpoint.step,
        len(ranks),
        backend.world_size,
    )
    set_rng_state(ranks[0], backend, seed=stream)
    seed_streams(stream, backend)


def seed_streams(seed: int, backend: Backend) -> None:
    """Seed this rank's own streams from ``seed``: torch's, Python's and NumPy's with
    ``seed + rank``, and the device's (:meth:`Backend.seed`)."""
    torch.manual_seed(seed + backend.rank)
    random.seed(seed + backend.rank)
    np.random.seed((seed + backend.rank) % 2**32)
    backend.seed(seed)


def rng_state(backend: Backend | None = None) -> dict[str, Any]:
    """Python's, NumPy's and torch's RNG states (and the device's own, if it has one),
    as plain containers a ``weights_only`` load accepts."""
    py = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    device = None if backend is None else backend.device_rng_state()
    if device is not None:  # an XLA device draws dropout masks from its own generator
        state["device"] = {"backend": backend.name, "state": device}
    return state


def set_rng_state(state: dict[str, Any], backend: Backend | None = None, seed: int = 0) -> None:
    """Restore what :func:`rng_state` returned. A device state written on another
    backend cannot be used: the device is seeded with ``seed`` instead."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np.asarray(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(state["torch"])
    if backend is None:
        return
    device = state.get("device")
    if device is not None and device.get("backend") == backend.name:
        backend.set_device_rng_state(device["state"])
    else:  # written on another backend: a deterministic stream for this one
        backend.seed(seed)
