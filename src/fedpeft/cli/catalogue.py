"""Listings and the schema: ``methods``, ``components [NAME]``, ``tasks``, ``models``, ``suites``, ``config``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from fedpeft.cli.console import console, fail, list_rows


def methods() -> None:
    """List method presets."""
    from fedpeft.methods import PRESETS

    list_rows("methods", [(e.name, e.obj.description) for e in PRESETS.entries()])


def components(
    name: Annotated[Optional[str], typer.Argument(help="a component's name: print its settings")] = None,
) -> None:
    """List the components of every axis (method.adapter, trainer, aggregator, selector, sharing, ...), the
    objectives (by task kind), the classification readouts (model.readout) and the tracking sinks; with NAME, that
    component's settings (key, type, default, bounds, description)."""
    from fedpeft.catalogue import find, sections, settings_of

    if name is None:
        list_rows("components", [(f"{section}: {e.name}", e.description)
                                 for section, reg in sections().items() for e in reg.entries()])
        return
    found = find(name)
    if not found:
        fail(f"no component '{name}'; `fedpeft components` lists them")
    for section, entry in found:
        table = Table(title=f"{section}: {entry.name}", caption=entry.description)
        for col in ("key", "type", "default", "bounds", "description"):
            table.add_column(col, overflow="fold")
        for s in settings_of(entry.settings):
            table.add_row(s.key, s.type, s.default, s.bounds, s.description)
        if not entry.settings:
            table.add_row("(no settings)", "", "", "", "")
        console.print(table)


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


def suites() -> None:
    """List the standard evaluation suites (``fedpeft evaluate RUN_DIR --suite NAME``; ``lmeval:TASK`` runs
    lm-evaluation-harness on TASK)."""
    from fedpeft.suites import SUITES

    list_rows("evaluation suites", [(e.name, e.description) for e in SUITES.entries()])


def config(
    file: Annotated[Optional[Path], typer.Argument(help="experiment YAML (omit for the defaults)")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a key, e.g. method.name=fedbpt")] = [],
    schema: Annotated[bool, typer.Option("--schema", help="print the config's JSON schema instead (every key, "
                                                           "and each component's own keys), for editors")] = False,
) -> None:
    """Print the resolved config (preset and defaults filled in) as YAML, or with --schema its JSON schema."""
    from fedpeft.config import ConfigError, dump_config
    from fedpeft.resolve import load_config

    if schema:
        from fedpeft.catalogue import json_schema

        typer.echo(json.dumps(json_schema(), indent=1))
        return
    try:
        typer.echo(dump_config(load_config(file, list(set_))), nl=False)
    except ConfigError as e:
        fail(str(e))
