"""Listings: ``methods``, ``components``, ``tasks``, ``models``."""

from __future__ import annotations

from fedpeft.cli.console import list_rows


def methods() -> None:
    """List method presets."""
    from fedpeft.methods import PRESETS

    list_rows("methods", [(e.name, e.obj.description) for e in PRESETS.entries()])


def components() -> None:
    """List the components of every axis (method.adapter, trainer, aggregator, selector, sharing, ...), the
    objectives (by task kind) and the classification readouts (model.readout)."""
    from fedpeft.components import AXIS_REGISTRIES, LIST_REGISTRIES
    from fedpeft.model import OBJECTIVES
    from fedpeft.model.readouts import READOUTS

    rows = [(f"method.{axis}: {e.name}", e.description)
            for axis, reg in (AXIS_REGISTRIES | LIST_REGISTRIES).items() for e in reg.entries()]
    rows += [(f"objective (task kind): {e.name}", e.description) for e in OBJECTIVES.entries()]
    rows += [(f"model.readout: {e.name}", e.description) for e in READOUTS.entries()]
    list_rows("components", rows)


def tasks() -> None:
    """List tasks (plus hf:<dataset> for users with a network)."""
    from fedpeft.data import TASKS

    list_rows("tasks", [(e.name, e.description) for e in TASKS.entries()]
          + [("hf:<name>[:<config>]", "any Hugging Face dataset (needs a network)")])


def models() -> None:
    """List built-in backbones (any Hugging Face id or local path also works)."""
    from fedpeft.backbones import BACKBONES

    list_rows("models", [(e.name, e.description) for e in BACKBONES.entries()]
          + [("<hf id or path>", "any Hugging Face encoder, masked LM or causal LM")])
