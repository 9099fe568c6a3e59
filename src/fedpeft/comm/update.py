"""What a client returns, typed: the trained tensors (the update), its weight, and auxiliary values kept apart.

``pack`` writes an ``Update`` as the wire ``Message`` (update and auxiliary tensors side by side under their
own names, the weight as the ``num_examples`` scalar); ``unpack`` splits a validated reply back using the
``ReplySchema`` the server expects, which names the update tensors. Client-side transforms (local DP,
attacks, quantisation) and server-side aggregation wrappers (clipping, robust filters) act on
``Update.tensors`` without knowing which method produced them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fedpeft.comm.codec import Message
from fedpeft.lazy import lazy

torch = lazy("torch")

Params = dict[str, "torch.Tensor"]
WEIGHT = "num_examples"


@dataclass(frozen=True)
class ReplySchema:
    """What a valid reply must contain: tensor names with shapes and wire dtype, required scalars, and which
    of the tensors are the update (the rest are auxiliary: losses, scores, step sizes)."""

    tensors: dict[str, tuple[int | None, ...]]  # None: a dimension whose size varies per client
    dtype: torch.dtype
    scalars: tuple[str, ...] = (WEIGHT,)
    update_keys: frozenset[str] | None = None  # None: every tensor is part of the update
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)  # tensors not in the float wire dtype
    check: Callable[[Any, int], None] | None = None  # method-specific check of (reply, client id); ValueError

    def dtype_of(self, name: str) -> torch.dtype:
        return self.dtypes.get(name, self.dtype)

    def is_update(self, name: str) -> bool:
        return self.update_keys is None or name in self.update_keys


@dataclass
class Update:
    """One client's contribution to a round."""

    client: int
    tensors: Params                                   # trained tensors (same names as the global state)
    weight: int                                       # local examples n_k
    aux_tensors: Params = field(default_factory=dict)
    scalars: dict[str, Any] = field(default_factory=dict)

    def with_tensors(self, tensors: Params) -> Update:
        return replace(self, tensors=tensors)


def pack(update: Update) -> Message:
    """The reply message: update and auxiliary tensors (disjoint names), ``num_examples`` plus the scalars."""
    clash = set(update.tensors) & set(update.aux_tensors)
    if clash:
        raise ValueError(f"update and auxiliary tensors share names: {sorted(clash)}")
    return Message(tensors=update.tensors | update.aux_tensors, scalars={WEIGHT: update.weight, **update.scalars})


def unpack(msg: Message, schema: ReplySchema, client: int) -> Update:
    """Split a (validated) reply into its update and auxiliary parts; tensors are upcast to float32."""
    upd, aux = {}, {}
    for k, v in msg.tensors.items():
        (upd if schema.is_update(k) else aux)[k] = v.float() if v.is_floating_point() else v
    scalars = {k: v for k, v in msg.scalars.items() if k != WEIGHT}
    return Update(client, upd, int(msg.scalars[WEIGHT]), aux, scalars)
