"""Which of the adapter's tensors are exchanged, and what a client keeps to itself (the sharing policy).

The default shares everything. A policy may share a subset that changes over rounds (FedPepTAO's selected
layers), keep the rest private on each client (personalisation), freeze and withhold parts of the update per
client (head pruning), ask clients for extra reports (layer scores, head importances) and act on them after
aggregation. The method calls it at fixed points of the round: server ``init`` / ``shared`` /
``instruction_scalars`` / ``for_client`` (what one client receives) / ``report_schema`` / ``wire_shapes`` /
``check`` / ``expand`` / ``after_aggregate`` / ``fold`` (global tensors it sets after aggregation); client
``client_params`` / ``plan`` (before training: a ``ClientPlan``, what to train and what stays frozen) / ``finish``
(after training: reports, compression) / ``upload_start`` (what the uploaded tensors started from) /
``private_state``; and ``record`` (what a reply adds to its client's round record).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fedpeft.adapters.base import HeadSlices
from fedpeft.model.classifier import Classifier
from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.registry import Registry

Shapes = dict[str, tuple[int, ...]]
# the aspects of the round's exchange a stage may decide (``ShareAll.decides``; ``exchange.capabilities``)
WHICH, SHAPE, FOLD = "which", "shape", "fold"  # which tensors travel; their shape; what the server folds in


@dataclass
class ClientPlan:
    """What the exchange tells a client's training step, decided before it trains: the tensors to train instead of
    the start, entries that stay frozen, backbone weights that replace the frozen ones in its forwards, a penalty
    added to its loss; and ``own``, what the stage itself needs again after training (kept heads, a rank)."""

    params: Params | None = None                        # what to train (None: the tensors the client starts from)
    frozen: dict[str, Any] | None = None                # name -> bool mask: True entries keep their values
    static: Params | None = None                        # backbone weights for this client's forwards
    penalty: Callable[[Params], Any] | None = None      # a differentiable term of the trained tensors
    own: dict[str, Any] = field(default_factory=dict)   # the stage's record for ``finish`` and ``upload_start``


@dataclass(frozen=True)
class SharingContext:
    objective: Classifier                 # or a LanguageModel: what the forward pass is scored by
    seed: int
    initial_params: Callable[[], Params]  # the adapter's initial tensors, identical on every process
    head_slices: HeadSlices = field(default_factory=dict)  # the adapter's head-assignable slices
    trainer: Any = None                   # the local trainer's settings
    profiles: Sequence[Any] = ()          # each client's resource tier (``federation.client_profiles``) or None
    rank: int | None = None               # the adapter's LoRA rank r, where it has one


class SharingPolicy(Protocol):
    def init(self, glob: Params) -> Message: ...

    def shared(self, glob: Params, state: Message, round: int) -> list[str]: ...

    def instruction_scalars(self, state: Message, round: int) -> dict[str, Any]: ...

    def report_schema(self, state: Message, round: int) -> tuple[Shapes, tuple[str, ...]]: ...

    def after_aggregate(self, glob: Params, updates: Sequence[Update], state: Message,
                        round: int) -> tuple[Message, set[str] | None]:
        """New policy state and, when the shared set shrinks, the names that stay shared."""
        ...

    def fold(self, glob: Params, before: Params, updates: Sequence[Update], weights: Sequence[float]) -> Params:
        """Global tensors it sets after aggregation, from the aggregated ``glob``, the global tensors ``before`` the
        round, the replies and the aggregator's weight of each (FedEx-LoRA's residual)."""
        ...

    def wire_shapes(self, update: Shapes) -> dict[str, tuple[int | None, ...]]: ...

    def for_client(self, tensors: Params, client: int, state: Message) -> Params:
        """The shared tensors as client ``client`` receives them (e.g. truncated to its LoRA rank)."""
        ...

    def check(self, reply: Message, client: int, state: Message) -> None:
        """Policy-specific consistency of client ``client``'s reply (raise ValueError to reject it)."""
        ...

    def expand(self, update: Update, shared: Params) -> Update:
        """A received update in full form for the aggregator."""
        ...

    def client_params(self, received: Params, private: Params) -> Params: ...

    def plan(self, start: Params, instruction: Message, client: ClientContext, round: int) -> ClientPlan | None:
        """Before training, a dict: optional ``params`` (the tensors to train instead of ``start``), ``frozen``
        (name -> bool mask the trainer must not change) and ``static`` (backbone weights for this client's
        forwards)."""
        ...

    def finish(self, update: Update, start: Params, trained: Params, instruction: Message, client: ClientContext,
               round: int, plan: ClientPlan) -> Update: ...

    def upload_start(self, start: Params, update: Update, plan: ClientPlan) -> Params:
        """The values the tensors of ``finish``'s update started from (``start``: what the client trained from), cut
        as ``finish`` cut them: the base client-side transforms take the client's delta w^k − w^t from."""
        ...

    def private_state(self, trained: Params) -> Params: ...

    def diagnostics(self, state: Message) -> dict[str, float]: ...

    def vectors(self, state: Message) -> dict[str, list[float]]:
        """Per-round vectors of the new state for the report's heatmaps (e.g. per-head importance)."""
        ...

    def record(self, reply: Message) -> dict[str, Any]:
        """What an accepted reply adds to its client's round record (e.g. the ids of the heads it kept)."""
        ...


