"""Lazy imports of the heavy libraries: ``torch = lazy("torch")`` imports torch at the first attribute access.
Listing the registries and validating a config (the CLI's start-up) then never import torch, transformers or sklearn."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any


class LazyModule(ModuleType):
    """Stands for module ``name`` until an attribute is read: then imports it and keeps each attribute read in its
    own ``__dict__``, so later reads are plain attribute lookups."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__dict__["_lazy_module"] = None

    def _load(self) -> ModuleType:
        module = self.__dict__["_lazy_module"]
        if module is None:
            module = self.__dict__["_lazy_module"] = importlib.import_module(self.__name__)
        return module

    def __getattr__(self, attr: str) -> Any:  # only for names not yet kept
        if attr.startswith("__") and attr.endswith("__"):
            return getattr(self._load(), attr)
        value = getattr(self._load(), attr)
        self.__dict__[attr] = value
        return value

    def __dir__(self) -> list[str]:
        return dir(self._load())

    def __repr__(self) -> str:
        state = "loaded" if self.__dict__["_lazy_module"] is not None else "not loaded"
        return f"<lazy module {self.__name__!r} ({state})>"


def lazy(name: str) -> Any:
    """A stand-in for ``import name`` (``F = lazy("torch.nn.functional")``) that imports it when first used."""
    return LazyModule(name)


def _entering(context: Callable[[], Any]) -> Callable[[Callable], Callable]:
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with context():
                return fn(*args, **kwargs)

        return wrapper

    return decorate


def no_grad(fn: Callable) -> Callable:
    """``@torch.no_grad()`` without importing torch when the decorated function is defined."""
    return _entering(lambda: importlib.import_module("torch").no_grad())(fn)


def inference_mode(fn: Callable) -> Callable:
    """``@torch.inference_mode()`` without importing torch when the decorated function is defined."""
    return _entering(lambda: importlib.import_module("torch").inference_mode())(fn)


class LazyDict(Mapping):
    """A read-only table built by ``factory()`` at its first use: a module-level table of torch values (dtypes)
    that importing the module must not build."""

    def __init__(self, factory: Callable[[], dict]) -> None:
        self._factory: Callable[[], dict] | None = factory
        self._data: dict = {}

    def _table(self) -> dict:
        if self._factory is not None:
            self._data, self._factory = self._factory(), None
        return self._data

    def __getitem__(self, key: Any) -> Any:
        return self._table()[key]

    def __iter__(self) -> Iterator:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return repr(self._table()) if self._factory is None else "<lazy table (not built)>"


def lazy_dict(factory: Callable[[], dict]) -> Mapping:
    """``TABLE = lazy_dict(lambda: {"bfloat16": torch.bfloat16})``: the dict is built when first read."""
    return LazyDict(factory)
