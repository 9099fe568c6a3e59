"""The local-trainer axis: how a client improves its adapter from what the server sent.

A trainer owns the exchange format of its kind of update: ``downlink`` builds the instruction from the
shared global tensors (and what the aggregator broadcasts), ``params_of`` reads the starting tensors back
out of it, ``fit`` trains and returns an ``Update``, ``update_shapes`` (with ``wire_dtypes`` and ``check``) tells
the server what a valid reply holds, ``decode`` turns a received update into tensors named like the global
state (token indices into prompt rows), and ``evaluate`` scores tensors on data the way this trainer may touch the model (gradient
trainers through the classifier, black-box trainers through the forward-only ``BlackBox``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from fedpeft.backbones.classifier import Classifier, evaluate
from fedpeft.backbones.encoding import Encoded
from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.registry import Registry

PARAMS, DISTRIBUTION, NONE = "params", "distribution", "none"
Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class TrainerContext:
    """What a trainer may use: the shared classifier, the run's experiment, and what the aggregator reads."""

    classifier: Classifier
    experiment: Any                       # fedpeft.experiment.Experiment (task, backbone, max_length)
    adapter_settings: Any
    needs: frozenset[str] = frozenset()   # auxiliary values the aggregator reads from every update
    eval_batch: int = 64


class LocalTrainer(Protocol):
    kind: ClassVar[str]                        # PARAMS | DISTRIBUTION | NONE: what its updates are
    adapters: ClassVar[frozenset[str] | None]  # adapters it can train (None: any)
    scalars: ClassVar[tuple[str, ...]]         # auxiliary scalars every reply carries
    provides: ClassVar[frozenset[str]]         # auxiliary values (scalars and tensors) an aggregator may read

    def downlink(self, shared: Params, broadcast: Message) -> Message: ...

    def eval_downlink(self, shared: Params) -> Message: ...

    def params_of(self, instruction: Message) -> Params: ...

    def fit(self, params: Params, instruction: Message, client: ClientContext, round: int,
            state: Params, frozen: dict[str, torch.Tensor] | None = None,
            static: Params | None = None) -> tuple[Update, Params]:
        """Train from ``params`` (entries where ``frozen`` is True keep their values; ``static`` backbone weights
        replace the frozen ones in this client's forwards); returns the update and the trainer's new client state."""
        ...

    def update_shapes(self, shared: Shapes) -> tuple[Shapes, Shapes]:
        """(update tensor shapes, auxiliary tensor shapes) of a valid reply."""
        ...

    def wire_dtypes(self) -> dict[str, torch.dtype]:
        """Reply tensors that do not travel in the float wire dtype (e.g. uint16 token indices)."""
        ...

    def check(self, reply: Message) -> None:
        """Trainer-specific validity of a reply (raise ValueError to reject it before aggregation)."""
        ...

    def decode(self, update: Update, shared: Params) -> Update:
        """Server side: the update with tensors named and shaped like the shared global tensors."""
        ...

    def evaluate(self, params: Params, data: Encoded) -> dict[str, float]: ...

    def diagnostics(self, glob: Params) -> dict[str, float]: ...


def floats(p: Params) -> Params:
    """Floating tensors as float32 (wire float16 upcast); integer tensors (token ids) unchanged."""
    return {k: v.float() if v.is_floating_point() else v for k, v in p.items()}


class TrainerBase:
    """Defaults: the instruction is the shared tensors themselves; evaluation through the classifier."""

    kind: ClassVar[str] = PARAMS
    adapters: ClassVar[frozenset[str] | None] = None
    scalars: ClassVar[tuple[str, ...]] = ()
    provides: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, settings: Any, ctx: TrainerContext) -> None:
        self.settings, self.ctx = settings, ctx
        self.clf = ctx.classifier

    def downlink(self, shared: Params, broadcast: Message) -> Message:
        return Message(tensors=dict(shared) | broadcast.tensors, scalars=dict(broadcast.scalars))

    def eval_downlink(self, shared: Params) -> Message:
        return Message(tensors=dict(shared))

    def params_of(self, instruction: Message) -> Params:
        return floats(instruction.tensors)

    def update_shapes(self, shared: Shapes) -> tuple[Shapes, Shapes]:
        return dict(shared), {}

    def wire_dtypes(self) -> dict[str, torch.dtype]:
        return {}

    def check(self, reply: Message) -> None:
        pass

    def decode(self, update: Update, shared: Params) -> Update:
        return update

    def evaluate(self, params: Params, data: Encoded) -> dict[str, float]:
        if len(data) == 0:
            return {"num_examples": 0}
        return evaluate(self.clf, floats(params), data, self.ctx.eval_batch)

    def diagnostics(self, glob: Params) -> dict[str, float]:
        return {}


TRAINERS: Registry[type] = Registry("trainer")  # classes built as cls(settings, TrainerContext)