class ShareAll:
    """Every tensor is exchanged every round; clients keep nothing of their own."""

    adapters: frozenset[str] | None = None  # adapters whose tensors this policy understands (None: any)
    dtypes: dict[str, Any] = {}             # reply tensors it adds that are not floats (e.g. head ids)
    provides: frozenset[str] = frozenset()  # auxiliary values its clients upload (aggregators may read them)
    per_client: bool = False                # clients receive different tensors (``for_client`` is not identity)
    ranked: bool = False                    # trains each client at its tier's LoRA rank (client_profiles[].rank)
    aggregators: frozenset[str] | None = None  # the aggregators that can combine its replies (None: any)
    summable: bool = True                   # its replies are dense tensors of fixed shapes, nothing per client
    deltas: bool = True                     # its replies are trained global tensors: w_k − w is an update (wrappers)
    decides: frozenset[str] = frozenset()   # aspects of the exchange it decides (``exchange.capabilities``)
    uploads_pairs: bool = True              # the server sees every client's LoRA factors, or the common fixed one
    needs_pairs: bool = False               # needs them (every stage of its chain must upload them)

    def __init__(self, settings: Any, ctx: SharingContext) -> None:
        self.settings, self.ctx = settings, ctx

    @classmethod
    def summable_with(cls, settings: Any) -> bool:
        """Whether, with these settings, its replies can be summed across clients (secure aggregation)."""
        return cls.summable

    @classmethod
    def same_tensors(cls, settings: Any) -> bool:
        """Whether its clients train the same tensors, entry for entry, every round, so that optimizer moments may
        carry over (``trainer.reset_optimizer: false``)."""
        return True

    @classmethod
    def side_by_side(cls, settings: Any) -> bool:
        """Whether its client steps may run in threads beside other clients' (``runtime.client_batch``)."""
        return True

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

    def fold(self, glob: Params, before: Params, updates: Sequence[Update], weights: Sequence[float]) -> Params:
        return {}

    def wire_shapes(self, update: Shapes) -> dict[str, tuple[int | None, ...]]:
        return dict(update)

    def for_client(self, tensors: Params, client: int, state: Message) -> Params:
        return tensors

    def check(self, reply: Message, client: int, state: Message) -> None:
        pass

    def expand(self, update: Update, shared: Params) -> Update:
        return update

    def client_params(self, received: Params, private: Params) -> Params:
        return received

    def plan(self, start: Params, instruction: Message, client: ClientContext, round: int) -> ClientPlan | None:
        return None

    def finish(self, update, start, trained, instruction, client, round, plan) -> Update:
        return update

    def upload_start(self, start: Params, update: Update, plan: ClientPlan) -> Params:
        return start

    def private_state(self, trained: Params) -> Params:
        return {}

    def diagnostics(self, state: Message) -> dict[str, float]:
        return {k: v for k, v in state.scalars.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    def vectors(self, state: Message) -> dict[str, list[float]]:
        return {}

    def record(self, reply: Message) -> dict[str, Any]:
        return {}


SHARING: Registry[type] = Registry("sharing policy")  # classes built as cls(settings, SharingContext)
SHARING.add("all", ShareAll, "every tensor exchanged every round (FedAvg)")
