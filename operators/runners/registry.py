"""Runners by name: the ``execution_mode`` an operator is given -> the runner that starts its job.

A runner is registered once, under the name DAG authors pass as ``execution_mode``::

    register_runner("local", "embedfresh.operators.runners.local:LocalRunner")
    register_runner("captured", CapturedRunner)

The implementation is a runner class, or any callable returning a
:class:`~embedfresh.operators.runners.base.Runner`, or a ``"package.module:attribute"``
string naming one, imported when a task first builds that runner (never at DAG parse
time). It is called with the operator's rendered ``runner_settings`` as keyword
arguments. The name is checked when the operator is built: an unknown
``execution_mode`` fails the DAG file at parse time, with the registered names listed.

The built-in runners are registered in :mod:`embedfresh.operators.runners`, one line
each; :class:`~embedfresh.core.settings.ExecutionMode` names them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from embedfresh.core.settings import load_implementation

if TYPE_CHECKING:
    from embedfresh.operators.runners.base import Runner

RunnerFactory = Callable[..., "Runner"]


@dataclass(frozen=True)
class RegisteredRunner:
    """One ``execution_mode``.

    :param name: the ``execution_mode`` value.
    :param implementation: the runner's factory (called with the operator's
        ``runner_settings`` as keywords), or a ``"module:attribute"`` string naming it.
    :param required_settings: when set, the runner cannot start without settings; this
        text (an example of them) is shown when an operator gives none.
    """

    name: str
    implementation: str | RunnerFactory
    required_settings: str | None = None

    def factory(self) -> RunnerFactory:
        """The factory, its module imported now if it was registered by name."""
        if not isinstance(self.implementation, str):
            return self.implementation
        factory = load_implementation(self.implementation)
        if not callable(factory):
            raise TypeError(f"runner {self.name!r}: {self.implementation!r} is not callable")
        return factory

    def build(self, settings: Mapping[str, Any] | None) -> Runner:
        """The runner for ``settings``; settings its factory does not take are a clear error.

        :raises ValueError: the factory does not take these settings.
        """
        factory = self.factory()
        values = dict(settings or {})
        try:
            # Binding first tells a wrong setting apart from a TypeError inside the factory.
            inspect.signature(factory).bind(**values)
        except TypeError as e:
            raise ValueError(
                f"runner settings {sorted(values)} do not fit execution_mode "
                f"{self.name!r} ({_describe(self.implementation)}): {e}"
            ) from None
        return factory(**values)


_registry: dict[str, RegisteredRunner] = {}


def register_runner(
    name: str,
    implementation: str | RunnerFactory,
    *,
    required_settings: str | None = None,
    replace: bool = False,
) -> None:
    """Make ``name`` an ``execution_mode`` whose jobs run on ``implementation(**runner_settings)``.

    :param name: the ``execution_mode`` value.
    :param implementation: a runner class or a callable returning a runner, or a
        ``"package.module:attribute"`` string naming one (imported when first used).
    :param required_settings: an example of the settings the runner cannot do without;
        an operator that gives none then fails at parse time, showing it.
    :param replace: allow replacing a registered runner (otherwise an error, so that two
        registrations cannot silently shadow each other).
    :raises ValueError: ``name`` is empty, or is taken and ``replace`` is false.
    :raises TypeError: ``implementation`` is neither callable nor a string.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a runner needs a non-empty name, got {name!r}")
    name = str(name)  # an ExecutionMode member is kept as its plain value
    if name in _registry and not replace:
        raise ValueError(f"execution_mode {name!r} is already registered (pass replace=True)")
    if not isinstance(implementation, str) and not callable(implementation):
        raise TypeError(
            f"runner {name!r}: {implementation!r} is neither callable nor a "
            "'module:attribute' string"
        )
    _registry[name] = RegisteredRunner(name, implementation, required_settings)


def unregister_runner(name: str) -> None:
    """Forget the runner ``name`` (a test undoing its :func:`register_runner`).

    :raises ValueError: no runner is registered as ``name``.
    """
    registered_runner(name)
    del _registry[str(name)]


def registered_runners() -> tuple[str, ...]:
    """The valid ``execution_mode`` values, in registration order."""
    return tuple(_registry)


def registered_runner(name: str) -> RegisteredRunner:
    """The runner registered under ``name``.

    :raises ValueError: none is; the message lists the registered names.
    """
    try:
        return _registry[str(name)]
    except KeyError:
        raise ValueError(
            f"unknown execution_mode {name!r}; registered: {', '.join(_registry)} "
            "(embedfresh.operators.runners.register_runner adds one)"
        ) from None


def _describe(implementation: str | RunnerFactory) -> str:
    if isinstance(implementation, str):
        return implementation
    module = getattr(implementation, "__module__", None)
    qualname = getattr(implementation, "__qualname__", None) or repr(implementation)
    return f"{module}.{qualname}" if module else qualname
