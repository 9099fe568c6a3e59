"""What one simulated or real client has locally: its data, its persistent state store and the run seed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedpeft.backbones.encoding import Encoded
from fedpeft.comm.codec import Message

if TYPE_CHECKING:
    from fedpeft.config import ClientProfile
    from fedpeft.model.gather import ForwardGather


@dataclass
class ClientContext:
    client_id: int
    train: Encoded
    test: Encoded
    state: Message = field(default_factory=Message)  # persists across rounds; checkpointed by the runtime
    seed: int = 0
    weight: int | None = None                        # aggregation weight when it is not len(train) (attacks)
    asr_test: Encoded | None = None                  # triggered non-target test inputs labelled as the target
    malicious: bool = False                          # poisons its data (and boosts its delta when asked)
    forward: ForwardGather | None = None             # model calls shared with other clients (client_batch)
    profile: ClientProfile | None = None             # its resource tier (federation.client_profiles)
    external: Any = None                             # the user's own training loop (integrations.transformers)

    @property
    def num_examples(self) -> int:
        """The example count the client reports (its weight n_k)."""
        return len(self.train) if self.weight is None else self.weight


def sub_state(state: Message, prefix: str) -> dict:
    """The tensors of ``state`` under ``prefix`` (prefix removed): one component's part of the client state."""
    return {k[len(prefix):]: v for k, v in state.tensors.items() if k.startswith(prefix)}


def with_sub_state(state: Message, prefix: str, tensors: dict) -> Message:
    """``state`` with its ``prefix`` part replaced by ``tensors``."""
    keep = {k: v for k, v in state.tensors.items() if not k.startswith(prefix)}
    return Message(keep | {prefix + k: v for k, v in tensors.items()}, dict(state.scalars))
