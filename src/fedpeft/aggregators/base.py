"""The server-aggregator axis: the ``Aggregator`` protocol, its registry, and helpers over named tensors.

An aggregator turns the accepted updates of a round into the new global tensors and keeps its own
persistent state (``Message``: tensors + JSON scalars, checkpointed with the server state):
``init(global) -> state``; ``aggregate(global, updates, state, round) -> (new_global, state)``.
``global`` holds only the tensors shared this round; updates are in client-id order. State tensors that
belong to one global tensor are named ``<slot>::<tensor>`` (e.g. ``m::prompt``, ``c/3::prefix.0``) so that
``restrict`` can drop the ones of tensors that stop being shared.

Compatibility is declared, not checked by the methods: ``accepts`` lists the kinds of update an aggregator
can combine (``params``: trained tensors; ``distribution``: a CMA-ES search distribution; ``none``: no
tensors; ``seeds``: projected gradients of seeded zeroth-order steps), ``needs`` the auxiliary values it reads
from every update, ``secure_sum`` (``secure_sum_with``, given
its settings) whether it needs nothing but the sample-weighted mean of the updates (then it runs under secure
aggregation, given that mean as one update).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy
from fedpeft.registry import Registry

torch = lazy("torch")

PARAMS, DISTRIBUTION, NONE, SEEDS = "params", "distribution", "none", "seeds"
SEP = "::"


class Aggregator(Protocol):
    accepts: ClassVar[frozenset[str]]
    needs: ClassVar[frozenset[str]]

    def init(self, glob: Params) -> Message: ...

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message,
                  round: int) -> tuple[Params, Message]: ...

    def broadcast(self, state: Message) -> Message:
        """What clients receive from the aggregator's state besides the global tensors (FedBPT: sigma, C)."""
        ...

    def restrict(self, state: Message, keep: set[str]) -> Message: ...

    def diagnostics(self, state: Message) -> dict[str, float]: ...


@dataclass(frozen=True)
class AggregatorContext:
    """What an aggregator may know about the federation when it is built."""

    num_clients: int
    seed: int
    trainer: Any = None    # the local trainer's settings (e.g. its lr for control variates, CMA-ES lambda)
    adapter: Any = None    # the adapter's settings (e.g. the projected prompt's sigma_0)
    head_slices: dict = field(default_factory=dict)  # the adapter's head-assignable slices (head pruning)
    sampling_rate: float = 1.0  # q of the client selection, for privacy accounting (``privacy.sampling_rate``)


