"""How a model is split over the ranks of a launch (``TrainConfig.parallelism``).

- ``ddp``: every rank holds the whole model, its gradients and its AdamW state, and the
  gradients are all-reduced (:meth:`~embedfresh.ml.backends.base.Backend.data_parallel`):
  16 bytes a parameter on every rank in fp32.
- ``fsdp``: FSDP2's :func:`~torch.distributed.fsdp.fully_shard` on each transformer block
  and at the root, on a 1-D device mesh over every rank of the launch: each rank holds
  1/N of the parameters, gradients and optimizer state, a block's parameters are
  gathered for its forward and backward and freed after.
- ``hsdp``: a 2-D mesh ``(replicate, shard)``: sharded within a group of ``shard_size``
  ranks (the processes of one node by default: the fast links), replicated across groups
  (nodes), whose gradients are all-reduced.

:class:`Sharding` is the plan of a sharded run, checked before anything is written
(:meth:`Sharding.plan`) and applied to the model on every rank (:meth:`Sharding.apply`).
Activation checkpointing (:func:`checkpoint_blocks`) works under any parallelism.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from embedfresh.core.exit_codes import BadInputError

log = logging.getLogger("embedfresh.jobs.train")

#: The parallelisms whose ranks each hold a shard of the model (and checkpoint with DCP).
SHARDED = ("fsdp", "hsdp")
#: Methods of :class:`~embedfresh.ml.model.relevance.RelevanceModel` that run the model
#: besides ``forward``: FSDP gathers the root's parameters around them too.
FORWARD_METHODS = ("score_and_embed", "embed")


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``model``'s encoder, in order: the modules transformers
    marks as not to be split (``_no_split_modules``: ``BertLayer``,
    ``Qwen3DecoderLayer``, ...), else the children of its longest ``ModuleList`` (the
    layer stack of our own BERT encoder, MPNet, DistilBERT)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    if names:
        blocks = [m for m in model.modules() if type(m).__name__ in names]
        if blocks:
            return blocks
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(stacks, key=len)) if stacks else []


def checkpoint_blocks(model: nn.Module) -> int:
    """Recompute each transformer block's activations during backward instead of keeping
    them (``torch.utils.checkpoint``, non-reentrant; its RNG state is replayed, so
    dropout draws the same masks and the math is unchanged). Returns the blocks wrapped."""
    from torch.utils.checkpoint import checkpoint  # noqa: PLC0415

    blocks = transformer_blocks(model)
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return len(blocks)


@dataclass(frozen=True)
class Sharding:
    """A sharded run's plan: its mesh over the launch's ranks and the dtype its blocks
    compute in.

    :param mesh_shape: ``(world_size,)`` (fsdp) or ``(replicas, shard_size)`` (hsdp).
    :param param_dtype: the dtype parameters are gathered in for forward and backward
        (None: their own, fp32); gradients are reduced in fp32 either way.
    """

    parallelism: str
    mesh_shape: tuple[int, ...]
    param_dtype: torch.dtype | None

    @classmethod
    def plan(
        cls,
        parallelism: str,
        world_size: int,
        device_type: str,
        *,
        shard_size: int | None = None,
        mixed_precision: str = "auto",
    ) -> Sharding | None:
        """The plan of ``parallelism`` over ``world_size`` ranks; None for ``ddp``.

        :param shard_size: hsdp's shard group; None: torchrun's ``LOCAL_WORLD_SIZE``
            (the processes of one node).
        :param mixed_precision: ``auto`` (bf16 on cuda, fp32 elsewhere), ``fp32``, ``bf16``.
        :raises BadInputError: one process, or a shard group that does not divide the
            world; the fix in the message.
        """
        if parallelism not in SHARDED:
            return None
        if world_size < 2:
            raise BadInputError(
                f"parallelism={parallelism} shards the model over several ranks, but this "
                "launch has one process: launch with nproc_per_node >= 2 (or more nodes), "
                "or set parallelism=ddp"
            )
        shape: tuple[int, ...] = (world_size,)
        if parallelism == "hsdp":
            group = shard_size or int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
            if group < 1 or world_size % group:
                raise BadInputError(
                    f"parallelism=hsdp shards within groups of {group} ranks (shard_size, "
                    f"default the processes of one node) but the world size {world_size} "
                    f"is not a multiple of it: set shard_size to a divisor of {world_size} "
                    "or launch whole nodes of the same size"
                )
            shape = (world_size // group, group)
        if mixed_precision == "auto":
            mixed_precision = "bf16" if device_type == "cuda" else "fp32"
        dtype = torch.bfloat16 if mixed_precision == "bf16" else None
        return cls(parallelism, shape, dtype)

    def describe(self) -> dict[str, Any]:
        """What the train report records of the plan."""
        if len(self.mesh_shape) == 2:
            mesh = {"replicate": self.mesh_shape[0], "shard": self.mesh_shape[1]}
        else:
            mesh = {"shard": self.mesh_shape[0]}
        dtype = "fp32" if self.param_dtype is None else str(self.param_dtype).removeprefix("torch.")
        return {
            "parallelism": self.parallelism,
            "mesh": mesh,
            "param_dtype": dtype,
            "reduce_dtype": "fp32",
        }

    def apply(self, model: nn.Module, device: torch.device) -> int:
        """Shard ``model`` in place over this plan's mesh on ``device`` (every rank calls
        it): each transformer block a unit of its own, the rest (embeddings, pooling,
        relevance head) one unit at the root. Returns the blocks sharded.

        The model's parameters become DTensors; their names do not change, so state
        dicts (and published versions) keep the model's own keys.
        """
        from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
        from torch.distributed.fsdp import (  # noqa: PLC0415
            MixedPrecisionPolicy,
            fully_shard,
            register_fsdp_forward_method,
        )

        names = ("replicate", "shard") if len(self.mesh_shape) == 2 else ("shard",)
        mesh = init_device_mesh(device.type, self.mesh_shape, mesh_dim_names=names)
        policy = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=torch.float32)
        blocks = transformer_blocks(model)
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        for method in FORWARD_METHODS:
            if hasattr(model, method):
                register_fsdp_forward_method(model, method)
        log.info(
            "parallelism %s: %d blocks and the root sharded over a mesh %s (%s), parameters "
            "gathered as %s",
            self.parallelism,
            len(blocks),
            "x".join(map(str, self.mesh_shape)),
            ", ".join(names),
            self.describe()["param_dtype"],
        )
        return len(blocks)


def sharded_state(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A sharded model's checkpoint state: its weights and optimizer state as this rank's
    DTensor shards (tensors only, what DCP writes and reads in place), and the
    optimizer's parameter groups (hyperparameters, parameters by name), the same on
    every rank."""
    from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: PLC0415

    weights, optim = get_state_dict(model, optimizer)
    return {"model": weights, "optimizer": optim["state"]}, optim["param_groups"]


def load_sharded_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    shards: dict[str, Any],
    param_groups: list[dict[str, Any]],
) -> None:
    """Put what :func:`sharded_state` gave, once loaded, back into the model and optimizer."""
    from torch.distributed.checkpoint.state_dict import set_state_dict  # noqa: PLC0415

    set_state_dict(
        model,
        optimizer,
        model_state_dict=shards["model"],
        optim_state_dict={"state": shards["optimizer"], "param_groups": param_groups},
    )


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of a sharded model on rank 0, as CPU tensors, gathered one
    parameter at a time (every rank calls it; the others get ``{}``): rank 0 holds one
    full copy besides its own shard, no rank ever two."""
    from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415
        StateDictOptions,
        get_model_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def local_tensor_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds of weights, gradients and optimizer state (a DTensor counted
    by its local shard): what sharding divides."""

    def local(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    weights = sum(local(p) for p in model.parameters())
    grads = sum(local(p.grad) for p in model.parameters() if p.grad is not None)
    state = sum(
        local(v)
        for per_param in optimizer.state.values()
        for v in per_param.values()
        if isinstance(v, torch.Tensor)
    )
    return {"weights": weights, "gradients": grads, "optimizer": state}
