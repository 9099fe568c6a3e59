"""Server side of the Flower runtimes: deliver fedpeft instructions to SuperNodes through a ``Grid``.

Client ids are mapped to Flower node ids by discovery: every node not seen before gets a ``query``
message and answers with the fedpeft client ids it owns (its ``partition-ids`` node config; in
simulation node ``i`` owns partition ``i``). A round sends one ``train`` message per node that owns
selected clients and waits until every node has answered, failed (an error reply, including the
SuperLink's NODE_UNAVAILABLE once a killed node misses its heartbeats), dropped out of the grid's
node list, or ``round_timeout`` passed. Clients without an answer become failed results, which
``RoundDriver.finish_round`` logs and skips (the round still completes with >= min_clients).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedpeft.comm.codec import Message as FedMessage
from fedpeft.runtime.flower.records import CLIENTS, SETTINGS, Instruction, Reply, count_bytes

log = logging.getLogger("fedpeft.flower")


class NodeFailure(RuntimeError):
    """A SuperNode did not deliver a client's reply (killed, unreachable, timed out)."""


MAX_CLAIMS = 1 << 16  # client ids one discovery reply may name


class FlowerTransport:
    def __init__(self, grid: Grid, settings: dict[str, Any], num_clients: int, round_timeout: float | None = None,
                 join_timeout: float = 300.0, rejoin_wait: float = 0.0, poll_interval: float = 0.2,
                 secure: Any = None, seed: int = 0, uniform: bool = False,
                 registered: dict[int, int] | None = None) -> None:
        self.grid, self.settings, self.num_clients = grid, dict(settings), num_clients
        # client id -> the node registered for it (``runtime.flower.node_registry``); None: the first live claim
        self.registered = registered
        # federation.secure_aggregation, the run seed, and whether the aggregator weighs every client alike
        self.secure, self.seed, self.uniform = secure, seed, uniform
        self.round_timeout, self.join_timeout, self.rejoin_wait = round_timeout, join_timeout, rejoin_wait
        self.poll = poll_interval
        self.owner: dict[int, int] = {}  # fedpeft client id -> Flower node id
        self.known: set[int] = set()  # node ids already asked
        self.processes: dict[str, dict[str, int]] = {}  # "pid" -> latest counters of that client process
        self._round_bytes: dict[str, int] = defaultdict(int)
        self._round_procs: dict[str, int] = {}  # "pid" -> backbone loads of processes that answered this round
        self._failures: list[dict[str, Any]] = []
        self._started = False

    # ------------------------------------------------------------------ discovery

    def _discover(self, wait: float) -> None:
        """Ask new nodes which clients they own; wait up to ``wait`` s until every client has an owner."""
        deadline = time.monotonic() + wait
        while True:
            alive = set(self.grid.get_node_ids())
            for cid, nid in list(self.owner.items()):
                if nid not in alive:
                    del self.owner[cid]
            self.known &= alive
            new = sorted(alive - self.known)
            if new:
                self._query(new)
            if len(self.owner) >= self.num_clients or time.monotonic() >= deadline:
                return
            time.sleep(1.0)

    def _query(self, nodes: list[int]) -> None:
        content = RecordDict({SETTINGS: ConfigRecord({"run_key": str(self.settings["run_key"])})})
        msgs = [Message(content, dst_node_id=n, message_type=MessageType.QUERY) for n in nodes]
        for reply in self._exchange(msgs, timeout=60.0).values():
            if isinstance(reply, BaseException) or reply.has_error():
                continue
            nid = reply.metadata.src_node_id
            try:
                ids = self._claimed(reply.content.config_records[CLIENTS]["client_ids"])
            except Exception as e:  # noqa: BLE001 - a malformed discovery reply: the node stays unknown
                log.warning("node %d: malformed discovery reply (%s: %s); ignored", nid, type(e).__name__, e)
                continue
            self.known.add(nid)
            for cid in list(ids):
                if self.registered is not None and self.registered.get(cid) != nid:
                    log.warning("node %d claims client %d, which the registry binds to %s; refused", nid, cid,
                                f"node {self.registered[cid]}" if cid in self.registered else "no node")
                    ids.remove(cid)
                    continue
                if cid in self.owner and self.owner[cid] != nid:  # its owner is alive: dead owners left above
                    log.warning("node %d claims client %d, which node %d serves; refused (a client has one node "
                                "while that node lives)", nid, cid, self.owner[cid])
                    ids.remove(cid)
                    continue
                self.owner[cid] = nid
            log.info("node %d owns clients %s", nid, ids)

    def _claimed(self, raw: Any) -> list[int]:
        """A discovery reply's client ids of this run: a list of at most ``MAX_CLAIMS`` integers (``ValueError``
        otherwise: the whole reply is ignored), repeats dropped, ids outside the run's clients ignored with a
        warning (a node set up for a larger federation serves the clients this run has)."""
        if not isinstance(raw, list) or len(raw) > MAX_CLAIMS:
            raise ValueError(f"client_ids must be a list of at most {MAX_CLAIMS} ids, got {type(raw).__name__}"
                             + (f" of {len(raw)}" if isinstance(raw, list) else ""))
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in raw):
            raise ValueError("client_ids must be integers")
        outside = sorted({i for i in raw if not 0 <= i < self.num_clients})
        if outside:
            log.warning("a node owns clients %s%s outside the run's %d clients; ignored", outside[:10],
                        " ..." if len(outside) > 10 else "", self.num_clients)
        return sorted({int(i) for i in raw} - set(outside))

    # ------------------------------------------------------------------ exchange

    def _exchange(self, msgs: list[Message], timeout: float | None) -> dict[int, Message | BaseException]:
        """Push ``msgs`` and collect one reply (or failure) per destination node."""
        pending: dict[str, int] = {}
        out: dict[int, Message | BaseException] = {}
        for m in msgs:
            ids = [i for i in self.grid.push_messages([m]) if i]
            if ids:
                pending[ids[0]] = m.metadata.dst_node_id
            else:
                out[m.metadata.dst_node_id] = NodeFailure(f"node {m.metadata.dst_node_id}: message not accepted")
        deadline = None if timeout is None else time.monotonic() + timeout
        last_alive_check = 0.0
        while pending:
            for reply in self.grid.pull_messages(list(pending)):
                nid = pending.pop(reply.metadata.reply_to_message_id, None)
                if nid is not None:
                    out[nid] = reply
            if not pending:
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                for mid, nid in list(pending.items()):
                    out[nid] = NodeFailure(f"node {nid}: no reply within {timeout:g} s")
                    log.warning("node %d: no reply within %g s; a later reply to message %s is ignored", nid,
                                timeout, mid)
                break
            if now - last_alive_check > 2.0:
                alive = set(self.grid.get_node_ids())
                for mid, nid in list(pending.items()):
                    if nid not in alive:
                        out[nid] = NodeFailure(f"node {nid} went offline (missed heartbeats)")
                        del pending[mid]
                last_alive_check = now
            time.sleep(self.poll)
        return out

    def _by_node(self, kind: str, instructions: dict[int, bytes]) -> tuple[dict[int, dict[int, bytes]],
                                                                          dict[int, BaseException]]:
        """The instructions grouped by the node that owns each client (discovering nodes first), and a failure for
        each client no connected node owns."""
        if not self._started:
            self._discover(self.join_timeout)
            self._started = True
        else:
            self._discover(self.rejoin_wait if kind == MessageType.TRAIN else 0.0)
        by_node: dict[int, dict[int, bytes]] = defaultdict(dict)
        unowned: dict[int, BaseException] = {}
        for cid, payload in instructions.items():
            if cid in self.owner:
                by_node[self.owner[cid]][cid] = payload
            else:
                unowned[cid] = NodeFailure(f"no SuperNode owning client {cid} is connected")
        return by_node, unowned

    def _round(self, kind: str, round: int, instructions: dict[int, bytes]) -> dict[int, bytes | BaseException]:
        by_node, unowned = self._by_node(kind, instructions)
        results: dict[int, bytes | BaseException] = dict(unowned)
        msgs = []
        for nid, payloads in sorted(by_node.items()):
            content = Instruction(payloads, {**self.settings, "round": round}).content()
            self._round_bytes[f"{kind}_down"] += count_bytes(content)
            msgs.append(Message(content, dst_node_id=nid, message_type=kind, group_id=str(round)))
        for nid, reply in self._exchange(msgs, self.round_timeout).items():
            clients = sorted(by_node[nid])
            if isinstance(reply, BaseException) or reply.has_error():
                why = reply if isinstance(reply, BaseException) else NodeFailure(
                    f"node {nid}: Flower error {reply.error.code}: {reply.error.reason}")
                log.warning("round %d: SuperNode %d failed during %s (clients %s): %s", round, nid, kind,
                            clients, why)
                self._failures.append({"round": round, "node": nid, "kind": kind, "clients": clients,
                                       "error": str(why)})
                for cid in clients:
                    results[cid] = why
                continue
            self._round_bytes[f"{kind}_up"] += count_bytes(reply.content)
            try:
                rep = _checked_reply(reply, nid, round)
            except ValueError as e:
                log.warning("round %d: rejected the %s reply of node %d (clients %s): %s", round, kind, nid, clients, e)
                self._failures.append({"round": round, "node": nid, "kind": kind, "clients": clients,
                                       "error": str(e)})
                for cid in clients:
                    results[cid] = e
                continue
            unasked = sorted(set(rep.payloads) - set(clients))
            if unasked:
                log.warning("round %d: node %d sent replies for clients %s it was not asked for; ignored", round,
                            nid, unasked)
            pid = str(int(rep.node.get("pid", 0)))
            self.processes[pid] = {k: int(v) for k, v in rep.node.items()}
            self._round_procs[pid] = self.processes[pid].get("backbone_loads", 0)
            for cid in clients:
                if cid in rep.payloads:
                    results[cid] = rep.payloads[cid]
                else:
                    results[cid] = RuntimeError(rep.errors.get(cid, f"node {nid} sent no reply for client {cid}"))
        return results

    # ------------------------------------------------------------------ Transport protocol

    def train(self, round: int, instructions: dict[int, bytes]) -> dict[int, bytes | BaseException]:
        self._round_bytes.clear()
        self._round_procs.clear()
        return self._round(MessageType.TRAIN, round, instructions)

    def train_secure(self, round: int, instructions: dict[int, bytes]) -> Any:
        """The round under SecAgg+: Flower's workflow over this grid, each node behind Flower's mod
        (``runtime.secure``); the bytes of every stage counted per node, split evenly over its clients."""
        from fedpeft.runtime.secure.protocol import secure_round

        self._round_bytes.clear()
        self._round_procs.clear()
        by_node, unowned = self._by_node(MessageType.TRAIN, instructions)
        grid = CountingGrid(self.grid)
        cfg = self.secure.model_copy(update={"timeout": self.secure.timeout or self.round_timeout})
        outcome = secure_round(cfg, self.seed, round, dict(by_node), grid, {**self.settings, "round": round},
                               self.uniform)
        for nid, clients in by_node.items():
            for i, cid in enumerate(sorted(clients)):
                share = lambda total: total // len(clients) + (total % len(clients) if i == 0 else 0)  # noqa: E731
                outcome.bytes_down[cid] = share(grid.bytes_down.get(nid, 0))
                outcome.bytes_up[cid] = share(grid.bytes_up.get(nid, 0))
                if cid not in outcome.scalars and cid not in outcome.errors:
                    outcome.errors[cid] = grid.errors.get(nid, f"node {nid} dropped out of secure aggregation")
        outcome.errors |= {cid: str(e) for cid, e in unowned.items()}
        self._round_bytes["train_down"] = sum(grid.bytes_down.values())
        self._round_bytes["train_up"] = sum(grid.bytes_up.values())
        return outcome

    def evaluate(self, round: int, instructions: dict[int, bytes]) -> dict[int, bytes | BaseException]:
        return self._round(MessageType.EVALUATE, round, instructions)

    def client_states(self) -> dict[int, FedMessage]:
        return {}  # client states live on the nodes (state dir), not on the server

    def restore(self, client_states: dict[int, FedMessage], last_round: int) -> None:
        self.settings["checkpointed_round"] = last_round

    def checkpointed(self, round: int) -> None:
        self.settings["checkpointed_round"] = round

    def round_extra(self) -> dict[str, Any]:
        """Flower's own ``count_bytes()`` of the records sent/received this round, and load counters."""
        return {"flower_record_bytes": dict(self._round_bytes),
                "model_loads": dict(sorted(self._round_procs.items()))}

    def summary_extra(self) -> dict[str, Any]:
        loads = [v.get("backbone_loads", 0) for v in self.processes.values()]
        return {"flower": {"client_processes": len(self.processes),
                           "max_backbone_loads_per_process": max(loads, default=0),
                           "processes": dict(sorted(self.processes.items())),
                           "node_failures": self._failures}}


