"""One round under SecAgg+ (Bell et al., CCS 2020), run by Flower's own implementation in every runtime.

The server side is Flower's ``SecAggPlusWorkflow`` (setup, share keys, collect masked vectors, unmask) and each client
is wrapped by Flower's ``secaggplus_mod``; fedpeft supplies what they call: a legacy ``Strategy`` whose
``configure_fit`` hands out the round's encoded instructions and whose ``aggregate_fit`` receives the unmasked
weighted mean (``RoundStrategy``), and the train handler behind the mod, which runs ``client_update`` and returns
its update tensors as the ``FitRes`` parameters the mod quantizes, masks and uploads (``masked_train``). The clear
part of a reply is its scalars (the example count, the training loss, steps): the tensors never leave a client
unmasked. The workflow's randomness that changes results is seeded from (seed, round, client): the stochastic
rounding of the quantization (``numpy``'s global generator, which Flower's ``quantize`` draws from) and the
neighbour graph (``random.shuffle``); keys and mask seeds stay random, their masks cancel exactly.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedpeft.comm.codec import decode
from fedpeft.config import SecureAggregationConfig
from fedpeft.rng import SERVER, numpy_rng

CONFIG_KEY = "fedpeft.instruction"   # the FitIns config entry carrying a client's encoded instruction
NAMES_KEY = "fedpeft.tensors"        # the FitRes metric naming the update tensors, in parameter order


@contextlib.contextmanager
def seeded(seed: int, round: int, client: int, purpose: str) -> Iterator[None]:
    """numpy's and Python's global generators seeded from (seed, round, client, purpose) inside, restored after
    (Flower's quantization and neighbour shuffle draw from them)."""
    np_state, py_state = np.random.get_state(), random.getstate()
    derived = int(numpy_rng(seed, round, client, purpose).integers(2**32 - 1))
    np.random.seed(derived)
    random.seed(derived)
    try:
        yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


def workflow(cfg: SecureAggregationConfig):
    """Flower's SecAgg+ server workflow with this config's settings."""
    from flwr.server.workflow import SecAggPlusWorkflow

    return SecAggPlusWorkflow(cfg.num_shares, cfg.reconstruction_threshold, max_weight=cfg.max_weight,
                              clipping_range=cfg.clipping_range, quantization_range=cfg.quantization_range,
                              modulus_range=cfg.modulus_range, timeout=cfg.timeout)


@dataclass
class SecureOutcome:
    """What the server learns from one secure round: the weighted mean of the survivors' update tensors (None when
    the protocol halted), their total weight, and each survivor's clear scalars."""

    mean: dict[str, np.ndarray] | None = None
    weight: float = 0.0
    scalars: dict[int, dict[str, Any]] = field(default_factory=dict)
    failures: int = 0
    bytes_down: dict[int, int] = field(default_factory=dict)  # per client: every stage's messages, as sent
    bytes_up: dict[int, int] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)      # per client that gave no reply at some stage: why


def strategy_class():
    """A legacy Flower ``Strategy`` over one fedpeft round (built lazily: Flower loads only when it is used)."""
    from flwr.common import FitIns, Parameters
    from flwr.server.client_proxy import ClientProxy
    from flwr.server.strategy import Strategy

    class NodeProxy(ClientProxy):
        """The workflow only reads ``node_id`` from a proxy; no call goes through it."""

        def __init__(self, node_id: int) -> None:
            super().__init__(str(node_id))
            self.node_id = node_id

        def get_properties(self, *a, **k):  # pragma: no cover - never called by the workflow
            raise NotImplementedError

        get_parameters = fit = evaluate = reconnect = get_properties

    class RoundStrategy(Strategy):
        def __init__(self, instructions: dict[int, bytes], node_of: Callable[[int], int]) -> None:
            self.instructions, self.node_of = instructions, node_of
            self.client_of = {node_of(c): c for c in instructions}
            self.outcome = SecureOutcome()

        def initialize_parameters(self, client_manager):
            return None

        def configure_fit(self, server_round, parameters, client_manager):
            empty = Parameters([], "")
            return [(NodeProxy(self.node_of(c)), FitIns(empty, {CONFIG_KEY: payload}))
                    for c, payload in self.instructions.items()]

        def aggregate_fit(self, server_round, results, failures):
            from flwr.common import parameters_to_ndarrays

            names = None
            for proxy, res in results:
                metrics = dict(res.metrics)
                names = str(metrics.pop(NAMES_KEY, ""))
                self.outcome.scalars[self.client_of[proxy.node_id]] = metrics | {"num_examples": res.num_examples}
                self.outcome.weight += float(res.num_examples)
            if results:  # every result carries the same unmasked mean (the workflow's backward compatibility)
                arrays = parameters_to_ndarrays(results[0][1].parameters)
                self.outcome.mean = dict(zip(names.split(",") if names else [], arrays, strict=True))
            self.outcome.failures = len(failures)
            return None, {}

        def configure_evaluate(self, server_round, parameters, client_manager):
            return []

        def aggregate_evaluate(self, server_round, results, failures):
            return None, {}

        def evaluate(self, server_round, parameters):
            return None

    return RoundStrategy


def masked_train(train: Callable[[bytes], bytes]) -> Callable[[Any, Any], Any]:
    """The handler behind ``secaggplus_mod`` in the collect-masked-vectors stage: ``train`` (instruction bytes ->
    encoded reply) runs fedpeft's client step; its update tensors become the ``FitRes`` parameters (float32, sorted by
    name, the names in a metric) and its numeric scalars the metrics; ``num_examples`` is the weight the mod applies."""
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import Message
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    def call_next(msg, ctxt):
        fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
        reply = decode(train(bytes(fitins.config[CONFIG_KEY])))
        names = sorted(reply.tensors)
        arrays = [reply.tensors[k].float().numpy() for k in names]
        metrics = {k: v for k, v in reply.scalars.items()
                   if k != "num_examples" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), int(reply.scalars["num_examples"]),
                     metrics | {NAMES_KEY: ",".join(names)})
        return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)

    return call_next


def client_handler(train: Callable[[bytes], bytes], seed: int, round: int, client: int) -> Callable[[Any], Any]:
    """One client's side of a round: Flower's ``secaggplus_mod`` (its state kept across the four stages in the
    client's Flower context) around ``masked_train``, the quantization's rounding seeded by (seed, round, client)."""
    from flwr.app import Context, RecordDict
    from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod

    context = Context(run_id=0, node_id=node_id(client), node_config={}, state=RecordDict(), run_config={})
    call_next = masked_train(train)

    def handle(msg):
        with seeded(seed, round, client, "secagg-quantize"):
            return secaggplus_mod(msg, context, call_next)

    return handle


def node_id(client: int) -> int:
    """The Flower node id a client stands as in the embedded runtime (ids from 1: 0 is no node)."""
    return client + 1


def secure_round(cfg: SecureAggregationConfig, seed: int, round: int, instructions: dict[int, bytes], grid: Any,
                 node_of: Callable[[int], int] = node_id) -> SecureOutcome:
    """Run Flower's SecAgg+ workflow for one round over ``grid`` (the clients' encoded instructions handed out by
    ``configure_fit``); the outcome has no mean when the protocol halted (too few survivors for the threshold)."""
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.common import Parameters
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    strategy = strategy_class()(instructions, node_of)
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            strategy=strategy)
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: round})
    context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(Parameters([], ""), True)
    with seeded(seed, round, SERVER, "secagg-neighbours"):
        workflow(cfg)(grid, context)
    return strategy.outcome
