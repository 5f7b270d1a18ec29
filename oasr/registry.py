"""One registry per extension axis: a name -> object mapping filled by a ``register`` decorator.

Entries whose module is heavy are declared lazily as ``name -> "package.module"``; the module is imported the
first time the name is looked up, and its ``@REGISTRY.register(name)`` decorator fills the entry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownEntryError(KeyError):
    """A name that no registry entry answers to."""

    def __str__(self) -> str:  # KeyError quotes its argument; show the message as written
        return str(self.args[0])


class Registry(Generic[T]):
    """A typed mapping for one extension axis (architectures, converters, decoders ...)."""

    def __init__(self, axis: str, lazy: dict[str, str] | None = None) -> None:
        self.axis = axis
        self._lazy = dict(lazy or {})
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.axis} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if name not in self._entries and name in self._lazy:
            importlib.import_module(self._lazy[name])
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise UnknownEntryError(f"unknown {self.axis} {name!r}; registered: {known}") from None

    def names(self) -> list[str]:
        return sorted(set(self._lazy) | set(self._entries))

    def items(self) -> Iterator[tuple[str, T]]:
        for name in self.names():
            yield name, self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._lazy or name in self._entries
