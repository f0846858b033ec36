"""How long a run trains and what identifies it: steps per epoch, total steps, the
config hash a checkpoint must carry to be resumed. Checked before anything is written."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from embedfresh.core.config import TrainConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.ml.data.reader import Examples
from embedfresh.ml.model.presets import ModelSpec
from embedfresh.ml.training.data import data_fingerprint


@dataclass(frozen=True)
class TrainPlan:
    """The shape of a run: ``total`` steps of ``batch_size`` rows on each of
    ``world_size`` ranks, ``per_epoch`` steps an epoch (the last partial batch dropped:
    fixed shapes), identified by ``config_hash``."""

    batch_size: int
    world_size: int
    per_epoch: int
    total: int
    config_hash: str

    @classmethod
    def make(
        cls, cfg: TrainConfig, spec: ModelSpec, examples: Examples, world_size: int
    ) -> TrainPlan:
        """The plan of ``cfg`` on ``examples`` with ``world_size`` ranks.

        :raises BadInputError: the interval holds fewer rows than one global batch.
        """
        batch_size = cfg.batch_size or spec.default_batch_size
        per_epoch = len(examples) // (batch_size * world_size)  # drop_last: fixed shapes
        if per_epoch == 0:
            raise BadInputError(
                f"data interval {cfg.data_interval_start}..{cfg.interval_end} has "
                f"{len(examples)} rows, fewer than one batch of {batch_size} x {world_size} ranks"
            )
        total = per_epoch * cfg.epochs
        if cfg.max_steps is not None:
            total = min(cfg.max_steps, total)
        chash = config_hash(cfg, spec, data_fingerprint(examples), total, world_size, batch_size)
        return cls(batch_size, world_size, per_epoch, total, chash)

    @property
    def samples_per_step(self) -> int:
        """Rows one global step trains on (each rank its own ``batch_size``)."""
        return self.batch_size * self.world_size


def config_hash(
    cfg: TrainConfig,
    spec: ModelSpec,
    data_fp: str,
    steps: int,
    world_size: int = 1,
    batch_size: int | None = None,
) -> str:
    """What must match for a checkpoint to be resumed: everything that changes the math.

    A sharded run (fsdp, hsdp) is identified by its global batch (``batch_size`` x
    ranks), not by how it is split: its checkpoint resumes under another world size that
    keeps the global batch (DCP reshards it). A ddp run's hash is what it always was."""
    relevant = cfg.model_dump(
        mode="json",
        exclude={
            "artifact_root",
            "run_id",
            "backend",
            "log_every",
            "keep_last",
            "version",
            "eval_every",  # evaluation draws no random numbers: it never changes the math
            "eval_batch_size",
            # where it runs and what it costs, not what it computes (torch.compile's
            # fusions may round differently, but a retry runs the same config)
            "compile",
            "compile_cache_root",
            "neuron_cc_flags",
            "instance_type",
            "instance_prices",
            # how the ranks hold the model, not what it computes: a sharded run is hashed
            # by its global batch below; activation checkpointing recomputes the same math
            "parallelism",
            "shard_size",
            "activation_checkpointing",
            "mixed_precision",
            # the spec's fingerprint holds the features, the data's those rows it keeps
            "features",
            "max_missing_documents",
        },
    )
    for optional in ("init_version", "dropout"):  # unset: the hash of configs before them
        if relevant[optional] is None:
            del relevant[optional]
    hashed = {"cfg": relevant, "spec": spec.fingerprint(), "data": data_fp, "steps": steps}
    if cfg.parallelism != "ddp":
        del relevant["batch_size"]
        hashed["sharded"] = {
            "global_batch": (batch_size or cfg.batch_size or spec.default_batch_size) * world_size,
            "mixed_precision": cfg.mixed_precision,
        }
    elif world_size > 1:  # data parallel: another batch composition (absent: hashes before it)
        hashed["world_size"] = world_size
    blob = json.dumps(hashed, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
