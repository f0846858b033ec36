"""What a training/evaluation loop needs from an accelerator, and nothing more.

The loops call these hooks at fixed places (move a batch, step the optimizer, mark a
step, read a scalar), so the same loop runs eagerly on CPU/CUDA and traced on XLA.
:class:`Backend` is the interface; its hooks do what eager PyTorch needs, so an eager
backend overrides only how it is built (:meth:`Backend.create`) and a traced one
overrides the hooks that differ. This module imports no concrete backend: they are
found by name through the registry (:mod:`embedfresh.ml.backends`).
"""

from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch


class Backend(abc.ABC):
    """An accelerator as the loops see it: one device, this process's rank, and the
    hooks the loops call. The defaults are eager PyTorch on ``device``.

    An implementation is a subclass registered under one or more names (see
    :func:`embedfresh.ml.backends.register_backend`) that says how it is built
    (:meth:`create`) and overrides the hooks its device needs.
    """

    def __init__(self, name: str, device: torch.device) -> None:
        self.name = name
        self.device = device
        self.compiled = False
        self.rank = 0
        self.world_size = 1
        self._owns_group = False  # this backend joined the process group (and leaves it)

    @classmethod
    @abc.abstractmethod
    def create(cls, name: str) -> Backend:
        """A ready backend called ``name`` (a name it is registered under): its device
        chosen, its process group joined. :func:`embedfresh.ml.backends.get_backend`
        calls this; each implementation says how.

        :raises BadInputError: the device ``name`` needs is not usable here.
        """

    @classmethod
    def sharding_refusal(cls, name: str) -> str | None:
        """Why backend ``name`` cannot train with ``parallelism`` fsdp or hsdp (FSDP2 on
        its device mesh), naming the route that does; None: it can. Eager PyTorch can."""
        return None

    @property
    def static_shapes(self) -> bool:
        """Whether every batch must keep one shape (padded to ``max_length``): under
        torch.compile (static shapes: a new length would be a new graph) and on traced
        devices. Eager PyTorch takes each batch at its own longest text instead."""
        return self.compiled

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes checkpoints, versions and reports."""
        return self.rank == 0

    def start_distributed(self) -> None:
        """Join torchrun's process group (gloo on cpu, nccl on cuda) when it started
        more than one process (``WORLD_SIZE``); a no-op otherwise."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return
        import torch.distributed as dist  # noqa: PLC0415

        if self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
            self._owns_group = True
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def stop_distributed(self) -> None:
        """Leave the process group this backend joined; one it found already joined (the
        compile job's, around its trial) is left by whoever joined it."""
        if self.world_size > 1 and self._owns_group:
            import torch.distributed as dist  # noqa: PLC0415

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_group = False

    def data_parallel(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` under DistributedDataParallel when there are several ranks (its
        gradients all-reduced, averaged, during backward); ``module`` itself otherwise."""
        if self.world_size <= 1:
            return module
        from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids)

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order (every rank must call it)."""
        if self.world_size <= 1:
            return [obj]
        import torch.distributed as dist  # noqa: PLC0415

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def __repr__(self) -> str:
        return f"Backend({self.name!r}, device={self.device})"

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def loader(
        self, batches: Iterable[dict[str, torch.Tensor]]
    ) -> Iterator[dict[str, torch.Tensor]]:
        """``batches`` (host tensors) on the device, in order."""
        return (self.to_device(batch) for batch in batches)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.device.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                yield
        else:
            yield

    def inference(self) -> contextlib.AbstractContextManager[Any]:
        """No-autograd context for inference (``inference_mode`` where supported)."""
        return torch.inference_mode()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def mark_step(self) -> None:  # noqa: B027 - a hook eager devices leave empty
        """End of a traced step; nothing to do in eager mode."""

    def compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` under torch.compile (inductor, static shapes); from then on
        :meth:`compiles` counts dynamo's graphs."""
        self.compiled = True
        return torch.compile(fn, dynamic=False)

    def compiles(self) -> int:
        """Graph compilations so far: dynamo's unique graphs under torch.compile, else 0."""
        if not self.compiled:
            return 0
        from torch._dynamo.utils import counters  # noqa: PLC0415

        return int(counters["stats"]["unique_graphs"])

    def graph_cache(self) -> dict[str, int] | None:
        """Under torch.compile, how its graphs were found: AOTAutograd's and inductor's
        FX graph caches, hits and misses (a warm start that recompiled shows misses or
        bypasses), counted over the process (a job's process: its one run); None when
        nothing was compiled."""
        if not self.compiled:
            return None
        from torch._dynamo.utils import counters  # noqa: PLC0415

        aot, fx = counters["aot_autograd"], counters["inductor"]
        return {
            "autograd_cache_hits": int(aot["autograd_cache_hit"]),
            "autograd_cache_misses": int(aot["autograd_cache_miss"]),
            "autograd_cache_guard_misses": int(aot["autograd_cache_guard_miss"]),
            "autograd_cache_bypasses": int(aot["autograd_cache_bypass"]),
            "fx_graph_cache_hits": int(fx["fxgraph_cache_hit"]),
            "fx_graph_cache_misses": int(fx["fxgraph_cache_miss"]),
        }

    def after_step(self, closure: Callable[..., None], *args: Any) -> None:
        """Run ``closure(*args)`` once the step's values can be read; eager: right now."""
        closure(*args)

    def device_rng_state(self) -> Any:
        """The device's own RNG state when it has one apart from torch's (None here)."""
        return None

    def set_device_rng_state(self, state: Any) -> None:  # noqa: B027 - a hook eager devices leave empty
        """Restore what :meth:`device_rng_state` returned; nothing to do in eager mode."""

    def seed(self, seed: int) -> None:  # noqa: B027 - a hook eager devices leave empty
        """Seed the device's own RNG (torch.manual_seed covers eager devices)."""

    def metadata(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "device": str(self.device),
            "torch": torch.__version__,
            "world_size": self.world_size,
            # The sums' order, hence the last bits of every result, follows the thread
            # count: a resume under another count is no longer bit-exact (checkpoints).
            "threads": torch.get_num_threads(),
        }
