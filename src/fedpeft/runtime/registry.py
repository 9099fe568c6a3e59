"""Runtimes by name (``runtime.name``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedpeft.registry import Registry
from fedpeft.runtime.embedded import run_embedded

RUNTIMES: Registry[Callable[..., dict[str, Any]]] = Registry("runtime")
RUNTIMES.add("embedded", run_embedded, "server and all simulated clients in this process (default)")
