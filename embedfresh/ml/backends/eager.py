"""Eager PyTorch backends: ``cpu`` and ``cuda`` (registered in
:data:`embedfresh.core.settings.BACKEND_IMPLEMENTATIONS`).

The hooks are :class:`~embedfresh.ml.backends.base.Backend`'s defaults; this module
says how such a backend is built: the device the name means, refused when it is not
visible, and torchrun's process group joined when there are several ranks.
"""

from __future__ import annotations

import torch

from embedfresh.core.exit_codes import BadInputError
from embedfresh.ml.backends.base import Backend


class EagerBackend(Backend):
    """Eager PyTorch on the device its name names (``cpu`` or ``cuda``)."""

    @classmethod
    def create(cls, name: str) -> Backend:
        """``name`` on its torch device, distributed when torchrun started several ranks.

        :raises BadInputError: ``cuda`` was asked for and no CUDA device is visible.
        :raises ValueError: ``name`` is neither ``cpu`` nor ``cuda`` (a registration error).
        """
        if name not in ("cpu", "cuda"):
            raise ValueError(f"EagerBackend builds 'cpu' or 'cuda', not {name!r}")
        if name == "cuda" and not torch.cuda.is_available():
            raise BadInputError("backend 'cuda' requested but no CUDA device is visible")
        backend = cls(name, torch.device(name))
        backend.start_distributed()
        return backend

    def device_rng_state(self) -> torch.Tensor | None:
        """CUDA's own generator (dropout masks on the GPU draw from it, not from the CPU
        generator ``torch.get_rng_state`` saves): without it a resumed run's weights
        differed from an uninterrupted run's (an H200, docs/BENCHMARKS.md, 2026-11-28)."""
        if self.device.type != "cuda":
            return None
        return torch.cuda.get_rng_state(self.device)

    def set_device_rng_state(self, state: torch.Tensor) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state, self.device)

    def seed(self, seed: int) -> None:
        """Per rank, as the loop's ``torch.manual_seed(seed + rank)`` seeded it."""
        if self.device.type == "cuda":
            torch.cuda.manual_seed(seed + self.rank)
