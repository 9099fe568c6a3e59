"""One round under SecAgg+ (Bell et al., CCS 2020), run by Flower's own implementation in every runtime.

The server side is Flower's ``SecAggPlusWorkflow`` (setup, share keys, collect masked vectors, unmask), with the
dropped set Bell et al. define and misshapen masked vectors left out (``workflow_class``), and each node is wrapped
by Flower's ``secaggplus_mod`` behind the node's own checks (``secure_mod``: its policy, the masks' generator, the
unmask request's consistency; masks from ``runtime.secure.masks``); fedpeft supplies what they call: a legacy
``Strategy`` whose ``configure_fit`` hands each node the encoded instructions of its clients and whose ``aggregate_fit``
receives the unmasked weighted mean (``RoundStrategy``), and the train handler behind the mod, which runs
``client_update`` for the node's clients and returns their update tensors, averaged over the node's clients by example
count, as the ``FitRes`` parameters the mod quantizes, masks and uploads (``masked_train``). The parties are Flower
nodes: in the embedded runtime and in simulation one client each; a deployed SuperNode owning several clients masks
their sum together. The clear part of a reply is each client's scalars (the example count, the training loss, steps) and
the names of the tensors: the tensors never leave a node unmasked.

The workflow's randomness that changes results is seeded, the same in every runtime: the stochastic rounding of the
quantization (``numpy``'s global generator, which Flower's ``quantize`` draws from) by (seed, round, the node's first
client), read from the message itself; the neighbour graph (``random.shuffle``) by (seed, round). Keys and mask
seeds stay random: their masks cancel exactly.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedpeft.config import SecureAggregationConfig
from fedpeft.rng import SERVER, numpy_rng

log = logging.getLogger(__name__)

CLIENT = "fedpeft.client."     # FitIns config: "<prefix><client id>" -> that client's encoded instruction
SETTING = "fedpeft.setting."   # FitIns config: "<prefix><key>" -> the node's run settings (Flower runtimes)
NAMES_KEY = "fedpeft.tensors"  # FitRes metric: the update tensors' names, in parameter order
ERROR = "error"                # FitRes metric "<client id>.error": why that client of the node failed
CLIPPED = "fedpeft.clipped"    # masked tensor: 1 for a client whose upload exceeded the clipping range, else 0
RunNode = Callable[[dict[str, Any], dict[int, bytes]], tuple[dict[int, bytes], dict[int, str]]]


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


def workflow_class():
    """Flower's SecAgg+ server workflow, its dropped set as Bell et al. define it (built lazily)."""
    from flwr.server.workflow import SecAggPlusWorkflow

    class DropAwareSecAggPlus(SecAggPlusWorkflow):
        """Flower 1.41 unmasks as dropped every sampled node that sent no masked vector, those that dropped before
        they shared their keys included: their neighbours hold no share of their secrets and fail (``KeyError``),
        and the round halts. Bell et al.'s dropped set is the nodes that shared their keys but sent no masked
        vector (U2 \\ U3): a node gone before then put no mask into the sum, and no neighbour masked with it, so
        the unmask stage leaves it out, as a neighbour of anyone too."""

        def share_keys_stage(self, grid, context, state) -> bool:
            ok = super().share_keys_stage(grid, context, state)
            self.shared = set(state.active_node_ids)  # U2: the nodes whose shares went out
            return ok

        def collect_masked_vectors_stage(self, grid, context, state) -> bool:
            return super().collect_masked_vectors_stage(_SameShapes(grid), context, state)

        def unmask_stage(self, grid, context, state) -> bool:
            state.sampled_node_ids &= self.shared
            state.nid_to_neighbours = {n: nb & self.shared for n, nb in state.nid_to_neighbours.items()}
            return super().unmask_stage(grid, context, state)

    return DropAwareSecAggPlus


class _SameShapes:
    """The grid as the masked-vector stage sees it: a reply whose masked vector is not made of the arrays (shapes,
    integer dtype) most replies carry is left out, as a node that dropped (its masks are then removed through its
    neighbours' shares), and logged; Flower would add it with numpy's broadcasting, or fail the round."""

    def __init__(self, grid: Any) -> None:
        self.grid = grid

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        from collections import Counter

        from flwr.common import bytes_to_ndarray
        from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

        replies = self.grid.send_and_receive(messages, timeout=timeout)
        shapes = {}
        for m in replies:
            if m.has_error():
                continue
            try:
                arrays = [bytes_to_ndarray(b) for b in m.content.config_records[RECORD_KEY_CONFIGS][
                    Key.MASKED_PARAMETERS]]
                shapes[id(m)] = tuple((a.shape, "int" if a.dtype.kind in "iu" else str(a.dtype)) for a in arrays)
            except Exception as e:  # noqa: BLE001 - an unreadable vector: the node is left out
                shapes[id(m)] = (f"{type(e).__name__}: {e}",)
        if not shapes:
            return replies
        common = Counter(shapes.values()).most_common(1)[0][0]
        kept = []
        for m in replies:
            got = shapes.get(id(m))
            if got is not None and got != common:
                log.warning("node %d's masked vector %s is not the others' %s: left out as dropped",
                            m.metadata.src_node_id, got, common)
                continue
            kept.append(m)
        return kept


