"""The registries of the three method axes, and typed access to a section's settings."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from fedpeft.config import Component
from fedpeft.registry import Registry

M = TypeVar("M", bound=BaseModel)


def component_registries() -> dict[str, Registry[Any]]:
    """axis name -> registry; every registered component may declare a pydantic settings model."""
    from fedpeft.adapters import ADAPTERS
    from fedpeft.aggregators import AGGREGATORS
    from fedpeft.trainers import TRAINERS

    return {"adapter": ADAPTERS, "trainer": TRAINERS, "aggregator": AGGREGATORS}


def settings_of(section: Component, registry: Registry[Any]) -> Any:
    """The typed settings object of a resolved section (``None`` if the component declares none)."""
    model = registry.entry(section.name).settings
    return model.model_validate(section.settings()) if model is not None else None
