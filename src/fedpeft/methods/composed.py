"""The one generic method: the pure contract of ``methods.base.Method`` over the four axes.

- adapter (through the shared ``Classifier``): the initial tensors and how they enter the frozen model;
- local trainer: the exchange format of its update and how a client trains (``trainers``);
- aggregator with its own state, wrapped by server-side wrappers (``aggregators``);
- selector: which clients train (``selection``); the sharing policy: which tensors are exchanged
  (``sharing``); client-side update transforms (``transforms``).

Server state (a ``Message``): the global tensors under their own names, the aggregator's state under
``agg/``, the sharing policy's under ``share/``; scalars ``round``, ``agg``, ``sharing`` and ``history``
(per client: the last round it replied and its training loss, read by selectors). Client state: the
trainer's under ``opt/``, the sharing policy's private tensors under ``u/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedpeft.adapters import ADAPTERS
from fedpeft.aggregators import AGGREGATORS, WRAPPERS, AggregatorContext
from fedpeft.clients import ClientContext, sub_state, with_sub_state
from fedpeft.comm.codec import WIRE_DTYPES, Message, WireSpec
from fedpeft.comm.update import WEIGHT, Params, ReplySchema, pack, unpack
from fedpeft.config import ExperimentConfig
from fedpeft.rng import SERVER, numpy_rng, torch_rng
from fedpeft.selection import SELECTORS, SelectorContext
from fedpeft.sharing import SHARING, SharingContext
from fedpeft.trainers import TRAINERS, TrainerContext
from fedpeft.transforms import TRANSFORMS

AGG, SHARE = "agg/", "share/"          # server-state prefixes
OPT, PRIVATE = "opt/", "u/"            # client-state prefixes


def _prefixed(prefix: str, tensors: Params) -> Params:
    return {prefix + k: v for k, v in tensors.items()}


def _numeric(d: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@dataclass
class ServerState:
    round: int
    glob: Params
    agg: Message
    sharing: Message
    history: dict[int, dict[str, float]] = field(default_factory=dict)

    def to_message(self) -> Message:
        tensors = dict(self.glob) | _prefixed(AGG, self.agg.tensors) | _prefixed(SHARE, self.sharing.tensors)
        return Message(tensors, {"round": self.round, "agg": self.agg.scalars, "sharing": self.sharing.scalars,
                                 "history": {str(c): h for c, h in sorted(self.history.items())}})

    @classmethod
    def from_message(cls, msg: Message) -> ServerState:
        glob = {k: v for k, v in msg.tensors.items() if not k.startswith((AGG, SHARE))}
        s = msg.scalars
        return cls(int(s["round"]), glob, Message(sub_state(msg, AGG), dict(s.get("agg", {}))),
                   Message(sub_state(msg, SHARE), dict(s.get("sharing", {}))),
                   {int(c): dict(h) for c, h in s.get("history", {}).items()})


class ComposedMethod:
    """A method built from the components a resolved ``method`` config section names."""

    def __init__(self, name: str, cfg: ExperimentConfig, experiment: Any) -> None:
        m = cfg.method
        self.name, self.cfg, self.exp = name, cfg, experiment
        self.clf = experiment.classifier
        self.wire = WireSpec(m.codec.dtype)
        self.seed = cfg.seed
        self._init: Params | None = None
        adapter = ADAPTERS.settings_of(m.adapter)
        trainer_settings = TRAINERS.settings_of(m.trainer)
        head_slices = self.clf.adapter.head_slices(self.clf.backbone)
        agg_ctx = AggregatorContext(cfg.federation.num_clients, cfg.seed, trainer_settings, adapter, head_slices)
        self.aggregator = AGGREGATORS.get(m.aggregator.name)(AGGREGATORS.settings_of(m.aggregator), agg_ctx)
        for w in m.wrappers:
            self.aggregator = WRAPPERS.get(w.name)(WRAPPERS.settings_of(w), agg_ctx, self.aggregator)
        self.trainer = TRAINERS.get(m.trainer.name)(trainer_settings, TrainerContext(
            self.clf, experiment, adapter, self.aggregator.needs, cfg.evaluation.batch_size))
        self.selector = SELECTORS.get(m.selector.name)(SELECTORS.settings_of(m.selector), SelectorContext(
            cfg.federation.num_clients, cfg.federation.clients_per_round))
        self.sharing = SHARING.get(m.sharing.name)(SHARING.settings_of(m.sharing), SharingContext(
            self.clf, cfg.seed, self.initial_params, head_slices, trainer_settings))
        self.transforms = [(t.name, TRANSFORMS.get(t.name)(TRANSFORMS.settings_of(t))) for t in m.transforms]

    def initial_params(self) -> Params:
        """The adapter's initial tensors from the experiment seed (identical on the server and every client)."""
        if self._init is None:
            self._init = self.clf.init_params(torch_rng(self.seed, 0, SERVER, "adapter-init"))
        return {k: v.clone() for k, v in self._init.items()}

    # ------------------------------------------------------------------ server

    def server_init(self) -> Message:
        glob = self.initial_params()
        return ServerState(0, glob, self.aggregator.init(glob), self.sharing.init(glob)).to_message()

    def _shared(self, st: ServerState, round: int) -> Params:
        return {k: st.glob[k] for k in self.sharing.shared(st.glob, st.sharing, round)}

    def configure_round(self, state: Message, round: int, clients: list[int]) -> dict[int, Message]:
        st = ServerState.from_message(state)
        selected = self.selector.select(sorted(clients), round, st.history,
                                        numpy_rng(self.seed, round, SERVER, "select"))
        msg = self.trainer.downlink(self._shared(st, round), self.aggregator.broadcast(st.agg))
        msg.scalars = {"round": round, **msg.scalars, **self.sharing.instruction_scalars(st.sharing, round)}
        return {c: msg for c in selected}

    def reply_schema(self, state: Message) -> ReplySchema:
        st = ServerState.from_message(state)
        round = st.round + 1
        shapes = {k: tuple(v.shape) for k, v in self._shared(st, round).items()}
        update, aux = self.trainer.update_shapes(shapes)
        report, report_scalars = self.sharing.report_schema(st.sharing, round)
        return ReplySchema(self.sharing.wire_shapes(update) | aux | report, WIRE_DTYPES[self.wire.default],
                           (WEIGHT, *self.trainer.scalars, *report_scalars), frozenset(update),
                           dtypes=dict(self.sharing.dtypes), check=self.sharing.check)

    def aggregate(self, state: Message, round: int, replies: dict[int, Message]) -> Message:
        st = ServerState.from_message(state)
        schema = self.reply_schema(state)
        shared = self._shared(st, round)
        updates = [self.sharing.expand(unpack(replies[c], schema, c), shared) for c in sorted(replies)]
        new, agg = self.aggregator.aggregate(shared, updates, st.agg, round)
        glob = st.glob | new
        sharing, keep = self.sharing.after_aggregate(glob, updates, st.sharing, round)
        if keep is not None:
            agg = self.aggregator.restrict(agg, keep)
        history = dict(st.history)
        for u in updates:
            history[u.client] = {"round": round, **_numeric({"loss": u.scalars.get("train_loss")})}
        return ServerState(round, glob, agg, sharing, history).to_message()

    def evaluate_global(self, state: Message) -> dict[str, float]:
        return self.trainer.evaluate(ServerState.from_message(state).glob, self.exp.test_encoded)

    def trainable_params(self, state: Message) -> int:
        """Floating tensors the adapter trains (token ids of demonstrations are not parameters)."""
        return sum(v.numel() for v in self.initial_params().values() if v.is_floating_point())

    def diagnostics(self, state: Message) -> dict[str, float]:
        """Numeric scalars of the new global state (e.g. FedBPT's sigma, sigma'; FedPepTAO's ratio)."""
        st = ServerState.from_message(state)
        return (self.aggregator.diagnostics(st.agg) | self.sharing.diagnostics(st.sharing)
                | self.trainer.diagnostics(st.glob))

    # ------------------------------------------------------------------ client

    def client_update(self, instruction: Message, client: ClientContext) -> Message:
        round = int(instruction.scalars["round"])
        received = self.trainer.params_of(instruction)
        start = self.sharing.client_params(received, sub_state(client.state, PRIVATE))
        plan = self.sharing.plan(start, instruction, client, round)
        plan = plan if isinstance(plan, dict) else {}  # "params": what to train, "frozen", "static" (see sharing)
        update, trainer_state = self.trainer.fit(plan.get("params", start), instruction, client, round,
                                                 sub_state(client.state, OPT), frozen=plan.get("frozen"),
                                                 static=plan.get("static"))
        trained = update.tensors
        private = set(start) - set(received)  # kept on the device, never uploaded
        update = update.with_tensors({k: v for k, v in trained.items() if k not in private})
        update = self.sharing.finish(update, start, trained, instruction, client, round, plan)
        for i, (name, t) in enumerate(self.transforms):
            update = t.apply(update, start, round, torch_rng(client.seed, round, client.client_id,
                                                             f"transform:{i}:{name}"))
        state = with_sub_state(client.state, PRIVATE, self.sharing.private_state(trained))
        client.state = with_sub_state(state, OPT, trainer_state)
        return pack(update)

    # ------------------------------------------------------------------ federated evaluation

    def configure_evaluate(self, state: Message, round: int, clients: list[int]) -> dict[int, Message]:
        st = ServerState.from_message(state)
        msg = self.trainer.eval_downlink(self._shared(st, round + 1))
        msg.scalars = {"round": round, **msg.scalars}
        return {c: msg for c in clients}

    def client_evaluate(self, instruction: Message, client: ClientContext) -> Message:
        """Personalised where the sharing policy keeps private tensors (FedPepTAO), global otherwise."""
        params = self.sharing.client_params(self.trainer.params_of(instruction), sub_state(client.state, PRIVATE))
        return Message(scalars=self.trainer.evaluate(params, client.test))
