"""``private``: named tensors of any adapter stay on each client, the rest are federated (FedPer, Arivazhagan et al.
2019: a shared base and a personal head; with ``top_layers``, the personal part also holds the adapter's top layers).

The tensors are chosen by name (``fnmatch`` patterns; by default the linear task head ``head.*``, where the readout
has one) and by layer (the adapter tensors of the top k transformer layers, by default the top one; the layer is
read from the first ``.<index>.`` of a name). Each client trains its own copy from the seeded initial values and is
scored with it on its own test shard. As a stage it decides only which tensors are exchanged, so it chains with one
that decides their shape:
``exchange: [head_pruning, private]`` prunes heads of the federated LoRA while each client keeps its own head.
"""

from __future__ import annotations

import fnmatch
import re

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params
from fedpeft.sharing.base import SHARING, ShareAll, SharingContext, WHICH

LAYER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


class PrivateTensorsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tensors: list[str] = Field(["head.*"], description="fnmatch patterns of the tensor names each client keeps (the "
                                                       "linear task head by default)")
    top_layers: int = Field(1, ge=0, description="also keep the adapter tensors of the top k transformer layers "
                                                 "(FedPer's personalisation layers)")


def private_names(names: list[str], patterns: list[str], top_layers: int) -> set[str]:
    """The names matching a pattern, and those of the top ``top_layers`` layers (by their first ``.<i>.``)."""
    out = {n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
    layers = {n: int(m.group(1)) for n in names if (m := LAYER.search(n))}
    if top_layers and layers:
        first = max(layers.values()) + 1 - top_layers
        out |= {n for n, layer in layers.items() if layer >= first}
    return out


@SHARING.register("private", "named tensors (the task head; the top k layers' adapter tensors) stay on each client, "
                  "the rest federated (FedPer)", PrivateTensorsSettings)
class PrivateTensors(ShareAll):
    decides = frozenset({WHICH})
    adapters = frozenset({"lora", "deep_prompt", "full"})  # tensors named by layer

    def __init__(self, settings: PrivateTensorsSettings, ctx: SharingContext) -> None:
        super().__init__(settings, ctx)
        names = sorted(ctx.initial_params())
        self.private = private_names(names, settings.tensors, settings.top_layers)
        if not self.private:
            raise ValueError(f"method.exchange: 'private' keeps no tensor: none of {names[:4]}... matches "
                             f"tensors={settings.tensors} or the top {settings.top_layers} layers")
        if self.private == set(names):
            raise ValueError("method.exchange: 'private' keeps every tensor on the clients; that is local-only "
                             "(method.sharing.name: local)")

    def shared(self, glob: Params, state: Message, round: int) -> list[str]:
        return sorted(k for k in glob if k not in self.private)

    def client_params(self, received: Params, private: Params) -> Params:
        """The server's tensors, the device's own private ones (their initial values until it first trains)."""
        return self.ctx.initial_params() | {k: v.float() for k, v in private.items()} | received

    def private_state(self, trained: Params) -> Params:
        return {k: v.clone() for k, v in trained.items() if k in self.private}