def workflow(cfg: SecureAggregationConfig):
    """The SecAgg+ server workflow (``workflow_class``) with this config's settings."""
    return workflow_class()(cfg.num_shares, cfg.reconstruction_threshold, max_weight=cfg.max_weight,
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
    halted: str | None = None  # why the protocol stopped without a mean (too few survivors, a malformed vector)
    clipped: float = 0.0  # share of the weight whose upload held a value beyond the clipping range (masked too)


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
        def __init__(self, groups: dict[int, dict[int, bytes]], settings: dict[str, Any]) -> None:
            self.groups, self.settings = groups, settings  # node id -> {client id: instruction}
            self.outcome = SecureOutcome()

        def initialize_parameters(self, client_manager):
            return None

        def configure_fit(self, server_round, parameters, client_manager):
            empty, common = Parameters([], ""), {SETTING + k: v for k, v in self.settings.items()}
            return [(NodeProxy(node), FitIns(empty, common | {CLIENT + str(c): p for c, p in payloads.items()}))
                    for node, payloads in sorted(self.groups.items())]

        def aggregate_fit(self, server_round, results, failures):
            from flwr.common import parameters_to_ndarrays

            names = ""
            for _, res in results:
                per_client = split_metrics(res.metrics)
                names = str(per_client.pop(None, {}).get(NAMES_KEY, ""))
                for c, m in per_client.items():
                    if ERROR in m:
                        self.outcome.errors[c] = str(m[ERROR])
                    else:
                        self.outcome.scalars[c] = m
                self.outcome.weight += float(res.num_examples)
            if results:  # every result carries the same unmasked mean (the workflow's backward compatibility)
                arrays = parameters_to_ndarrays(results[0][1].parameters)
                mean = dict(zip(names.split(",") if names else [], arrays, strict=True))
                self.outcome.clipped = float(mean.pop(CLIPPED, np.zeros(1))[0])
                self.outcome.mean = mean
            self.outcome.failures = len(failures)
            return None, {}

        def configure_evaluate(self, server_round, parameters, client_manager):
            return []

        def aggregate_evaluate(self, server_round, results, failures):
            return None, {}

        def evaluate(self, server_round, parameters):
            return None

    return RoundStrategy


def split_metrics(metrics: dict[str, Any]) -> dict[int | None, dict[str, Any]]:
    """A node's FitRes metrics per client ("<client id>.<key>"); the node's own ones under None."""
    out: dict[int | None, dict[str, Any]] = {}
    for key, value in metrics.items():
        head, _, rest = key.partition(".")
        client = int(head) if head.isdigit() and rest else None
        out.setdefault(client, {})[rest if client is not None else key] = value
    return out


def node_reply(replies: dict[int, bytes], errors: dict[int, str], uniform: bool = False,
               clip: float | None = None, max_weight: float | None = None,
               quantization_range: int | None = None) -> tuple[list[np.ndarray], int, dict[str, Any]]:
    """A node's (parameters, num_examples, metrics) for its FitRes: its clients' update tensors averaged by example
    count (the mod weights the average by their total; ``uniform``: weight 1 per client, for an aggregator that
    weighs clients alike), each client's numeric scalars and errors as metrics. A node whose weight exceeds the
    protocol's ``max_weight`` refuses to upload (its weight factor would wrap the field). With the protocol's
    clipping range ``clip``, one more tensor says whether this node's upload is clipped (``CLIPPED``, 1 or 0,
    averaged like the rest: the server learns only the clipped share of the weight). Flower's mod multiplies the
    average by the node's weight factor before it clips, so a value v is clipped when |v| > clip · max_weight /
    weight: the test is on what the mod will clip."""
    from fedpeft.comm.codec import decode

    decoded = {c: decode(b) for c, b in sorted(replies.items())}
    if not decoded:
        raise RuntimeError("no client of this node trained: " + "; ".join(f"{c}: {e}" for c, e in errors.items()))
    names = sorted(next(iter(decoded.values())).tensors)
    metrics: dict[str, Any] = {}
    for c, r in decoded.items():
        if sorted(r.tensors) != names:
            raise ValueError(f"client {c} uploads {sorted(r.tensors)}, the node's other clients {names}")
        metrics |= {f"{c}.{k}": v for k, v in r.scalars.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)}
    weights = {c: 1 if uniform else int(r.scalars["num_examples"]) for c, r in decoded.items()}
    total = sum(weights.values())
    if max_weight is not None and total > max_weight:
        raise ValueError(f"this node's weight {total} (examples of clients {sorted(decoded)}) exceeds "
                         f"secure_aggregation.max_weight {max_weight:g}: its weight factor would wrap the field; "
                         "raise max_weight to at least the largest client's examples")
    arrays = [sum(weights[c] / total * r.tensors[k].double().numpy() for c, r in decoded.items()).astype(np.float32)
              for k in names]
    if clip is not None:
        scale = _weight_factor(total, max_weight, quantization_range)
        over = any(bool((np.abs(a.astype(np.float64) * scale) > clip).any()) for a in arrays)
        arrays.append(np.array([1.0 if over else 0.0], dtype=np.float32))
        names = [*names, CLIPPED]
    metrics[NAMES_KEY] = ",".join(names)
    metrics |= {f"{c}.{ERROR}": e for c, e in errors.items()}
    return arrays, total, metrics


