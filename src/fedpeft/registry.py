"""Named registries: one explicit table per axis, with errors that list what exists."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """Raised when a registry lookup fails; the message names the registry and the allowed values.

    Also a ``ValueError``, so that a pydantic validator can simply look the name up."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain message
        return str(self.args[0])


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    description: str
    settings: type | None = None  # pydantic model of the entry's own config keys, if any


class Registry(Generic[T]):
    """A name -> object table for one kind of thing (tasks, adapters, aggregators, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, description: str = "", settings: type | None = None) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self.add(name, obj, description, settings)
            return obj

        return deco

    def add(self, name: str, obj: T, description: str = "", settings: type | None = None) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._entries[name] = Entry(name, obj, description, settings)

    def entry(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} '{name}'; allowed: {', '.join(sorted(self._entries))}"
            ) from None

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def settings_of(self, section: Any) -> Any:
        """Typed settings of a resolved config section (``name`` plus keys); None if the entry declares none.

        A section that resolution already validated carries its settings object, which is returned as is."""
        model = self.entry(section.name).settings
        if model is None:
            return None
        typed = getattr(section, "typed_settings", None)
        return typed if isinstance(typed, model) else model.model_validate(section.settings())

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __contains__(self, name: object) -> bool:
        return name in self._entries
