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
from embedfresh.core.extensions import Extensions
from embedfresh.core.storage.base import Scheme

#: URL scheme -> ``"module:Class"`` of its Scheme. A plain path (no scheme) is ``file``.
BUILT_IN_SCHEMES: Mapping[str, str] = MappingProxyType(
    {
        "file": "embedfresh.core.storage.local:LocalScheme",
        "s3": "embedfresh.core.storage.s3:S3Scheme",
    }
)

_schemes: Extensions[type[Scheme]] = Extensions(
    "storage scheme",
    built_in=BUILT_IN_SCHEMES,
    base=Scheme,
    unknown=lambda name, names: (
        f"storage scheme {name!r} is not registered (known: {_known(names)})"
    ),
)


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
    _schemes.register(name, implementation, replace=replace)


def unregister_scheme(name: str) -> None:
    """Forget the scheme ``name`` (a test undoing its :func:`register_scheme`).

    :raises ValueError: no scheme is registered as ``name``.
    """
    _schemes.unregister(name)


def scheme_names() -> tuple[str, ...]:
    """The registered URL schemes, in registration order."""
    return _schemes.names()


def scheme_class(name: str, root: str) -> type[Scheme]:
    """The Scheme serving ``name://`` roots; ``root`` is the URL, for the error message.

    :raises BadInputError: no scheme is registered as ``name``; the message lists those
        that are.
    """
    if name not in _schemes:
        raise BadInputError(
            f"artifact root {root!r}: unsupported scheme {name!r} (use {_known(scheme_names())})"
        )
    return _schemes.load(name)  # the scheme's module is imported here, not before


def _known(schemes: tuple[str, ...]) -> str:
    names = [f"{n}://" for n in schemes]
    return " or ".join(names) if len(names) <= 2 else f"{', '.join(names[:-1])} or {names[-1]}"
