"""The benchmarks' experiment grids as data: one YAML file per benchmark (its arms as config overrides, its tasks and
partitions), read by its script, so that a grid is changed or extended without touching the code that runs and
renders it. A job's run directory is named from these labels: renaming one starts its runs anew."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def _splice(node: Any) -> Any:
    """Lists inside a list are spliced into it (``[*poison, attack.boost=10]``: a YAML alias of a list of overrides
    followed by more)."""
    if isinstance(node, dict):
        return {k: _splice(v) for k, v in node.items()}
    if isinstance(node, list):
        return [x for item in node for x in (_splice(item) if isinstance(item, list) else [_splice(item)])]
    return node


def load_grid(name: str) -> dict[str, Any]:
    """The grid of benchmark ``name`` (``benchmarks/grids/<name>.yaml``)."""
    return _splice(yaml.safe_load((HERE / f"{name}.yaml").read_text()))
