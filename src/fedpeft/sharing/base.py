"""Which of the adapter's tensors are exchanged, and what a client keeps to itself (the sharing policy).

The default shares everything. A policy may share a subset that changes over rounds (FedPepTAO's selected
layers), keep the rest private on each client (personalisation), ask clients for extra reports (layer
scores) and act on them after aggregation. The method calls it at fixed points of the round:
server ``init`` / ``shared`` / ``instruction_scalars`` / ``report_schema`` / ``after_aggregate``, client
``client_params`` / ``client_report`` / ``private_state``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fedpeft.backbones.classifier import Classifier
from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.registry import Registry

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class SharingContext:
    classifier: Classifier
    seed: int
    initial_params: Callable[[], Params]  # the adapter's initial tensors, identical on every process


class SharingPolicy(Protocol):
    def init(self, glob: Params) -> Message: ...

    def shared(self, glob: Params, state: Message, round: int) -> list[str]: ...

    def instruction_scalars(self, state: Message, round: int) -> dict[str, Any]: ...

    def report_schema(self, state: Message, round: int) -> tuple[Shapes, tuple[str, ...]]: ...

    def after_aggregate(self, glob: Params, updates: Sequence[Update], state: Message,
                        round: int) -> tuple[Message, set[str] | None]:
        """New policy state and, when the shared set shrinks, the names that stay shared."""
        ...

    def client_params(self, received: Params, private: Params) -> Params: ...

    def client_report(self, before: Params, after: Params, instruction: Message, client: ClientContext,
                      round: int) -> tuple[Params, dict[str, Any]]: ...

    def private_state(self, trained: Params) -> Params: ...

    def diagnostics(self, state: Message) -> dict[str, float]: ...


class ShareAll:
    """Every tensor is exchanged every round; clients keep nothing of their own."""

    adapters: frozenset[str] | None = None  # adapters whose tensors this policy understands (None: any)

    def __init__(self, settings: Any, ctx: SharingContext) -> None:
        self.settings, self.ctx = settings, ctx

    def init(self, glob: Params) -> Message:
        return Message()

    def shared(self, glob: Params, state: Message, round: int) -> list[str]:
        return sorted(glob)

    def instruction_scalars(self, state: Message, round: int) -> dict[str, Any]:
        return {}

    def report_schema(self, state: Message, round: int) -> tuple[Shapes, tuple[str, ...]]:
        return {}, ()

    def after_aggregate(self, glob, updates, state, round):
        return state, None

    def client_params(self, received: Params, private: Params) -> Params:
        return received

    def client_report(self, before, after, instruction, client, round):
        return {}, {}

    def private_state(self, trained: Params) -> Params:
        return {}

    def diagnostics(self, state: Message) -> dict[str, float]:
        return {k: v for k, v in state.scalars.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


SHARING: Registry[type] = Registry("sharing policy")  # classes built as cls(settings, SharingContext)
SHARING.add("all", ShareAll, "every tensor exchanged every round (FedAvg)")
