"""The Flower ClientApp: each handler decodes fedpeft codec bytes and calls ``runtime.client``.

The frozen backbone comes from ``backbones.loading.PROCESS_CACHE`` and the task/partitions/
encodings from a per-process experiment cache keyed by the config, so a process builds them at
most once: in simulation a Ray actor serves every round and client it is given with one load; in a
deployment Flower 1.41 starts a fresh ``flwr-clientapp`` process per message (subprocess
isolation), so a SuperNode loads once per message and the server sends one message per node per
round carrying all the clients the node owns. Every reply reports the process id and its load
counters, which the server writes to metrics.jsonl (``model_loads``).

Node settings (``--node-config``): ``partition-ids`` (e.g. ``"0,1"``; in simulation Flower's
``partition-id`` is used), ``state-dir`` (persistent client states), ``data-dir`` (folder with the
benchmark data, i.e. ``FEDPEFT_DATA_DIR``).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import yaml
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedpeft.backbones.loading import PROCESS_CACHE
from fedpeft.build import Built, build
from fedpeft.data.paths import ENV_VAR as DATA_ENV_VAR
from fedpeft.resolve import resolve
from fedpeft.runtime.client import handle_evaluate, handle_train
from fedpeft.runtime.faults import inject
from fedpeft.runtime.flower.client_state import ClientStateStore
from fedpeft.runtime.flower.records import CLIENTS, NODE, Instruction, Reply

log = logging.getLogger("fedpeft.flower.client")


class _ProcessState:
    """The deliberate per-process caches: built experiments (by config text) and counters."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.built: dict[str, Built] = {}
        self.experiment_builds = 0
        self.messages = 0


_PROCESS = _ProcessState()


def owned_clients(node_config: dict[str, Any]) -> list[int]:
    """fedpeft client ids this node serves: ``partition-ids`` ("0,1" or an int), else ``partition-id``."""
    if "partition-ids" in node_config:
        raw = node_config["partition-ids"]
        ids = [int(raw)] if isinstance(raw, int) else [int(x) for x in str(raw).replace(" ", "").split(",") if x]
    elif "partition-id" in node_config:
        ids = [int(node_config["partition-id"])]
    else:
        raise ValueError("this SuperNode owns no fedpeft clients: start it with "
                         "--node-config \"partition-ids='0,1'\" (see `fedpeft flower supernode --help`)")
    return sorted(set(ids))


def _built(config_yaml: str, node_config: dict[str, Any]) -> Built:
    with _PROCESS.lock:
        if config_yaml not in _PROCESS.built:
            if "data-dir" in node_config:
                os.environ[DATA_ENV_VAR] = str(node_config["data-dir"])  # this process's data location
            _PROCESS.built[config_yaml] = build(resolve(yaml.safe_load(config_yaml)))
            _PROCESS.experiment_builds += 1
        _PROCESS.messages += 1
        return _PROCESS.built[config_yaml]


def process_info() -> dict[str, int]:
    """pid and load counters of this process (sent back with every reply)."""
    return {"pid": os.getpid(), "backbone_loads": sum(PROCESS_CACHE.loads.values()),
            "experiment_builds": _PROCESS.experiment_builds, "messages": _PROCESS.messages}


def _store(settings: dict[str, Any], node_config: dict[str, Any]) -> ClientStateStore:
    root = Path(str(node_config.get("state-dir") or settings["state_dir"]))
    return ClientStateStore(root / str(settings["run_key"]))


def _serve(msg: Message, context: Context, train: bool) -> Message:
    ins = Instruction.from_content(msg.content)
    node_config = dict(context.node_config)
    b = _built(str(ins.settings["config_yaml"]), node_config)
    rnd = int(ins.settings["round"])
    store = _store(ins.settings, node_config)
    reply = Reply()
    for cid in sorted(ins.payloads):
        ctx = b.exp.client(cid)
        ctx.state = store.load(cid, rnd - 1 if train else rnd)
        try:
            if train:
                inject(b.cfg.faults, b.cfg.seed, rnd, cid)
                reply.payloads[cid] = handle_train(b.method, ins.payloads[cid], ctx)
                store.save(cid, rnd, ctx.state)
                store.prune(cid, int(ins.settings.get("checkpointed_round", 0)))
            else:
                reply.payloads[cid] = handle_evaluate(b.method, ins.payloads[cid], ctx)
        except Exception as e:  # one failing client must not take the node's other clients down
            log.exception("round %d: client %d raised", rnd, cid)
            reply.errors[cid] = f"{type(e).__name__}: {e}"
    reply.node = process_info()
    log.info("pid %d served %s of round %d for clients %s (backbone loads in this process: %d)",
             os.getpid(), "train" if train else "evaluate", rnd, sorted(ins.payloads), reply.node["backbone_loads"])
    return Message(reply.content(), reply_to=msg)


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """``client_update`` for every client of this node named in the message."""
    return _serve(msg, context, train=True)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """``client_evaluate`` on each named client's local test shard."""
    return _serve(msg, context, train=False)


@client_app.query()
def query(msg: Message, context: Context) -> Message:
    """Discovery: which fedpeft client ids this node owns."""
    ids = owned_clients(dict(context.node_config))
    content = RecordDict({CLIENTS: ConfigRecord({"client_ids": ids}),
                          NODE: Reply(node=process_info()).content()[NODE]})
    return Message(content, reply_to=msg)
