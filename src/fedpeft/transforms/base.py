"""Client-side update transforms: act on a client's ``Update`` after local training, before it is packed.

They see only the update and the tensors the client started from, never the method, so one transform
(local DP noise, an attack's boosting, quantisation) works with every gradient method. Randomness comes
from the generator the method derives for (seed, round, client, "transform:<name>").
"""

from __future__ import annotations

from typing import Any, Protocol

from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy
from fedpeft.registry import Registry

torch = lazy("torch")


class UpdateTransform(Protocol):
    def apply(self, update: Update, start: Params, round: int, generator: torch.Generator) -> Update: ...

    def diagnostics(self, round: int, cfg: Any, params: Params) -> dict[str, float]: ...


class TransformBase:
    accepts: frozenset[str] = frozenset({"params"})  # update kinds it can act on

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def diagnostics(self, round: int, cfg: Any, params: Params) -> dict[str, float]:
        """Scalars for the round's ``server`` metrics (e.g. the LDP epsilon spent), given the global tensors."""
        return {}


TRANSFORMS: Registry[type] = Registry("update transform")  # classes built as cls(settings)
