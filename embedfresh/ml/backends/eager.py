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