class CountingGrid:
    """A ``Grid`` that counts the protocol bytes (``secure.inprocess.protocol_bytes``) of what it sends to and
    receives from each node, and why a node failed (the secure-aggregation workflow only talks to a grid through
    ``send_and_receive``)."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.bytes_down: dict[int, int] = defaultdict(int)
        self.bytes_up: dict[int, int] = defaultdict(int)
        self.errors: dict[int, str] = {}

    def send_and_receive(self, messages, *, timeout=None):
        from fedpeft.runtime.secure.inprocess import protocol_bytes

        messages = list(messages)
        for m in messages:
            self.bytes_down[m.metadata.dst_node_id] += protocol_bytes(m.content)
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        for r in replies:
            if r.has_error():
                self.errors[r.metadata.src_node_id] = f"Flower error {r.error.code}: {r.error.reason}"
            else:
                self.bytes_up[r.metadata.src_node_id] += protocol_bytes(r.content)
        return replies

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)


def _checked_reply(reply: Message, nid: int, round: int) -> Reply:
    """The fedpeft reply inside a node's Flower reply, if it answers this round's message from that node (Flower
    copies the instruction's ``group_id``, the round, into its reply); ValueError naming what does not fit."""
    if reply.metadata.src_node_id != nid:
        raise ValueError(f"reply from node {reply.metadata.src_node_id}, expected node {nid}")
    if reply.metadata.group_id != str(round):
        raise ValueError(f"reply for round {reply.metadata.group_id!r}, expected round {round}")
    try:
        return Reply.from_content(reply.content)
    except Exception as e:  # noqa: BLE001 - a malformed record is a rejected reply, never a crash
        raise ValueError(f"malformed reply records: {type(e).__name__}: {e}") from None