def _weight_factor(total: float, max_weight: float | None, quantization_range: int | None) -> float:
    """The factor Flower's mod multiplies a node's average by before it clips: round(total / max_weight · Q) / Q
    (1 without the protocol's settings)."""
    if max_weight is None or quantization_range is None:
        return 1.0
    return round(total / max_weight * quantization_range) / quantization_range


def masked_train(run_node: RunNode) -> Callable[[Any, Any], Any]:
    """The handler behind ``secaggplus_mod`` in the collect-masked-vectors stage: ``run_node`` (the node's settings
    and its clients' instructions -> their encoded replies and errors) runs fedpeft's client steps; ``node_reply``
    makes them the ``FitRes`` the mod quantizes, masks and uploads."""
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import Message
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    def call_next(msg, ctxt):
        config = compat.recorddict_to_fitins(msg.content, keep_input=True).config
        settings = {k[len(SETTING):]: v for k, v in config.items() if k.startswith(SETTING)}
        payloads = {int(k[len(CLIENT):]): bytes(v) for k, v in config.items() if k.startswith(CLIENT)}
        arrays, total, metrics = node_reply(*run_node(settings, payloads), uniform=bool(settings.get("uniform")),
                                            clip=settings.get("clipping_range"), max_weight=settings.get("max_weight"),
                                            quantization_range=settings.get("quantization_range"))
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), total, metrics)
        return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)

    return call_next


def is_secure(msg: Any) -> bool:
    """Whether a Flower message is a stage of the SecAgg+ protocol."""
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    return RECORD_KEY_CONFIGS in msg.content.config_records


def secure_mod(msg: Any, context: Any, call_next: Callable[[Any, Any], Any]) -> Any:
    """A ClientApp mod: Flower's ``secaggplus_mod`` for the protocol's messages, behind the node's own checks, with
    the quantization's rounding (in the masked-vector stage, which carries the node's instructions) seeded by (run
    seed, round, first client); other messages (evaluation, discovery) pass through. The node's policy (its
    ``--node-config``: ``runtime.node_policy``) may refuse a plain TRAIN message and a setup below its floor; every
    node refuses an unmask request that is not consistent (``runtime.secure.checks``)."""
    from flwr.app import MessageType
    from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod

    from fedpeft.runtime.node_policy import NodePolicy
    from fedpeft.runtime.secure.masks import use_strong_masks

    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    policy = NodePolicy.from_node_config(dict(context.node_config))
    if not is_secure(msg):
        policy.check_plain_train()
        return call_next(msg, context)
    use_strong_masks()
    _check_stage(msg, context, policy)
    config = msg.content.config_records.get("fitins.config")
    clients = sorted(int(k[len(CLIENT):]) for k in (config or {}) if k.startswith(CLIENT))
    if not clients:
        return secaggplus_mod(msg, context, call_next)
    with seeded(int(config[SETTING + "seed"]), int(config[SETTING + "round"]), clients[0], "secagg-quantize"):
        return secaggplus_mod(msg, context, call_next)


