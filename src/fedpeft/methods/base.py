"""The pure algorithm contract every method implements, and the client view it runs against.

A method is four functions over plain data (``Message`` = named tensors + JSON scalars):
``server_init``, ``configure_round``, ``client_update`` and ``aggregate`` (plus the evaluation
pair). The embedded runner, the Flower adapter, checkpointing and the tests all call these same
functions; nothing in them knows which runtime delivered the message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from fedpeft.backbones.encoding import Encoded
from fedpeft.comm.codec import Message, WireSpec
from fedpeft.registry import Registry


@dataclass
class ClientContext:
    """What one client has locally: its data, its persistent state store and its seed."""

    client_id: int
    train: Encoded
    test: Encoded
    state: Message = field(default_factory=Message)  # persists across rounds; checkpointed by the runtime
    seed: int = 0


@dataclass(frozen=True)
class ReplySchema:
    """What a valid reply must contain: tensor names with shapes and wire dtype, required scalars."""

    tensors: dict[str, tuple[int, ...]]
    dtype: torch.dtype
    scalars: tuple[str, ...] = ("num_examples",)


class Method(Protocol):
    name: str
    wire: WireSpec

    def server_init(self) -> Message: ...

    def configure_round(self, state: Message, round: int, clients: list[int],
                        rng: np.random.Generator) -> dict[int, Message]: ...

    def client_update(self, instruction: Message, client: ClientContext) -> Message: ...

    def reply_schema(self, state: Message) -> ReplySchema: ...

    def aggregate(self, state: Message, round: int, replies: dict[int, Message]) -> Message: ...

    def configure_evaluate(self, state: Message, round: int, clients: list[int]) -> dict[int, Message]: ...

    def client_evaluate(self, instruction: Message, client: ClientContext) -> Message: ...

    def evaluate_global(self, state: Message) -> dict[str, float]: ...

    def trainable_params(self, state: Message) -> int: ...


@dataclass(frozen=True)
class Preset:
    """A named method: defaults for the ``method`` config section plus a builder."""

    name: str
    description: str
    method_defaults: dict[str, Any]
    build: Callable[..., Method]
    checks: tuple[Callable[[Any], None], ...] = ()
    options: type | None = None  # pydantic model of ``method.options``

    def defaults(self) -> dict[str, Any]:
        import copy

        return copy.deepcopy(self.method_defaults)

    def check(self, cfg: Any) -> None:
        for fn in self.checks:
            fn(cfg)


def requires(axis: str, *names: str) -> Callable[[Any], None]:
    """A preset check: ``method.<axis>.name`` must be one of ``names`` (the error names the field)."""

    def check(cfg: Any) -> None:
        got = getattr(cfg.method, axis).name
        if got not in names:
            raise ValueError(f"method.{axis}.name: preset '{cfg.method.name}' needs {' or '.join(names)}, "
                             f"got '{got}'")

    return check


PRESETS: Registry[Preset] = Registry("method")
