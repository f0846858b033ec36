"""What a training/evaluation loop needs from an accelerator, and nothing more.

The loops call these hooks at fixed places (move a batch, step the optimizer, mark a
step, read a scalar), so the same loop runs eagerly on CPU/CUDA and traced on XLA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from jobs.exit_codes import BadInputError

KNOWN = ("auto", "cpu", "cuda")


class Backend:
    """Eager PyTorch on one device (``cpu`` or ``cuda``)."""

    def __init__(self, name: str, device: torch.device) -> None:
        self.name = name
        self.device = device

    def __repr__(self) -> str:
        return f"Backend({self.name!r}, device={self.device})"

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.device.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                yield
        else:
            yield

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def mark_step(self) -> None:
        """End of a traced step; nothing to do in eager mode."""

    def compiles(self) -> int:
        """Graph compilations so far (0 in eager mode)."""
        return 0

    def metadata(self) -> dict[str, Any]:
        return {"backend": self.name, "device": str(self.device), "torch": torch.__version__}


def get_backend(name: str) -> Backend:
    """The backend called ``name``; ``auto`` picks CUDA when present, else CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return Backend("cpu", torch.device("cpu"))
    if name == "cuda":
        if not torch.cuda.is_available():
            raise BadInputError("backend 'cuda' requested but no CUDA device is visible")
        return Backend("cuda", torch.device("cuda"))
    raise BadInputError(f"unknown backend {name!r}: choose one of {', '.join(KNOWN)}")
