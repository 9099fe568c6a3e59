"""The one generic method: the pure contract of ``methods.base.Method`` over the four axes.

- adapter (through the shared ``Classifier``): the initial tensors and how they enter the frozen model;
- local trainer: how a client trains (``trainers``), and the format its update travels in (``formats``);
- aggregator with its own state, wrapped by server-side wrappers (``aggregators``);
- selector: which clients train (``selection``); the sharing policy: which tensors are exchanged
  (``sharing``); client-side update transforms (``transforms``).

Two more components act around the exchange: its outermost stage, the transport (``exchange.transport`` over the
download codec ``downlink``: how the global tensors travel to the clients, e.g. as a compressed residual), and
``post_tuning`` (after the last round, each evaluated client adapts the global tensors on a few shots of its own data
before it is scored).

The server and client state layouts are in ``methods.state``; how tensors are scored is ``methods.evaluation``, and
what the method reads of the run is ``methods.assembly.RunFacts`` (it never reads the config).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fedpeft.aggregators.base import CLIENTS
from fedpeft.attacks.local_asr import local_asr
from fedpeft.clients import ClientContext, sub_state, with_sub_state
from fedpeft.comm.codec import WIRE_DTYPES, Message, decode, encode
from fedpeft.comm.update import WEIGHT, Params, ReplySchema, Update, pack, unpack
from fedpeft.exchange.aggregation_error import aggregation_error
from fedpeft.lazy import lazy
from fedpeft.methods.assembly import Components, RunFacts
from fedpeft.methods.evaluation import Evaluation
from fedpeft.methods.state import DOWN, OPT, POST_TUNE, PRIVATE, ServerState
from fedpeft.rng import SERVER, numpy_rng, torch_rng
from fedpeft.sharing.base import ClientPlan
from fedpeft.formats.base import floats

torch = lazy("torch")


def _numeric(d: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class ComposedMethod:
    """A method built from the components a resolved ``method`` config section names."""

    def __init__(self, name: str, facts: RunFacts, experiment: Any, parts: Components) -> None:
        self.name, self.facts, self.exp = name, facts, experiment
        self.clf = experiment.objective
        self.seed = facts.seed
        self.non_participants = frozenset(getattr(experiment, "non_participants", ()))
        self.aggregator, self.trainer, self.selector = parts.aggregator, parts.trainer, parts.selector
        self.sharing, self.transforms, self.transport = parts.sharing, parts.transforms, parts.transport
        self.attacker_transforms = parts.attacker_transforms
        self.post_tuning, self.wire = parts.post_tuning, parts.wire
        self.format = parts.update_format
        self.initial_params, self.embedding_table = parts.initial_params, parts.embedding_table
        self.evaluation = Evaluation(self.trainer, experiment, facts.evaluation, facts.seed, facts.rounds)

    # ------------------------------------------------------------------ server

    def server_init(self) -> Message:
        glob = self.initial_params()
        return ServerState(0, glob, self.aggregator.init(glob), self.sharing.init(glob)).to_message()

    def _shared(self, st: ServerState, round: int) -> Params:
        return {k: st.glob[k] for k in self.sharing.shared(st.glob, st.sharing, round)}

    def configure_round(self, state: Message, round: int, clients: list[int]) -> dict[int, Message]:
        """Select among the participants (non-participants never train) and build each one's instruction."""
        st = ServerState.from_message(state)
        eligible = sorted(c for c in clients if c not in self.non_participants)
        selected = self.selector.select(eligible, round, st.history, numpy_rng(self.seed, round, SERVER, "select"))
        msg = self.format.send(self._shared(st, round), self.aggregator.broadcast(st.agg))
        msg.scalars = {"round": round, **msg.scalars, **self.sharing.instruction_scalars(st.sharing, round)}
        return {c: self._encode_down(self._for_client(msg, st, c), st, c, round - 1) for c in selected}

    def _for_client(self, msg: Message, st: ServerState, client: int) -> Message:
        """``msg`` with the shared tensors as the sharing policy sends them to ``client`` (e.g. at its LoRA rank)."""
        if not self.sharing.per_client:
            return msg
        return Message(self.sharing.for_client(dict(msg.tensors), client, st.sharing), dict(msg.scalars))

    def _encode_down(self, msg: Message, st: ServerState, client: int, upto: int) -> Message:
        """``msg`` as it travels to this client (``exchange.transport``)."""
        first = int(st.history.get(client, {}).get("round", 1))
        return self.transport.send(msg, st.glob, st.down, first, upto)

    def _decode_down(self, instruction: Message, client: ClientContext) -> Message:
        """Client side: the instruction with the global tensors as the transport rebuilds them."""
        instruction, held = self.transport.receive(instruction, sub_state(client.state, DOWN))
        if held is not None:
            client.state = with_sub_state(client.state, DOWN, held)
        return instruction

    def reply_schema(self, state: Message) -> ReplySchema:
        st = ServerState.from_message(state)
        round = st.round + 1
        shapes = {k: tuple(v.shape) for k, v in self._shared(st, round).items()}
        reply = self.format.reply(shapes)
        report, report_scalars = self.sharing.report_schema(st.sharing, round)
        return ReplySchema(self.sharing.wire_shapes(reply.update) | reply.aux | report, WIRE_DTYPES[self.wire.default],
                           (WEIGHT, *self.trainer.scalars, *report_scalars), frozenset(reply.update),
                           dtypes=dict(self.sharing.dtypes) | reply.dtypes,
                           check=lambda reply, client: self._check(reply, client, st.sharing))

    def _check(self, reply: Message, client: int, sharing: Message) -> None:
        self.sharing.check(reply, client, sharing)
        self.format.check(reply)

    def aggregate(self, state: Message, round: int, replies: dict[int, Message]) -> Message:
        st = ServerState.from_message(state)
        schema = self.reply_schema(state)
        shared = self._shared(st, round)
        updates = [self.format.decode(self.sharing.expand(unpack(replies[c], schema, c), shared), shared)
                   for c in sorted(replies)]
        return self._apply(st, round, shared, updates, {u.client: u.scalars for u in updates})

    def aggregate_mean(self, state: Message, round: int, mean: Params, weight: int,
                       scalars: dict[int, dict[str, Any]], schema: ReplySchema) -> Message:
        """The round's new state from the sample-weighted mean of the replies' tensors alone (secure aggregation:
        the server never sees one client's), given to the aggregator and the sharing policy as one update of the
        total weight (its reported tensors, e.g. layer scores, are their weighted mean too); each client's clear
        scalars (its training loss) still enter the history."""
        st = ServerState.from_message(state)
        shared = self._shared(st, round)
        upd = {k: v.float() for k, v in mean.items() if schema.is_update(k)}
        aux = {k: v.float() for k, v in mean.items() if not schema.is_update(k)}
        update = self.format.decode(Update(-1, upd, weight, aux, scalars={CLIENTS: len(scalars)}), shared)
        return self._apply(st, round, shared, [update], scalars)

    def _apply(self, st: ServerState, round: int, shared: Params, updates: list[Update],
               scalars: dict[int, dict[str, Any]]) -> Message:
        new, agg = self.aggregator.aggregate(shared, updates, st.agg, round)
        glob = st.glob | new
        glob |= self.sharing.fold(glob, st.glob, updates, self._weights(updates))
        sharing, keep = self.sharing.after_aggregate(glob, updates, st.sharing, round)
        if keep is not None:
            agg = self.aggregator.restrict(agg, keep)
        history = dict(st.history)
        for client, s in scalars.items():
            history[client] = {"round": round, **_numeric({"loss": s.get("train_loss")})}
        glob, down = self.transport.after_round(glob, st.glob, agg, st.down, round)  # the p' clients rebuild
        measures = self._measures(st.glob, glob, updates, shared)
        return ServerState(round, glob, agg, sharing, history, down, measures).to_message()

    def _weights(self, updates: list[Update]) -> list[float]:
        """The aggregator's weight of each reply: its example count, or 1 where the rule weighs clients alike."""
        return [1.0 if self.aggregator.uniform_weights else float(u.weight) for u in updates]

    def _measures(self, before: Params, after: Params, updates: list[Update], shared: Params) -> dict[str, float]:
        """The LoRA aggregation error of this round's broadcast (``exchange.aggregation_error``) against the exact
        average under the aggregator's weights, over the modules whose factors no client keeps to itself (a tensor
        it keeps that the round also sent, Fed-SB's fixed B and A, is the common one); nothing under secure
        aggregation (one summed update, no client's)."""
        if not updates or any(u.client < 0 for u in updates):
            return {}
        personal = frozenset(self.sharing.private_state(before)) - set(shared)
        error = aggregation_error(before, after, [u.tensors for u in updates], self._weights(updates),
                                  fresh=not self.sharing.deltas, skip=personal)
        return {} if error is None else {"aggregation_error": error}

    def evaluate_global(self, state: Message) -> dict[str, Any]:
        """Test accuracy, loss, macro-F1 and confusion matrix of the global tensors (and the attack success rate
        when it is measured); on a generation task the loss and perplexity per response token, per natural client,
        and in the generating rounds (``evaluation.generate_every``) what the model writes; the scores of
        ``evaluation.round_suites``."""
        st, ev = ServerState.from_message(state), self.evaluation
        return (ev.on(st.glob, self.exp.test_encoded) | ev.asr(st.glob) | ev.generation(st.glob, st.round)
                | ev.suites(st.glob))

    def evaluate_on(self, state: Message, data: Any) -> dict[str, Any]:
        """The global tensors' accuracy, loss, macro-F1 and confusion matrix on labelled encoded ``data``."""
        return self.evaluation.on(ServerState.from_message(state).glob, data)

    def evaluate_once(self, state: Message, round: int,
                      clients: list[int]) -> tuple[dict[str, float], dict[int, dict[str, float]]] | None:
        """``evaluate_global`` and the metrics of each client's ``client_evaluate`` from ONE pass over the test set
        (each client's test shard is a subset of it), or None where a client would score other tensors than the
        global ones or the trainer cannot slice its predictions (``LocalTrainer.evaluate_parts``: the global metrics
        are bit-identical, a client's equal up to the batch-dependence of float rounding it describes)."""
        st = ServerState.from_message(state)
        if not self._scores_global(st, round):
            return None
        parts = self.trainer.evaluate_parts(st.glob, self.exp.test_encoded, [self.exp.test_parts[c] for c in clients])
        if parts is None:
            return None
        whole, local = parts
        ev = self.evaluation
        return (ev.with_classes(whole, self.exp.test_encoded) | ev.asr(st.glob) | ev.generation(st.glob, st.round)
                | ev.suites(st.glob), dict(zip(clients, local)))

    def _scores_global(self, st: ServerState, round: int) -> bool:
        """Whether every client's evaluation after ``round`` scores exactly the global tensors: no post-tuning now,
        no download codec rebuilding them from its own messages, no tensor the sharing policy keeps on the clients
        that the evaluation does not overwrite (FedPepTAO's layers after the selection; not during warm-up), and
        nothing the wire changes (a float16 wire rounds them), and the same tensors for every client."""
        if self._post_tunes(round) or self.transport.rebuilds or self.sharing.per_client:
            return False
        received = self.format.start(decode(encode(self.format.send(self._shared(st, round + 1), None), self.wire)))
        if set(self.sharing.private_state(st.glob)) - set(received):
            return False
        view, glob = floats(self.sharing.client_params(received, {})), floats(st.glob)
        return view.keys() == glob.keys() and all(torch.equal(view[k], glob[k]) for k in glob)

    def global_view(self, state: Message) -> Params:
        """The global model's tensors: the adapter's (and a linear head's), and what the exchange folds into them
        (FedEx-LoRA's residual)."""
        return dict(ServerState.from_message(state).glob)

    def client_view(self, state: Message, client_state: Message, client: int) -> Params:
        """Client ``client``'s personalised tensors after the last round: what it would be sent for evaluation, as
        it sees it, with the tensors it keeps to itself (``client_state``)."""
        st = ServerState.from_message(state)
        sent = self._for_client(self.format.send(self._shared(st, st.round + 1), None), st, client)
        return self.sharing.client_params(self.format.start(sent), sub_state(client_state, PRIVATE))

    def _post_tunes(self, round: int) -> bool:
        """Clients adapt the global tensors before they are scored (after the last round, with post-tuning)."""
        return round == self.facts.rounds and self.post_tuning.active

    def untrained_global(self, state: Message) -> list[str]:
        """The global tensors that the sharing policy keeps on the clients (``private_state``, less what it shares
        now) and whose server copy still equals the seeded initial value: never trained on the server (all of them
        for local-only; FedSA-LoRA's B and task head; FedPepTAO's layers are trained in its shared warm-up)."""
        st = ServerState.from_message(state)
        init = self.initial_params()
        glob = {k: v for k, v in st.glob.items() if k in init}
        personal = set(self.sharing.private_state(glob)) - set(self.sharing.shared(st.glob, st.sharing, st.round + 1))
        return sorted(k for k in personal if glob[k].is_floating_point()
                      and torch.equal(glob[k], init[k].to(device=glob[k].device, dtype=glob[k].dtype)))

    def trainable_params(self, state: Message) -> int:
        """Floating tensors the adapter trains (token ids of demonstrations are not parameters)."""
        return sum(v.numel() for v in self.initial_params().values() if v.is_floating_point())

    def diagnostics(self, state: Message) -> dict[str, float]:
        """Numeric scalars of the new global state (e.g. FedBPT's sigma, sigma'; FedPepTAO's ratio)."""
        st = ServerState.from_message(state)
        out = (self.aggregator.diagnostics(st.agg) | self.sharing.diagnostics(st.sharing)
               | self.trainer.diagnostics(st.glob) | st.measures)
        for _, t in self.transforms:  # e.g. the LDP epsilon spent so far
            out |= t.diagnostics(st.round, st.glob)
        return out

    def reply_record(self, reply: Message) -> dict[str, Any]:
        return self.sharing.record(reply)

    def vectors(self, state: Message) -> dict[str, list[float]]:
        """Per-round vectors of the new global state (head importances, FedPepTAO's layer scores/selection)."""
        return self.sharing.vectors(ServerState.from_message(state).sharing)

    # ------------------------------------------------------------------ client

    def client_update(self, instruction: Message, client: ClientContext) -> Message:
        round = int(instruction.scalars["round"])
        received = self.format.start(self._decode_down(instruction, client))
        start = self.sharing.client_params(received, sub_state(client.state, PRIVATE))
        plan = self.sharing.plan(start, instruction, client, round) or ClientPlan()
        begin = start if plan.params is None else plan.params
        result, trainer_state = self.trainer.fit(begin, instruction, client, round, sub_state(client.state, OPT),
                                                 frozen=plan.frozen, static=plan.static, penalty=plan.penalty)
        update = self.format.upload(result, received)
        trained = update.tensors
        private = set(start) - set(received)  # kept on the device, never uploaded
        update = update.with_tensors({k: v for k, v in trained.items() if k not in private})
        update = self.sharing.finish(update, start, trained, instruction, client, round, plan)
        attacks = self.attacker_transforms if client.malicious else []
        if self.transforms or attacks:  # they take the delta from the uploaded tensors' start, cut as they were
            base = self.sharing.upload_start(begin, update, plan)
        for i, (name, t) in enumerate(self.transforms):
            update = t.apply(update, base, round, torch_rng(client.seed, round, client.client_id,
                                                            f"transform:{i}:{name}"))
        for i, (name, t) in enumerate(attacks):
            update = t.apply(update, base, round, torch_rng(client.seed, round, client.client_id,
                                                            f"attack:{i}:{name}"))
        update = replace(update, scalars=update.scalars | local_asr(self.trainer, start, result.tensors, client))
        state = with_sub_state(client.state, PRIVATE, self.sharing.private_state(trained))
        client.state = with_sub_state(state, OPT, trainer_state)
        return pack(update)

    # ------------------------------------------------------------------ federated evaluation

    def configure_evaluate(self, state: Message, round: int, clients: list[int]) -> dict[int, Message]:
        """After the last round, clients post-tune (when the method has post-tuning) before they are scored."""
        st = ServerState.from_message(state)
        msg = self.format.send(self._shared(st, round + 1), None)
        msg.scalars = {"round": round, **msg.scalars, **({POST_TUNE: True} if self._post_tunes(round) else {})}
        return {c: self._encode_down(self._for_client(msg, st, c), st, c, round) for c in clients}

    def client_evaluate(self, instruction: Message, client: ClientContext) -> Message:
        """Personalised where the sharing policy keeps private tensors (FedPepTAO) or by post-tuning on a few
        shots of the client's data (then ``accuracy`` is after and ``accuracy_global`` before it)."""
        instruction = self._decode_down(instruction, client)
        params = self.sharing.client_params(self.format.start(instruction), sub_state(client.state, PRIVATE))
        if not instruction.scalars.get(POST_TUNE):
            metrics = self.trainer.evaluate(params, client.test)
            round = int(instruction.scalars["round"])
            return Message(scalars=metrics | self.evaluation.client_generation(params, client.client_id, round))
        before = self.trainer.evaluate(params, client.test)
        rng = numpy_rng(client.seed, int(instruction.scalars["round"]), client.client_id, "post-tuning")
        tuned, report = self.post_tuning.tune(params, client.train, rng)
        after = self.trainer.evaluate(tuned, client.test) if tuned is not params else before
        return Message(scalars=after | report | {"accuracy_global": before.get("accuracy"),
                                                 "loss_global": before.get("loss")})