class AggregatorBase:
    """Defaults: stateless, parameter updates only, nothing broadcast."""

    accepts: ClassVar[frozenset[str]] = frozenset({PARAMS})
    needs: ClassVar[frozenset[str]] = frozenset()
    # computable from the weighted mean of the updates alone (what secure aggregation reveals)
    secure_sum: ClassVar[bool] = False
    uniform_weights: ClassVar[bool] = False  # weighs every client alike (secure aggregation masks weight 1)
    reads_products: ClassVar[bool] = False  # reads each client's LoRA product B_k A_k (both factors in every reply)

    def __init__(self, settings: Any, ctx: AggregatorContext) -> None:
        self.settings, self.ctx = settings, ctx

    @classmethod
    def secure_sum_with(cls, settings: Any) -> bool:
        """Whether, with these settings, it needs no individual update (then it runs under secure aggregation)."""
        return cls.secure_sum

    @classmethod
    def check_federation(cls, settings: Any, num_clients: int) -> None:
        """Raise a ``ValueError`` naming the field when these settings cannot work with ``num_clients`` clients
        (called by the config check, before anything loads)."""

    def init(self, glob: Params) -> Message:
        return Message()

    def broadcast(self, state: Message) -> Message:
        return Message()

    def restrict(self, state: Message, keep: set[str]) -> Message:
        tensors = {k: v for k, v in state.tensors.items() if SEP not in k or k.split(SEP, 1)[1] in keep}
        return Message(tensors, dict(state.scalars))

    def diagnostics(self, state: Message) -> dict[str, float]:
        return {k: v for k, v in state.scalars.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


AGGREGATORS: Registry[type] = Registry("aggregator")  # classes built as cls(settings, AggregatorContext)


# ---------------------------------------------------------------- helpers over named tensors (float64 math)


def slot(state: Message, name: str, like: Params) -> Params:
    """The ``name::<tensor>`` slot of a state as float64 tensors, zeros where absent."""
    return {k: state.tensors[f"{name}{SEP}{k}"].double() if f"{name}{SEP}{k}" in state.tensors
            else torch.zeros_like(v, dtype=torch.float64) for k, v in like.items()}


def slot_tensors(name: str, values: Params) -> Params:
    """``values`` named as the ``name`` slot of a state (float32)."""
    return {f"{name}{SEP}{k}": v.float() for k, v in values.items()}


CLIENTS = "clients"  # Update scalar: how many clients an update stands for (secure aggregation's mean), else 1


def clients_in(updates: Sequence[Update]) -> int:
    """The number of clients behind ``updates`` (an update of secure aggregation's mean stands for all of them)."""
    return sum(int(u.scalars.get(CLIENTS, 1)) for u in updates)


def weights_of(updates: Sequence[Update]) -> list[float]:
    return [float(u.weight) for u in updates]


def uploaded(glob: Params, updates: Sequence[Update]) -> list[str]:
    """The global tensors the updates carry, sorted: one that is sent but never uploaded (Fed-SB's fixed factors,
    FedEx-LoRA's residual) has no delta."""
    return sorted(k for k in glob if any(k in u.tensors for u in updates))


def deltas(glob: Params, updates: Sequence[Update]) -> list[Params]:
    """Δ_k = w_k − w (float64), one per update, of the tensors it uploaded."""
    return [{k: u.tensors[k].double() - glob[k].double() for k in glob if k in u.tensors} for u in updates]


def flatten(p: Params, keys: Sequence[str]) -> torch.Tensor:
    return torch.cat([p[k].double().reshape(-1) for k in keys]) if keys else torch.zeros(0, dtype=torch.float64)


def unflatten(vec: torch.Tensor, like: Params, keys: Sequence[str]) -> Params:
    out, off = {}, 0
    for k in keys:
        n = like[k].numel()
        out[k] = vec[off: off + n].view(like[k].shape)
        off += n
    return out


def to_float32(p: Params) -> Params:
    return {k: v.float() for k, v in p.items()}


class AggregatorWrapper(AggregatorBase):
    """A server-side wrapper around any aggregator (norm clipping, robust filters, central DP): it sees the
    updates first and delegates everything else to ``inner``. Built as ``cls(settings, ctx, inner)``;
    ``inner_aggregators`` names the aggregators it may wrap (None: any), checked when the config is loaded.
    The scalars it keeps in the state (``own_scalars``, e.g. how many clients it clipped this round) are hidden
    from the inner aggregator and reported by ``diagnostics``."""

    inner_aggregators: ClassVar[frozenset[str] | None] = None
    own_scalars: ClassVar[tuple[str, ...]] = ()

    def __init__(self, settings: Any, ctx: AggregatorContext, inner: Aggregator) -> None:
        super().__init__(settings, ctx)
        self.inner = inner
        self.accepts = inner.accepts & type(self).accepts  # type: ignore[misc]
        self.needs = inner.needs | type(self).needs  # type: ignore[misc]
        self.uniform_weights = inner.uniform_weights  # type: ignore[misc]

    def init(self, glob: Params) -> Message:
        return self.inner.init(glob)

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        new_glob, new_state = self.inner.aggregate(glob, self.transform(glob, updates, round),
                                                   self.inner_state(state), round)
        return new_glob, self.with_own(new_state, self.round_scalars())

    def transform(self, glob: Params, updates: Sequence[Update], round: int) -> list[Update]:
        return list(updates)

    def round_scalars(self) -> dict[str, Any]:
        """This wrapper's own scalars after the last ``transform`` (kept in the state)."""
        return {}

    def inner_state(self, state: Message) -> Message:
        """``state`` as the inner aggregator knows it: without this wrapper's own scalars."""
        return Message(state.tensors, {k: v for k, v in state.scalars.items() if k not in self.own_scalars})

    def own(self, state: Message) -> dict[str, Any]:
        return {k: v for k, v in state.scalars.items() if k in self.own_scalars}

    @staticmethod
    def with_own(state: Message, scalars: dict[str, Any]) -> Message:
        return Message(state.tensors, dict(state.scalars) | scalars)

    def broadcast(self, state: Message) -> Message:
        return self.inner.broadcast(self.inner_state(state))

    def restrict(self, state: Message, keep: set[str]) -> Message:
        return self.with_own(self.inner.restrict(self.inner_state(state), keep), self.own(state))

    def diagnostics(self, state: Message) -> dict[str, float]:
        return dict(self.inner.diagnostics(self.inner_state(state))) | self.own(state)


WRAPPERS: Registry[type] = Registry("aggregation wrapper")  # classes built as cls(settings, ctx, inner)
