"""torch-xla backends: ``xla`` (whatever PJRT device the environment names; CPU here)
and ``neuron`` (the same code on AWS Trainium's Neuron PJRT device).

``torch_xla`` is imported only when one of these backends is built: importing it
initialises a PJRT runtime and changes process-wide state. Training follows the Neuron
guidance: fixed shapes, one sync after forward+backward and one after the optimizer
step (the loop calls :meth:`XlaBackend.mark_step` at both places), ``xm.optimizer_step``
under data parallel, logging in step closures, checkpoints from CPU tensors. bf16 on
Neuron is the compiler's ``--auto-cast`` flag, not torch autocast, so :meth:`autocast`
does nothing here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from embedfresh.core.exit_codes import BadInputError
from embedfresh.ml.backends.base import Backend

#: Environment the Neuron PJRT plugin reads; set (if unset) before torch_xla starts.
NEURON_ENV = {"PJRT_DEVICE": "NEURON"}


def _import_xla() -> Any:
    try:
        import torch_xla  # noqa: PLC0415 - lazy on purpose: import has side effects
    except ImportError as e:  # pragma: no cover - the venv ships it
        raise BadInputError(f"backend needs torch-xla, which does not import here: {e}") from e
    return torch_xla


class XlaBackend(Backend):
    """A torch-xla device: traced graphs, compiled per distinct shape/program."""

    @classmethod
    def create(cls, name: str) -> Backend:
        """The ``xla`` or ``neuron`` backend; its rank and world size are PJRT's (torchrun's
        process group is not joined: ``xm.optimizer_step`` all-reduces instead).

        :raises BadInputError: ``neuron`` under another ``PJRT_DEVICE``, or no torch-xla.
        """
        return cls(name)

    def __init__(self, name: str = "xla") -> None:
        if name == "neuron":
            for key, value in NEURON_ENV.items():
                os.environ.setdefault(key, value)
            if os.environ["PJRT_DEVICE"] != "NEURON":
                raise BadInputError(
                    f"backend 'neuron' needs PJRT_DEVICE=NEURON, not {os.environ['PJRT_DEVICE']!r}"
                )
        # backend 'xla': PJRT_DEVICE as set, else torch_xla's own pick (TPU, CUDA, CPU).
        torch_xla = _import_xla()
        import torch_xla.core.xla_model as xm  # noqa: PLC0415
        import torch_xla.debug.metrics as met  # noqa: PLC0415
        import torch_xla.runtime as xr  # noqa: PLC0415

        self._xla, self._xm, self._met, self._xr = torch_xla, xm, met, xr
        super().__init__(name, torch_xla.device())
        self.world_size = xr.world_size()
        self.rank = xr.global_ordinal()

    @classmethod
    def sharding_refusal(cls, name: str) -> str | None:
        """FSDP2 (``fully_shard`` on a device mesh) does not run on torch-xla's devices;
        each has its own route to sharded training (docs/SCALING.md)."""
        if name == "neuron":
            return (
                "parallelism=fsdp/hsdp is FSDP2, which backend 'neuron' (torch-xla with the "
                "Neuron PJRT plugin, trn1/inf2) cannot run: there the route is NeuronX "
                "Distributed (neuronx_distributed: ZeRO-1 optimizer-state sharding with "
                "tensor parallelism), which this backend does not drive, and on trn2/trn3 "
                "native TorchNeuron runs FSDP2 as the cuda backend does (torch 2.13+, not "
                "this torch-xla 2.9 line). Use parallelism=ddp on neuron (docs/SCALING.md)"
            )
        return (
            f"parallelism=fsdp/hsdp is FSDP2, which backend {name!r} (torch-xla) cannot run: "
            "torch-xla's own route is torch_xla.distributed.fsdp (XlaFullyShardedDataParallel) "
            "or SPMD sharding, which this backend does not drive. Use parallelism=ddp, or "
            "backend cpu/cuda for fsdp (docs/SCALING.md)"
        )

    @property
    def static_shapes(self) -> bool:
        """Always: every new shape is a new graph to compile (minutes on Neuron)."""
        return True

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in batch.items()}

    def loader(
        self, batches: Iterable[dict[str, torch.Tensor]]
    ) -> Iterator[dict[str, torch.Tensor]]:
        """``batches`` through ``MpDeviceLoader``: a background thread uploads the next
        batches while the device runs the current step."""
        from torch_xla.distributed.parallel_loader import MpDeviceLoader  # noqa: PLC0415

        return iter(MpDeviceLoader(batches, self.device))

    def inference(self) -> contextlib.AbstractContextManager[Any]:
        # XLA tensors cannot be inference tensors ("Cannot set version_counter").
        return torch.no_grad()

    def data_parallel(self, module: torch.nn.Module) -> torch.nn.Module:
        return module  # xm.optimizer_step all-reduces the gradients instead

    def gather(self, obj: Any) -> list[Any]:
        # Only this rank's: Python objects are not gathered over XLA collectives here (on
        # PJRT CPU two processes each saw world size 1, FACTS.md), so a resume under XLA
        # data parallel restores rank 0's RNG state on every rank.
        return [obj]

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.world_size > 1:  # all-reduces the gradients, then steps
            self._xm.optimizer_step(optimizer)
        else:
            optimizer.step()

    def mark_step(self) -> None:
        self._xla.sync()

    def compiles(self) -> int:
        data = self._met.metric_data("CompileTime")
        return int(data[0]) if data else 0

    def after_step(self, closure: Callable[..., None], *args: Any) -> None:
        """Run ``closure(*args)`` once the step's tensors are materialised (at the next
        sync), instead of forcing an execution in the middle of the step."""
        self._xm.add_step_closure(closure, args)

    def device_rng_state(self) -> int:
        return int(self._xm.get_rng_state(self.device))

    def set_device_rng_state(self, state: Any) -> None:
        self._xm.set_rng_state(int(state), self.device)

    def seed(self, seed: int) -> None:
        self._xm.set_rng_state(int(seed), self.device)

    def metadata(self) -> dict[str, Any]:
        return {
            **super().metadata(),
            "torch_xla": self._xla.__version__,
            "pjrt_device": self._xr.device_type(),
        }