def _check_stage(msg: Any, context: Any, policy: Any) -> None:
    """The node's checks of a protocol message before Flower's mod answers it: the setup's parameters against the
    node's floor, the masks' generator against this node's, the unmask request's consistency against the node's
    protocol state."""
    from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage

    from fedpeft.runtime.secure.checks import DeviatingServer, check_unmask
    from fedpeft.runtime.secure.masks import MASKS

    configs = msg.content.config_records[RECORD_KEY_CONFIGS]
    stage = configs.get(Key.STAGE)
    if stage == Stage.SETUP:
        policy.check_secure_setup(int(configs.get(Key.SHARE_NUMBER, 0)), int(configs.get(Key.THRESHOLD, 0)))
    elif stage == Stage.COLLECT_MASKED_VECTORS:
        masks = (msg.content.config_records.get("fitins.config") or {}).get(SETTING + "masks")
        if masks != MASKS:
            log.error("node refuses to mask: the server's masks are %r, this node's %r", masks, MASKS)
            raise ValueError(f"the server masks with {masks!r}, this node with {MASKS!r}: the sum would not "
                             "unmask (run the same fedpeft version on the server and every node)")
    elif stage == Stage.UNMASK and RECORD_KEY_STATE in context.state.config_records:
        state = SecAggPlusState(**context.state.config_records[RECORD_KEY_STATE])
        try:
            check_unmask(state.nid, state.public_keys_dict, state.rd_seed_share_dict,
                         state.sk1_share_dict, state.threshold, list(configs.get(Key.ACTIVE_NODE_ID_LIST, [])),
                         list(configs.get(Key.DEAD_NODE_ID_LIST, [])))
        except DeviatingServer as e:
            log.error("node %d refuses to unmask: %s", state.nid, e)
            raise


def node_handler(run_node: RunNode, node: int, node_config: dict[str, Any] | None = None) -> Callable[[Any], Any]:
    """One in-process node's side of a round: ``secure_mod`` (its protocol state kept across the four stages in the
    node's Flower context, its policy from ``node_config``) around ``masked_train``."""
    from flwr.app import Context, RecordDict

    context = Context(run_id=0, node_id=node, node_config=dict(node_config or {}), state=RecordDict(), run_config={})
    call_next = masked_train(run_node)
    return lambda msg: secure_mod(msg, context, call_next)


def node_id(client: int) -> int:
    """The Flower node id a client stands as in the embedded runtime (ids from 1: 0 is no node)."""
    return client + 1


def secure_round(cfg: SecureAggregationConfig, seed: int, round: int, groups: dict[int, dict[int, bytes]], grid: Any,
                 settings: dict[str, Any] | None = None, uniform: bool = False, flow: Any = None) -> SecureOutcome:
    """Run Flower's SecAgg+ workflow for one round over ``grid``: ``groups`` maps each node to its clients' encoded
    instructions (``settings``: what a Flower node needs besides them; ``uniform``: every client weighs 1, for an
    aggregator that weighs clients alike, and ``max_weight`` becomes the most clients a node holds, so that the
    quantization keeps its resolution); the outcome has no mean when the protocol halted (too few survivors for the
    threshold). ``flow``: the server's workflow (default: Flower's, with ``cfg``'s settings; a test's deviating
    server, ``runtime.secure.adversary``)."""
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.common import Parameters
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    from fedpeft.runtime.secure.masks import MASKS, use_strong_masks

    use_strong_masks()
    if uniform:
        cfg = cfg.model_copy(update={"max_weight": float(max((len(g) for g in groups.values()), default=1))})
    if len(groups) * cfg.quantization_range >= cfg.modulus_range:
        return SecureOutcome(halted=f"{len(groups)} nodes' values of up to quantization_range {cfg.quantization_range} "
                                    f"would wrap modulus_range {cfg.modulus_range}")
    strategy = strategy_class()(groups, (settings or {}) | {
        "seed": seed, "round": round, "uniform": uniform, "clipping_range": cfg.clipping_range, "masks": MASKS,
        "max_weight": cfg.max_weight, "quantization_range": cfg.quantization_range})
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            strategy=strategy)
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: round})
    context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(Parameters([], ""), True)
    try:
        with seeded(seed, round, SERVER, "secagg-neighbours"):
            (flow or workflow(cfg))(grid, context)
    except Exception as e:  # noqa: BLE001 - e.g. a masked vector of the wrong shape: the sum is lost, nothing applied
        log.warning("round %d: secure aggregation failed: %s: %s", round, type(e).__name__, e)
        strategy.outcome.mean, strategy.outcome.halted = None, f"{type(e).__name__}: {e}"
    if strategy.outcome.mean is None and strategy.outcome.halted is None:
        strategy.outcome.halted = "fewer surviving clients than the reconstruction threshold needs"
    return strategy.outcome
