"""Runtimes by name (``runtime.name``): entry points resolved when a run starts, so that checking a config
imports neither the runtimes nor Flower."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from fedpeft.registry import Registry

RUNTIMES: Registry[str] = Registry("runtime")  # name -> "module:function"
RUNTIMES.add("embedded", "fedpeft.runtime.embedded:run_embedded",
             "server and all simulated clients in this process (default)")
RUNTIMES.add("flower-sim", "fedpeft.runtime.flower.simulation:run_flower_sim",
             "Flower simulation runtime (Ray): one virtual SuperNode per client")
RUNTIMES.add("flower", "fedpeft.runtime.flower.deployment:run_flower",
             "Flower deployment: submit with `flwr run` to a SuperLink (address: $FEDPEFT_SUPERLINK, "
             "default 127.0.0.1:9093); SuperNodes own the partitions")


def runtime(name: str) -> Callable[..., dict[str, Any]]:
    """The run function of runtime ``name`` (imported on first use: Flower and Ray only when asked for)."""
    module, _, func = RUNTIMES.get(name).partition(":")
    return getattr(importlib.import_module(module), func)
