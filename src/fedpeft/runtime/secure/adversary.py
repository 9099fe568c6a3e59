"""A malicious SecAgg+ server, to test that honest nodes give it no single client's update.

``DeviatingWorkflow`` runs fedpeft's SecAgg+ workflow (Flower's, ``runtime.secure.protocol``) honestly through setup,
key sharing and the masked vectors (keeping each node's masked vector, as any server can), then deviates in the unmask
stage as Bell et al. (CCS 2020, §4) list a malicious server may: it sends each node the survivor and dropped lists an
``Attack`` chooses for it, collects what the nodes answer, and tries to rebuild the target node's two secrets (its
private-mask seed and its first secret key) and, with both, to take every mask off the target's masked vector.
``run_attack`` plays one round over in-process nodes; its ``AttackOutcome`` says which nodes refused, how many shares of
each secret the server got, and the update it recovered (None when it could not).

The attacks (``ATTACKS``): name the target both survivor and dropped (``both``); tell some of its neighbours it
survived and the others it dropped (``split``); name a node that is no neighbour (``stranger``); name the
receiving node itself as dropped (``self_dropped``); name a survivor twice (``repeat``); name fewer survivors than
the threshold (``too_few``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Lists = tuple[list[int], list[int]]  # (survivors, dropped) as sent to one node
Attack = Callable[[int, int, set[int], set[int], set[int]], Lists]  # (node, target, its neighbours, active, dead)


def _honest(node: int, target: int, nb: set[int], active: set[int], dead: set[int]) -> Lists:
    return sorted(nb & active), sorted(nb & dead)


def _both(node: int, target: int, nb: set[int], active: set[int], dead: set[int]) -> Lists:
    a, d = _honest(node, target, nb, active, dead)
    return a, sorted({*d, target}) if target in nb else d


def _split(node: int, target: int, nb: set[int], active: set[int], dead: set[int]) -> Lists:
    """The target's neighbours with odd ids (and the target) hear it survived, those with even ids that it dropped;
    each node alone sees a consistent request."""
    a, d = _honest(node, target, nb, active, dead)
    if target not in nb or node == target:
        return a, d
    return (a, d) if node % 2 else ([x for x in a if x != target], sorted({*d, target}))


def _stranger(node: int, target: int, nb: set[int], active: set[int], dead: set[int]) -> Lists:
    a, d = _honest(node, target, nb, active, dead)
    outsiders = sorted((active | dead) - nb) or [max(active | dead) + 1]  # a sampled non-neighbour, or no node
    return a, sorted({*d, outsiders[0]})


def _self_dropped(node: int, target: int, nb: set[int], active: set[int], dead: set[int]) -> Lists:
    a, d = _honest(node, target, nb, active, dead)
    return [x for x in a if x != node], sorted({*d, node})


def _repeat(node: int, target: int, nb: set[int], active: set[int], dead: set[int]) -> Lists:
    a, d = _honest(node, target, nb, active, dead)
    return [*a, target] if target in a else a, d


def _too_few(node: int, target: int, nb: set[int], active: set[int], dead: set[int]) -> Lists:
    a, d = _honest(node, target, nb, active, dead)
    return [node], d


ATTACKS: dict[str, Attack] = {"honest": _honest, "both": _both, "split": _split, "stranger": _stranger,
                              "self_dropped": _self_dropped, "repeat": _repeat, "too_few": _too_few}


@dataclass
class AttackOutcome:
    """What the deviating server got: the nodes that refused its unmask request (and why), the shares of the
    target's private-mask seed and secret key it collected, and the target's update if it could rebuild both."""

    refused: dict[int, str] = field(default_factory=dict)
    seed_shares: int = 0
    key_shares: int = 0
    threshold: int = 0
    recovered: list[np.ndarray] | None = None


def workflow_class():
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.common.secure_aggregation.ndarrays_arithmetic import factor_extract, get_parameters_shape
    from flwr.common.secure_aggregation.quantization import dequantize
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
    from flwr.app import ConfigRecord, Message, MessageType, RecordDict
    from flwr.common import bytes_to_ndarray
    import flwr.server.workflow.secure_aggregation.secaggplus_workflow as flower_workflow
    from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

    from fedpeft.runtime.secure.protocol import workflow_class as honest_workflow

    class Recorder:
        """The grid as the workflow sees it, keeping every node's reply (a server sees each masked vector)."""

        def __init__(self, grid: Any, seen: dict[int, Any]) -> None:
            self.grid, self.seen = grid, seen

        def __getattr__(self, name: str) -> Any:
            return getattr(self.grid, name)

        def send_and_receive(self, messages, *, timeout=None):
            replies = self.grid.send_and_receive(messages, timeout=timeout)
            self.seen |= {m.metadata.src_node_id: m.content for m in replies if not m.has_error()}
            return replies

    class DeviatingWorkflow(honest_workflow()):
        def __init__(self, attack: Attack, target: int, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.attack, self.target, self.outcome = attack, target, AttackOutcome()
            self.masked: dict[int, list[np.ndarray]] = {}

        def collect_masked_vectors_stage(self, grid, context, state) -> bool:
            seen: dict[int, Any] = {}
            ok = super().collect_masked_vectors_stage(Recorder(grid, seen), context, state)
            self.masked = {n: [bytes_to_ndarray(b) for b in c.config_records[RECORD_KEY_CONFIGS]
                               [Key.MASKED_PARAMETERS]] for n, c in seen.items()}
            return ok

        def unmask_stage(self, grid, context, state) -> bool:
            active = set(state.active_node_ids)
            dead = (state.sampled_node_ids & self.shared) - active
            sent: dict[int, Lists] = {}

            def make(nid: int) -> Message:
                sent[nid] = self.attack(nid, self.target, state.nid_to_neighbours[nid], active, dead)
                cfg = ConfigRecord({Key.STAGE: Stage.UNMASK, Key.ACTIVE_NODE_ID_LIST: sent[nid][0],
                                    Key.DEAD_NODE_ID_LIST: sent[nid][1]})
                return Message(content=RecordDict({RECORD_KEY_CONFIGS: cfg}), dst_node_id=nid,
                               message_type=MessageType.TRAIN, group_id="1")

            replies = grid.send_and_receive([make(n) for n in sorted(active)], timeout=self.timeout)
            answered = {m.metadata.src_node_id for m in replies if not m.has_error()}
            self.outcome.refused = {n: grid.errors.get(n, "no reply") for n in sorted(active - answered)}
            seeds, keys = [], []
            for m in replies:
                if m.has_error():
                    continue
                res = m.content.config_records[RECORD_KEY_CONFIGS]
                nids, shares = list(res[Key.NODE_ID_LIST]), list(res[Key.SHARE_LIST])
                n_active = len(sent[m.metadata.src_node_id][0])
                for i, (owner, share) in enumerate(zip(nids, shares, strict=True)):
                    if owner == self.target:
                        (seeds if i < n_active else keys).append(share)
            self.outcome.seed_shares, self.outcome.key_shares = len(seeds), len(keys)
            self.outcome.threshold = state.threshold
            if len(seeds) >= state.threshold and len(keys) >= state.threshold and self.target in self.masked:
                self.outcome.recovered = self._unmask_target(state, combine_shares(seeds), combine_shares(keys))
            return False  # the attack is the round: nothing is aggregated

        def _unmask_target(self, state, seed: bytes, sk1: bytes) -> list[np.ndarray] | None:
            vec = [a.astype(np.int64) for a in self.masked[self.target]]
            shapes = get_parameters_shape(vec)
            masks = flower_workflow.pseudo_rand_gen  # the generator the workflow (and so the nodes) use
            vec = [v - m for v, m in zip(vec, masks(seed, state.mod_range, shapes), strict=True)]
            try:
                private = bytes_to_private_key(sk1)
            except ValueError:  # the shares did not rebuild a key
                return None
            for nb in sorted(state.nid_to_neighbours[self.target] - {self.target}):
                shared = generate_shared_key(private, bytes_to_public_key(state.nid_to_publickeys[nb][0]))
                sign = 1 if self.target > nb else -1
                vec = [v - sign * m for v, m in zip(vec, masks(shared, state.mod_range, shapes), strict=True)]
            factor, params = factor_extract([np.mod(v, state.mod_range) for v in vec])
            ratio = float(factor) / state.quantization_range
            return [a / ratio for a in dequantize(params, state.clipping_range, state.quantization_range)]

    return DeviatingWorkflow


def run_attack(attack: str, target: int, handlers: dict[int, Callable[[Any], Any]], groups: dict[int, dict[int, bytes]],
               cfg: Any, seed: int = 0) -> AttackOutcome:
    """One round of ``secure_round`` over in-process nodes (``handlers``), its server deviating with ``attack``
    against node ``target``."""
    from fedpeft.runtime.secure.inprocess import grid_class, task_identity
    from fedpeft.runtime.secure.protocol import secure_round

    flow = workflow_class()(ATTACKS[attack], target, cfg.num_shares, cfg.reconstruction_threshold,
                            max_weight=cfg.max_weight, clipping_range=cfg.clipping_range,
                            quantization_range=cfg.quantization_range, modulus_range=cfg.modulus_range)
    grid = grid_class()(handlers)
    with task_identity():
        secure_round(cfg, seed, 1, groups, grid, flow=flow)
    flow.outcome.refused = flow.outcome.refused or {n: e for n, e in grid.errors.items()}
    return flow.outcome
