"""Accelerator backends behind one small interface (:class:`Backend`), chosen by name.

The names and their implementations are the backend registry: built-in ones in
:data:`embedfresh.core.settings.BACKEND_IMPLEMENTATIONS` (``"module:Class"`` strings, so
the control plane offers the names without importing torch), more at run time through
:func:`register_backend`. :func:`get_backend` imports a backend's module only when it
builds that backend, so torch_xla is imported only for ``xla`` and ``neuron``.

A new backend is one module (a :class:`Backend` subclass with a ``create`` classmethod)
and one registration line: in ``BACKEND_IMPLEMENTATIONS`` for a built-in one that jobs
and DAGs accept, or ``register_backend("name", MyBackend)`` in a program or a test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.extensions import Extensions
from embedfresh.core.settings import AUTO_BACKEND, BACKEND_IMPLEMENTATIONS
from embedfresh.ml import threads
from embedfresh.ml.backends.base import Backend

__all__ = [
    "Backend",
    "backend_names",
    "detect",
    "get_backend",
    "register_backend",
    "resolve_name",
    "sharding_refusal",
    "unregister_backend",
]

#: Present on a host with AWS Neuron devices (trn1, inf2).
NEURON_DEVICE = Path("/dev/neuron0")

#: name -> a Backend subclass, or the "module:Class" string naming one (imported on use).
_backends: Extensions[type[Backend]] = Extensions(
    "backend",
    built_in=BACKEND_IMPLEMENTATIONS,
    base=Backend,
    unknown=lambda name, names: (
        f"unknown backend {name!r}: choose one of {', '.join((AUTO_BACKEND, *names))}"
    ),
)


def register_backend(
    name: str, implementation: str | type[Backend], *, replace: bool = False
) -> None:
    """Make ``get_backend(name)`` build ``implementation``: a :class:`Backend` subclass, or
    a ``"package.module:Class"`` string naming one (imported when first built).

    For backends a program or a test adds at run time; the ones jobs and DAGs accept are
    listed in :data:`embedfresh.core.settings.BACKEND_IMPLEMENTATIONS`.

    :param replace: allow replacing a registered name (otherwise an error, so that two
        registrations cannot silently shadow each other).
    :raises ValueError: ``name`` is empty, ``auto``, or taken and ``replace`` is false.
    :raises TypeError: ``implementation`` is neither a Backend subclass nor a string.
    """
    if not name or name == AUTO_BACKEND:
        raise ValueError(f"backend name {name!r} is reserved or empty")
    _backends.register(name, implementation, replace=replace)


def unregister_backend(name: str) -> None:
    """Forget the backend ``name`` (a test undoing its :func:`register_backend`).

    :raises ValueError: no backend is registered as ``name``.
    """
    _backends.unregister(name)


def backend_names() -> tuple[str, ...]:
    """The registered backend names, in registration order (``auto`` not included)."""
    return _backends.names()


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


def resolve_name(name: str) -> str:
    """The registered backend ``name`` means on this host (``auto``: :func:`detect`'s
    pick), without building it or importing its module.

    :raises BadInputError: ``name`` is neither ``auto`` nor registered; the message lists
        the names that are.
    """
    if name == AUTO_BACKEND:
        name = detect()
    if name not in _backends:
        raise BadInputError(_backends.unknown(name))
    return name


def sharding_refusal(name: str) -> str | None:
    """Why the registered backend ``name`` cannot shard a model (fsdp, hsdp), or None,
    asked before it is built (:meth:`Backend.sharding_refusal`)."""
    name = resolve_name(name)
    return _backends.load(name).sharding_refusal(name)


def get_backend(name: str) -> Backend:
    """The ready backend called ``name``; ``auto`` picks one with :func:`detect`.

    :raises BadInputError: an unknown name (the message lists the known ones), or a
        device the backend needs is not usable here.
    """
    name = resolve_name(name)
    threads.apply()  # before the job's first torch op: the CPUs it is given, not the host's
    return _backends.load(name).create(name)  # its module imported here, not before
