"""Extension points by name: the one registry behind backends, storage schemes and runners.

Names map to implementations, each an object or a ``"package.module:attribute"`` string
imported when first loaded, so a name can be offered (a DAG's choices, an error's list)
without importing its module. Built-in names come from a read-only table; programs and
tests add more at run time. A taken name is never silently shadowed: ``replace=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from embedfresh.core.settings import load_implementation

T = TypeVar("T")


class Extensions(Generic[T]):
    """Names -> implementations of one ``kind`` (``"backend"``, for messages).

    :param unknown: the message for a name not registered, given it and the names that are.
    :param built_in: the names known without registering, in order.
    :param base: the class an implementation must subclass (checked when registered, and
        when a string entry is loaded); ``None``: any object.
    """

    def __init__(
        self,
        kind: str,
        *,
        unknown: Callable[[str, tuple[str, ...]], str],
        built_in: Mapping[str, str | T] = MappingProxyType({}),
        base: type | None = None,
    ) -> None:
        self.kind, self._unknown, self._base = kind, unknown, base
        self._entries: dict[str, str | T] = dict(built_in)

    def register(self, name: str, implementation: str | T, *, replace: bool = False) -> None:
        """:raises ValueError: ``name`` is taken and ``replace`` is false.
        :raises TypeError: ``implementation`` is neither a string nor of the base class."""
        if name in self._entries and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered (pass replace=True)")
        if not isinstance(implementation, str) and not self._fits(implementation):
            raise TypeError(
                f"{self.kind} {name!r}: {implementation!r} is neither a "
                f"{self._base.__name__} subclass nor a 'module:Class' string"
            )
        self._entries[name] = implementation

    def unregister(self, name: str) -> None:
        """:raises ValueError: ``name`` is not registered."""
        self.entry(name)
        del self._entries[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def unknown(self, name: str) -> str:
        """What to tell someone who asked for ``name``, which is not registered."""
        return self._unknown(name, self.names())

    def entry(self, name: str) -> str | T:
        """What ``name`` was registered with, nothing imported.

        :raises ValueError: ``name`` is not registered (the :meth:`unknown` message)."""
        if name not in self._entries:
            raise ValueError(self.unknown(name))
        return self._entries[name]

    def load(self, name: str) -> Any:
        """The implementation of ``name``, its module imported now if registered by name.

        :raises TypeError: the string names something not of the base class."""
        entry = self.entry(name)
        if not isinstance(entry, str):
            return entry
        loaded = load_implementation(entry)
        if not self._fits(loaded):
            raise TypeError(
                f"{self.kind} {name!r}: {entry!r} is not a {self._base.__name__} subclass"
            )
        return loaded

    def _fits(self, implementation: object) -> bool:
        return self._base is None or (
            isinstance(implementation, type) and issubclass(implementation, self._base)
        )
