"""Which layers are shared: |SL| = max(1, ⌈r·L⌉) layers in a chosen order (Alg. 1 lines 15–19; spec §5 ablation).

Orders: ``score`` (PEPT: descending aggregated score ζ_l, ties to the lower index), ``random`` (seeded),
``ascending`` (the bottom layers 0..|SL|−1) and ``descending`` (the top layers), as in the paper's Figure 5.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fedpeft.lazy import lazy
from fedpeft.registry import Registry

torch = lazy("torch")

Order = Callable[["torch.Tensor", np.random.Generator], list[int]]


def num_selected(ratio: float, num_layers: int) -> int:
    """|SL| = max(1, ⌈r·L⌉): all layers have the same prompt size, so Alg. 1's loop keeps ⌈r·L⌉ of them."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"layer ratio r must be in [0, 1], got {ratio}")
    return max(1, min(num_layers, math.ceil(ratio * num_layers - 1e-9)))


def _by_score(scores: torch.Tensor, rng: np.random.Generator) -> list[int]:
    return sorted(range(len(scores)), key=lambda l: (-float(scores[l]), l))


def _random(scores: torch.Tensor, rng: np.random.Generator) -> list[int]:
    return [int(x) for x in rng.permutation(len(scores))]


def _ascending(scores: torch.Tensor, rng: np.random.Generator) -> list[int]:
    return list(range(len(scores)))


def _descending(scores: torch.Tensor, rng: np.random.Generator) -> list[int]:
    return list(range(len(scores)))[::-1]


LAYER_ORDERS: Registry[Order] = Registry("layer order")
LAYER_ORDERS.add("score", _by_score, "PEPT: highest aggregated score ζ_l first (Alg. 1 line 16)")
LAYER_ORDERS.add("random", _random, "uniformly random layers (seeded), the paper's random baseline")
LAYER_ORDERS.add("ascending", _ascending, "bottom layers first (P-tuning v2 depth ablation)")
LAYER_ORDERS.add("descending", _descending, "top layers first (P-tuning v2 depth ablation)")


def select_layers(scores: torch.Tensor, ratio: float, order: str, rng: np.random.Generator) -> list[int]:
    """SL: the first |SL| layers of the chosen order, returned sorted by index."""
    ranked = LAYER_ORDERS.get(order)(scores, rng)
    return sorted(ranked[: num_selected(ratio, len(scores))])
