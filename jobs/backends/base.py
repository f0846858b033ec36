"""What a training/evaluation loop needs from an accelerator, and nothing more.

The loops call these hooks at fixed places (move a batch, step the optimizer, mark a
step, read a scalar), so the same loop runs eagerly on CPU/CUDA and traced on XLA.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from jobs.exit_codes import BadInputError

KNOWN = ("auto", "cpu", "cuda", "xla", "neuron")
NEURON_DEVICE = Path("/dev/neuron0")


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

    def inference(self) -> contextlib.AbstractContextManager[Any]:
        """No-autograd context for inference (``inference_mode`` where supported)."""
        return torch.inference_mode()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def mark_step(self) -> None:
        """End of a traced step; nothing to do in eager mode."""

    def compiles(self) -> int:
        """Graph compilations so far (0 in eager mode)."""
        return 0

    def after_step(self, closure: Callable[..., None], *args: Any) -> None:
        """Run ``closure(*args)`` once the step's values can be read; eager: right now."""
        closure(*args)

    def device_rng_state(self) -> Any:
        """The device's own RNG state when it has one apart from torch's (None here)."""
        return None

    def set_device_rng_state(self, state: Any) -> None:
        """Restore what :meth:`device_rng_state` returned; nothing to do in eager mode."""

    def seed(self, seed: int) -> None:
        """Seed the device's own RNG (torch.manual_seed covers eager devices)."""

    def metadata(self) -> dict[str, Any]:
        return {"backend": self.name, "device": str(self.device), "torch": torch.__version__}


def detect(
    env: Mapping[str, str] | None = None,
    neuron_device: Path = NEURON_DEVICE,
    cuda_available: Callable[[], bool] = torch.cuda.is_available,
) -> str:
    """What ``auto`` means here: Neuron when a Neuron device or ``PJRT_DEVICE=NEURON`` is
    present, else CUDA when visible, else CPU. Inputs are parameters for testing."""
    env = os.environ if env is None else env
    if env.get("PJRT_DEVICE", "").upper() == "NEURON" or neuron_device.exists():
        return "neuron"
    return "cuda" if cuda_available() else "cpu"


def get_backend(name: str) -> Backend:
    """The backend called ``name``; ``auto`` picks one with :func:`detect`."""
    if name == "auto":
        name = detect()
    if name == "cpu":
        return Backend("cpu", torch.device("cpu"))
    if name == "cuda":
        if not torch.cuda.is_available():
            raise BadInputError("backend 'cuda' requested but no CUDA device is visible")
        return Backend("cuda", torch.device("cuda"))
    if name in ("xla", "neuron"):
        from jobs.backends.xla import XlaBackend  # noqa: PLC0415 - imports torch_xla

        return XlaBackend(name)
    raise BadInputError(f"unknown backend {name!r}: choose one of {', '.join(KNOWN)}")
