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
from embedfresh.core.settings import AUTO_BACKEND, BACKEND_IMPLEMENTATIONS, load_implementation
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

# name -> a Backend subclass, or the "module:Class" string naming one (imported on use).
_registry: dict[str, str | type[Backend]] = dict(BACKEND_IMPLEMENTATIONS)


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
    if name in _registry and not replace:
        raise ValueError(f"backend {name!r} is already registered (pass replace=True)")
    if not isinstance(implementation, str) and not (
        isinstance(implementation, type) and issubclass(implementation, Backend)
    ):
        raise TypeError(
            f"backend {name!r}: {implementation!r} is neither a Backend subclass "
            "nor a 'module:Class' string"
        )
    _registry[name] = implementation


def unregister_backend(name: str) -> None:
    """Forget the backend ``name`` (a test undoing its :func:`register_backend`).

    :raises ValueError: no backend is registered as ``name``.
    """
    if name not in _registry:
        raise ValueError(_unknown(name))
    del _registry[name]


def backend_names() -> tuple[str, ...]:
    """The registered backend names, in registration order (``auto`` not included)."""
    return tuple(_registry)


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
    if name not in _registry:
        raise BadInputError(_unknown(name))
    return name


def sharding_refusal(name: str) -> str | None:
    """Why the registered backend ``name`` cannot shard a model (fsdp, hsdp), or None,
    asked before it is built (:meth:`Backend.sharding_refusal`)."""
    return _implementation(resolve_name(name)).sharding_refusal(resolve_name(name))


def get_backend(name: str) -> Backend:
    """The ready backend called ``name``; ``auto`` picks one with :func:`detect`.

    :raises BadInputError: an unknown name (the message lists the known ones), or a
        device the backend needs is not usable here.
    """
    name = resolve_name(name)
    threads.apply()  # before the job's first torch op: the CPUs it is given, not the host's
    return _implementation(name).create(name)


def _implementation(name: str) -> type[Backend]:
    entry = _registry[name]
    if isinstance(entry, type):
        return entry
    cls = load_implementation(entry)  # the backend's module is imported here, not before
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"backend {name!r}: {entry!r} is not a Backend subclass")
    return cls


def _unknown(name: str) -> str:
    return f"unknown backend {name!r}: choose one of {', '.join((AUTO_BACKEND, *_registry))}"
