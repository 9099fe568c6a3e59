"""What a node does with one Flower message: run ``runtime.client`` for each of its clients named in it.

Called in the ClientApp's own process (Flower simulation: a Ray actor serves every message of a run)
or in the node's long-lived worker (``node_worker``; Flower deployment, where the ClientApp process
lives for one message only). The frozen backbone comes from ``backbones.loading.PROCESS_CACHE`` and
the task/partitions/encodings from a per-process cache keyed by the config, so a process builds them
at most once per run. Each message carries the run's torch thread count (``runtime.threads``, resolved by the
server: ``runtime/threads.py``), which this process sets before it computes, so its clients' numbers are those of
every other runtime. Every reply reports the process id, its load counters and its threads, which the server
writes to metrics.jsonl (``model_loads``) and summary.json (``flower.processes``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import torch
import yaml

from fedpeft.backbones.loading import PROCESS_CACHE
from fedpeft.build import Built, build
from fedpeft.data.paths import ENV_VAR as DATA_ENV_VAR
from fedpeft.resolve import resolve
from fedpeft.runtime.client import handle_evaluate, handle_train
from fedpeft.runtime.faults import inject
from fedpeft.runtime.flower.client_state import ClientStateStore
from fedpeft.runtime.flower.records import Reply
from fedpeft.runtime.node_policy import NodePolicy, state_root
from fedpeft.runtime.threads import usable_cores

log = logging.getLogger("fedpeft.flower.client")

KEEP_BUILT = 2  # experiments kept per process (a long-lived worker serves run after run)


class _ProcessState:
    """The deliberate per-process caches: built experiments (by config text, newest last) and counters."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.built: dict[str, Built] = {}
        self.experiment_builds = 0
        self.messages = 0
        self.warned_threads: set[int] = set()  # counts above this machine's cores, warned about once


_PROCESS = _ProcessState()


def _built(config_yaml: str, node_config: dict[str, Any]) -> Built:
    """The experiment of this config, built at most once per process (one process serves one node, so its policy
    is checked once, before anything loads)."""
    with _PROCESS.lock:
        if config_yaml not in _PROCESS.built:
            cfg = resolve(yaml.safe_load(config_yaml))
            NodePolicy.from_node_config(node_config).check_model(cfg.model)
            if "data-dir" in node_config:
                os.environ[DATA_ENV_VAR] = str(node_config["data-dir"])  # this process's data location
            while len(_PROCESS.built) >= KEEP_BUILT:
                del _PROCESS.built[next(iter(_PROCESS.built))]  # the oldest run's experiment
            _PROCESS.built[config_yaml] = build(cfg)
            _PROCESS.experiment_builds += 1
        _PROCESS.messages += 1
        return _PROCESS.built[config_yaml]


def process_info() -> dict[str, int]:
    """pid and load counters of this process (sent back with every reply)."""
    return {"pid": os.getpid(), "backbone_loads": sum(PROCESS_CACHE.loads.values()),
            "experiment_builds": _PROCESS.experiment_builds, "messages": _PROCESS.messages,
            "threads": torch.get_num_threads()}


def _use_threads(settings: dict[str, Any]) -> None:
    """This process computes with the run's thread count (a server from before it was sent: left as it is)."""
    if "threads" not in settings:
        return
    threads = int(settings["threads"])
    torch.set_num_threads(threads)
    if threads > usable_cores() and threads not in _PROCESS.warned_threads:
        _PROCESS.warned_threads.add(threads)
        log.warning("the run computes with %d torch threads (the server's runtime.threads) on %d usable cores here: "
                    "the same numbers as every runtime, but slower; set runtime.threads to suit the nodes",
                    threads, usable_cores())


def serve(settings: dict[str, Any], payloads: dict[int, bytes], node_config: dict[str, Any], train: bool,
          build: Callable[[str, dict[str, Any]], Built] | None = None) -> Reply:
    """``client_update`` (``train``) or ``client_evaluate`` for every client in ``payloads``, each from its stored
    state; a client that raises is reported in ``Reply.errors`` and does not take the node's other clients down.
    ``build(config_yaml, node_config)``: what the clients train with, in place of the config's own experiment
    (``integrations.transformers``: the user's trainers)."""
    _use_threads(settings)  # (a build applies a pinned runtime.threads, which is this same count)
    store = ClientStateStore(state_root(node_config, settings))
    b = (build or _built)(str(settings["config_yaml"]), node_config)
    rnd = int(settings["round"])
    reply = Reply()
    for cid in sorted(payloads):
        ctx = b.exp.client(cid)
        ctx.state = store.load(cid, rnd - 1 if train else rnd)
        try:
            if train:
                inject(b.plan.faults, b.plan.seed, rnd, cid)
                reply.payloads[cid] = handle_train(b.method, payloads[cid], ctx)
                store.save(cid, rnd, ctx.state)
                store.prune(cid, int(settings.get("checkpointed_round", 0)))
            else:
                reply.payloads[cid] = handle_evaluate(b.method, payloads[cid], ctx)
        except Exception as e:  # noqa: BLE001 - reported to the server as this client's failure
            log.exception("round %d: client %d raised", rnd, cid)
            reply.errors[cid] = f"{type(e).__name__}: {e}"
    reply.node = process_info()
    log.info("pid %d served %s of round %d for clients %s (backbone loads in this process: %d)",
             os.getpid(), "train" if train else "evaluate", rnd, sorted(payloads), reply.node["backbone_loads"])
    return reply
