"""Server-side norm clipping of client deltas (Sun et al. 2019, "Can You Really Backdoor Federated Learning?",
Sec. 3 "norm thresholding of updates").

Before the inner aggregator runs, every client delta Δ_k = x_k − x_t (flattened over all shared tensors,
sorted by name) is projected onto the L2 ball of radius C:

    Δ_k ← Δ_k · min(1, C / ‖Δ_k‖₂)     (= Δ_k / max(1, ‖Δ_k‖₂ / C), Sun et al.'s form)
    x_k ← x_t + Δ_k

so a delta already within the ball is passed on unchanged. The wrapper keeps no state of its own; the number
of clients clipped in the last round is reported by ``diagnostics`` as ``clipped`` (stored as a plain integer
scalar in the returned state, hidden from the inner aggregator).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.base import WRAPPERS, AggregatorWrapper, Params, flatten, unflatten, uploaded
from fedpeft.comm.update import Update
from fedpeft.lazy import lazy

torch = lazy("torch")

CLIPPED = "clipped"


class ClipSettings(BaseModel):
    """``method.wrappers`` entry keys of ``clip``."""

    model_config = ConfigDict(extra="forbid")
    max_norm: float = Field(..., gt=0, description="C: every client delta is scaled to L2 norm at most C")


def clip_factor(norm: float, max_norm: float) -> float:
    """min(1, C / ‖Δ‖) (1 for a zero delta)."""
    return 1.0 if norm <= max_norm else max_norm / norm


def clip_updates(glob: Params, updates: Sequence[Update], max_norm: float) -> tuple[list[Update], int]:
    """Each update rebuilt as x_t + Δ_k·min(1, C/‖Δ_k‖₂) (float32); also the number of clipped updates."""
    keys = uploaded(glob, updates)
    base = flatten(glob, keys)
    out, clipped = [], 0
    for u in updates:
        delta = flatten(u.tensors, keys) - base
        factor = clip_factor(float(torch.linalg.vector_norm(delta)), max_norm)
        if factor < 1.0:
            clipped += 1
            new = unflatten(base + factor * delta, glob, keys)
            tensors = dict(u.tensors) | {k: v.float() for k, v in new.items()}
            out.append(u.with_tensors(tensors))
        else:
            out.append(u)
    return out, clipped


@WRAPPERS.register("clip", "scale every client delta to L2 norm at most max_norm before aggregating "
                   "(Sun et al. 2019 norm thresholding)", ClipSettings)
class Clip(AggregatorWrapper):
    own_scalars = (CLIPPED,)

    def transform(self, glob: Params, updates: Sequence[Update], round: int) -> list[Update]:
        out, self._clipped = clip_updates(glob, updates, self.settings.max_norm)
        return out

    def round_scalars(self) -> dict[str, int]:
        return {CLIPPED: int(self._clipped)}
