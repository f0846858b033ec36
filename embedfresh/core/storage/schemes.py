"""The storage scheme registry: which :class:`~embedfresh.core.storage.base.Scheme`
serves a root URL, by its scheme (``file``, ``s3``).

A new scheme is one module (a Scheme subclass) and one registration line: in
:data:`BUILT_IN_SCHEMES`, or :func:`register_scheme` in a program or a test. Modules are
imported when a store with that scheme is first opened.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.settings import load_implementation
from embedfresh.core.storage.base import Scheme

#: URL scheme -> ``"module:Class"`` of its Scheme. A plain path (no scheme) is ``file``.
BUILT_IN_SCHEMES: Mapping[str, str] = MappingProxyType(
    {
        "file": "embedfresh.core.storage.local:LocalScheme",
        "s3": "embedfresh.core.storage.s3:S3Scheme",
    }
)

_registry: dict[str, str | type[Scheme]] = dict(BUILT_IN_SCHEMES)


def register_scheme(
    name: str, implementation: str | type[Scheme], *, replace: bool = False
) -> None:
    """Serve roots ``name://...`` with ``implementation``: a :class:`Scheme` subclass, or a
    ``"package.module:Class"`` string naming one (imported when first used).

    :param replace: allow replacing a registered scheme (otherwise an error, so that two
        registrations cannot silently shadow each other).
    :raises ValueError: ``name`` is not a URL scheme, or is taken and ``replace`` is false.
    :raises TypeError: ``implementation`` is neither a Scheme subclass nor a string.
    """
    if not name or not name.isascii() or not name[0].isalpha() or name != name.lower():
        raise ValueError(f"{name!r} is not a lower-case URL scheme")
    if name in _registry and not replace:
        raise ValueError(f"storage scheme {name!r} is already registered (pass replace=True)")
    if not isinstance(implementation, str) and not (
        isinstance(implementation, type) and issubclass(implementation, Scheme)
    ):
        raise TypeError(
            f"storage scheme {name!r}: {implementation!r} is neither a Scheme subclass "
            "nor a 'module:Class' string"
        )
    _registry[name] = implementation


def unregister_scheme(name: str) -> None:
    """Forget the scheme ``name`` (a test undoing its :func:`register_scheme`).

    :raises ValueError: no scheme is registered as ``name``.
    """
    if name not in _registry:
        raise ValueError(f"storage scheme {name!r} is not registered (known: {_known()})")
    del _registry[name]


def scheme_names() -> tuple[str, ...]:
    """The registered URL schemes, in registration order."""
    return tuple(_registry)


def scheme_class(name: str, root: str) -> type[Scheme]:
    """The Scheme serving ``name://`` roots; ``root`` is the URL, for the error message.

    :raises BadInputError: no scheme is registered as ``name``; the message lists those
        that are.
    """
    entry = _registry.get(name)
    if entry is None:
        raise BadInputError(f"artifact root {root!r}: unsupported scheme {name!r} (use {_known()})")
    if isinstance(entry, type):
        return entry
    cls = load_implementation(entry)  # the scheme's module is imported here, not before
    if not (isinstance(cls, type) and issubclass(cls, Scheme)):
        raise TypeError(f"storage scheme {name!r}: {entry!r} is not a Scheme subclass")
    return cls


def _known() -> str:
    names = [f"{n}://" for n in _registry]
    return " or ".join(names) if len(names) <= 2 else f"{', '.join(names[:-1])} or {names[-1]}"
