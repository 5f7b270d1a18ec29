"""One registry per extension axis: a name -> object mapping filled by a ``register`` decorator.

Entries whose module is heavy are declared lazily as ``name -> "package.module"``; the module is imported the
first time the name is looked up, and its ``@REGISTRY.register(name)`` decorator fills the entry.

A registry may name a ``contract``: a ``typing.Protocol`` its entries must provide. Registering a class that lacks
one of the protocol's members fails there, naming every member it lacks. A class provides a member by defining
it or, for what each instance sets in ``__init__``, by declaring it (a class-level annotation). Objects built
later, such as a model instance handed to a runner, are checked with ``conform`` when they are handed over.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")
O = TypeVar("O")


class ContractError(TypeError):
    """An entry or object that lacks members its protocol requires (a programming error, named in full)."""


def protocol_members(protocol: type) -> tuple[str, ...]:
    """The members a protocol class requires: its annotated attributes and its methods and properties, its
    protocol bases' included."""
    names: set[str] = set()
    for base in protocol.__mro__:
        if base is Protocol or not getattr(base, "_is_protocol", False):
            continue
        names.update(name for name in base.__dict__.get("__annotations__", {}) if not name.startswith("_"))
        names.update(name for name, value in base.__dict__.items() if not name.startswith("_")
                     and (callable(value) or isinstance(value, (property, staticmethod, classmethod))))
    return tuple(sorted(names))


def missing_members(obj: object, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``obj`` (a class, or an instance) does not provide."""
    declared: set[str] = set()
    if isinstance(obj, type):
        for base in obj.__mro__:
            declared.update(base.__dict__.get("__annotations__", {}))
    return [name for name in protocol_members(protocol) if name not in declared and not hasattr(obj, name)]


def conform(obj: O, protocol: type, what: str) -> O:
    """``obj`` unchanged, or a ``ContractError`` naming ``what`` (for the message) and every member it lacks."""
    missing = missing_members(obj, protocol)
    if missing:
        raise ContractError(f"{what} does not provide what {protocol.__name__} requires: it lacks "
                            f"{', '.join(missing)}")
    return obj


class UnknownEntryError(KeyError):
    """A name that no registry entry answers to."""

    def __str__(self) -> str:  # KeyError quotes its argument; show the message as written
        return str(self.args[0])


class Registry(Generic[T]):
    """A typed mapping for one extension axis (architectures, converters, decoders ...)."""

    def __init__(self, axis: str, lazy: dict[str, str] | None = None, contract: type | None = None) -> None:
        self.axis = axis
        self._lazy = dict(lazy or {})
        self._entries: dict[str, T] = {}
        self.contract = contract  # a Protocol every entry provides, checked when it registers

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.axis} {name!r} is registered twice")
            if self.contract is not None:
                conform(obj, self.contract, f"{self.axis} {name!r} ({getattr(obj, '__name__', obj)!r})")
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
