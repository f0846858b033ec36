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

The settings are checked twice, against the runner's *settings model* (``settings=``:
a class or callable taking the settings as keywords and raising ``ValueError`` or
``TypeError`` on bad ones, cheap and without I/O): when the operator is built, in full
where no value is templated and by name otherwise (an unknown or missing setting is a
DAG import error), and again with the rendered values when the task runs, where the
operator fails the task for good (no retry can fix a typo). Without one, a runner
registered as a class or callable has its settings checked by name against its
signature; one registered by name, only when it is built.

The built-in runners are registered in :mod:`embedfresh.operators.runners`, one line
each; :class:`~embedfresh.core.settings.ExecutionMode` names them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from embedfresh.core.extensions import Extensions
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
    :param settings: the settings model (see the module docstring), or a
        ``"module:attribute"`` string naming one (imported when an operator is built, so
        keep its module light); ``None``: the implementation's signature, by name only,
        when it is not a string.
    """

    name: str
    implementation: str | RunnerFactory
    required_settings: str | None = None
    settings: str | Callable[..., Any] | None = None

    def settings_model(self) -> Callable[..., Any] | None:
        """What checks this runner's settings; ``None`` when nothing can without importing
        the runner's module (registered by name, without a settings model)."""
        if self.settings is not None:
            if isinstance(self.settings, str):
                return load_implementation(self.settings)
            return self.settings
        if isinstance(self.implementation, str):
            return None
        return self.implementation

    def setting_names(self) -> tuple[frozenset[str], frozenset[str]] | None:
        """The settings the model takes and those it cannot do without; ``None`` when it
        takes any (``**kwargs``) or there is no model."""
        model = self.settings_model()
        if model is None:
            return None
        try:
            parameters = inspect.signature(model).parameters.values()
        except (TypeError, ValueError):  # a callable without a signature
            return None
        named = [p for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if len(named) != len(parameters):
            return None
        known = frozenset(p.name for p in named)
        required = frozenset(p.name for p in named if p.default is p.empty)
        return known, required

    def accepts(self, name: str) -> bool:
        """Whether the settings model takes setting ``name`` (``aws_conn_id``,
        ``deferrable``: an operator passes its own to runners that do)."""
        names = self.setting_names()
        return names is not None and name in names[0]

    def check_settings(self, settings: Mapping[str, Any], *, names_only: bool = False) -> None:
        """Check ``settings`` against the settings model, without building the runner.

        :param names_only: check only which settings are given (some values are still
            templates); otherwise an explicit settings model (``settings=``) is called
            with them. A runner's own class is only checked by name: building it could
            do more than check.
        :raises ValueError: an unknown setting, a required one missing, or a value the
            model refuses; the message names the execution mode and the settings.
        """
        names = self.setting_names()
        if names is not None:
            known, required = names
            unknown = sorted(set(settings) - known)
            if unknown:
                raise ValueError(
                    f"unknown settings {unknown} for execution_mode {self.name!r}; "
                    f"known: {', '.join(sorted(known))}"
                )
            missing = sorted(required - set(settings))
            if missing:
                raise ValueError(
                    f"execution_mode {self.name!r} needs the settings {missing}"
                    + (f", e.g. {self.required_settings}" if self.required_settings else "")
                )
        if names_only or self.settings is None:
            return  # a runner class is not built to check its settings: it may do I/O
        model = self.settings_model()
        try:
            model(**settings)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"invalid settings for execution_mode {self.name!r} ({_describe(model)}): {e}"
            ) from e

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


_runners: Extensions[RegisteredRunner] = Extensions(
    "execution_mode",
    unknown=lambda name, names: (
        f"unknown execution_mode {name!r}; registered: {', '.join(names)} "
        "(embedfresh.operators.runners.register_runner adds one)"
    ),
)


def register_runner(
    name: str,
    implementation: str | RunnerFactory,
    *,
    required_settings: str | None = None,
    settings: str | Callable[..., Any] | None = None,
    replace: bool = False,
) -> None:
    """Make ``name`` an ``execution_mode`` whose jobs run on ``implementation(**runner_settings)``.

    :param name: the ``execution_mode`` value.
    :param implementation: a runner class or a callable returning a runner, or a
        ``"package.module:attribute"`` string naming one (imported when first used).
    :param required_settings: an example of the settings the runner cannot do without;
        an operator that gives none then fails at parse time, showing it.
    :param settings: the runner's settings model, checked when an operator is built
        (:meth:`RegisteredRunner.check_settings`); default: ``implementation`` unless it
        is a string.
    :param replace: allow replacing a registered runner (otherwise an error, so that two
        registrations cannot silently shadow each other).
    :raises ValueError: ``name`` is empty, or is taken and ``replace`` is false.
    :raises TypeError: ``implementation`` is neither callable nor a string.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a runner needs a non-empty name, got {name!r}")
    name = str(name)  # an ExecutionMode member is kept as its plain value
    if not isinstance(implementation, str) and not callable(implementation):
        raise TypeError(
            f"runner {name!r}: {implementation!r} is neither callable nor a "
            "'module:attribute' string"
        )
    if settings is not None and not isinstance(settings, str) and not callable(settings):
        raise TypeError(f"runner {name!r}: settings {settings!r} is neither callable nor a string")
    registered = RegisteredRunner(name, implementation, required_settings, settings)
    _runners.register(name, registered, replace=replace)


def unregister_runner(name: str) -> None:
    """Forget the runner ``name`` (a test undoing its :func:`register_runner`).

    :raises ValueError: no runner is registered as ``name``.
    """
    _runners.unregister(str(name))


def registered_runners() -> tuple[str, ...]:
    """The valid ``execution_mode`` values, in registration order."""
    return _runners.names()


def registered_runner(name: str) -> RegisteredRunner:
    """The runner registered under ``name``.

    :raises ValueError: none is; the message lists the registered names.
    """
    registered = _runners.entry(str(name))
    assert isinstance(registered, RegisteredRunner)  # only register_runner adds entries
    return registered


def _describe(implementation: str | RunnerFactory) -> str:
    if isinstance(implementation, str):
        return implementation
    module = getattr(implementation, "__module__", None)
    qualname = getattr(implementation, "__qualname__", None) or repr(implementation)
    return f"{module}.{qualname}" if module else qualname
