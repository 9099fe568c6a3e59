"""Runtimes by name (``runtime.name``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedpeft.registry import Registry
from fedpeft.runtime.embedded import run_embedded


def _flower_sim(cfg: Any, out_dir: str | Path, resume: bool = False, **kw: Any) -> dict[str, Any]:
    from fedpeft.runtime.flower.simulation import run_flower_sim  # flwr/ray only when asked for

    return run_flower_sim(cfg, out_dir, resume=resume, **kw)


def _flower(cfg: Any, out_dir: str | Path, resume: bool = False, **kw: Any) -> dict[str, Any]:
    from fedpeft.runtime.flower.deployment import run_flower

    return run_flower(cfg, out_dir, resume=resume, **kw)


RUNTIMES: Registry[Callable[..., dict[str, Any]]] = Registry("runtime")
RUNTIMES.add("embedded", run_embedded, "server and all simulated clients in this process (default)")
RUNTIMES.add("flower-sim", _flower_sim, "Flower simulation runtime (Ray): one virtual SuperNode per client")
RUNTIMES.add("flower", _flower, "Flower deployment: submit with `flwr run` to a SuperLink "
             "(address: $FEDPEFT_SUPERLINK, default 127.0.0.1:9093); SuperNodes own the partitions")
