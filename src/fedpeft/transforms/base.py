"""Client-side update transforms: act on a client's ``Update`` after local training, before it is packed.

They see only the update and the tensors the client started from, never the method, so one transform
(local DP noise, an attack's boosting, quantisation) works with every gradient method; what they may know of the
federation comes in a ``TransformContext``. Randomness comes from the generator the method derives for (seed,
round, client, "transform:<index>:<name>").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy
from fedpeft.registry import Registry

torch = lazy("torch")


@dataclass(frozen=True)
class TransformContext:
    """What a transform may know of the federation."""

    sampling_rate: float = 1.0  # q, the share of the clients selected per round (privacy accounting)


class UpdateTransform(Protocol):
    def apply(self, update: Update, start: Params, round: int, generator: torch.Generator) -> Update: ...

    def diagnostics(self, round: int, params: Params) -> dict[str, float]: ...


class TransformBase:
    accepts: frozenset[str] = frozenset({"params"})  # update kinds it can act on

    def __init__(self, settings: Any, ctx: TransformContext | None = None) -> None:
        self.settings, self.ctx = settings, ctx or TransformContext()

    def diagnostics(self, round: int, params: Params) -> dict[str, float]:
        """Scalars for the round's ``server`` metrics (e.g. the LDP epsilon spent), given the global tensors."""
        return {}


TRANSFORMS: Registry[type] = Registry("update transform")  # classes built as cls(settings, ctx)
