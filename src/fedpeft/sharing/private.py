"""Sharing policies that keep tensors on the clients: the personalisation baselines FedPepTAO is measured against.

- ``local``: nothing is exchanged; every client trains its own copy of all tensors from the common
  initialisation and is scored with it on its own test shard (the local-only lower bound of personalised FL).
- ``fixed_split``: a fixed set of deep-prompt layers stays on each client from round 1, the others are
  federated. Private top layers is FedPer's split (Arivazhagan et al. 2019: shared base, personal head);
  private bottom layers is LG-FedAvg's (Liang et al. 2020: local representations, global top). FedPepTAO's
  ``layer_selection`` keeps the same kind of private layers, chosen by score after t shared warm-up rounds.

``PrivateLayers`` is the client side common to ``fixed_split`` and ``layer_selection``: the server's state
scalar ``selected`` lists the shared layers (every layer while it is None) and each device keeps its latest
copy of all prefix layers, of which the non-shared ones are never uploaded (spec A18). Initial tensors come
from the experiment seed, so a device that never trained starts from the same E^0 without communication.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.deep_prompt import PREFIX, layer_of
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params
from fedpeft.sharing.base import SHAPE, SHARING, ShareAll, SharingContext, WHICH


class KeepLocal(ShareAll):
    """Nothing is exchanged: each client's tensors are its own (initialised from the common seed)."""

    decides = frozenset({WHICH, SHAPE})  # nothing travels: no other stage has anything to act on
    uploads_pairs = False

    def shared(self, glob: Params, state: Message, round: int) -> list[str]:
        return []

    def client_params(self, received: Params, private: Params) -> Params:
        return self.ctx.initial_params() | private | received

    def private_state(self, trained: Params) -> Params:
        return {k: v.clone() for k, v in trained.items()}


SHARING.add("local", KeepLocal, "nothing exchanged: every client trains and keeps its own tensors (local-only)")


class PrivateLayers(ShareAll):
    """The deep-prompt layers listed in the state scalar ``selected`` are shared (all while it is None); each
    device trains its own copy of the others and keeps it as client state."""

    adapters = frozenset({"deep_prompt"})
    decides = frozenset({WHICH})

    def __init__(self, settings: Any, ctx: SharingContext) -> None:
        super().__init__(settings, ctx)
        self.num_layers = sum(1 for k in ctx.initial_params() if k.startswith(PREFIX))

    def shared(self, glob: Params, state: Message, round: int) -> list[str]:
        selected = state.scalars.get("selected")
        if selected is None:
            return sorted(glob)
        return sorted(k for k in glob if layer_of(k) is None or layer_of(k) in selected)

    def client_params(self, received: Params, private: Params) -> Params:
        """The device's prompts: its private copy (or E^0 if never trained), shared slices from the server."""
        return self.ctx.initial_params() | {k: v.float() for k, v in private.items()} | received

    def private_state(self, trained: Params) -> Params:
        return {k: v.clone() for k, v in trained.items() if k.startswith(PREFIX)}

    def vectors(self, state: Message) -> dict[str, list[float]]:
        """Once there is a selection: SL as a 0/1 vector per layer."""
        selected = state.scalars.get("selected")
        if selected is None:
            return {}
        chosen = {int(x) for x in selected}
        return {"selected_layers": [1.0 if layer in chosen else 0.0 for layer in range(self.num_layers)]}


def split_layers(num_layers: int, private: Literal["top", "bottom"], num_private: int | None) -> list[int]:
    """The shared layers when the top (FedPer) or bottom (LG-FedAvg) ``num_private`` layers stay private;
    None keeps ⌊L/2⌋ private, so that the ⌈L/2⌉ shared layers match FedPepTAO's |SL| at r = 0.5."""
    k = num_layers // 2 if num_private is None else num_private
    if k > num_layers:
        raise ValueError(f"method.sharing.num_private: {k} private layers, the model has {num_layers}")
    return list(range(num_layers - k)) if private == "top" else list(range(k, num_layers))


class FixedSplitSettings(BaseModel):
    """``method.sharing`` keys of ``fixed_split``."""

    model_config = ConfigDict(extra="forbid")
    private: Literal["top", "bottom"] = Field("top", description="which prompt layers stay on the clients: top "
                                                                 "(FedPer) or bottom (LG-FedAvg)")
    num_private: int | None = Field(None, ge=0, description="k private layers (0: FedAvg on every layer, L: "
                                                           "local-only); null: ⌊L/2⌋ (|SL| of FedPepTAO at r = 0.5)")


@SHARING.register("fixed_split", "a fixed split of the deep-prompt layers from round 1: the top (FedPer) or bottom "
                  "(LG-FedAvg) k layers stay on each client, the rest are federated", FixedSplitSettings)
class FixedSplit(PrivateLayers):
    def init(self, glob: Params) -> Message:
        s = self.settings
        return Message(scalars={"selected": split_layers(self.num_layers, s.private, s.num_private)})


__all__ = ["FixedSplit", "FixedSplitSettings", "KeepLocal", "PrivateLayers", "split_layers"]
