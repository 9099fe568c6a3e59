"""The Flower ClientApp: each handler decodes the Flower records and has ``node_service.serve`` run the clients.

In Flower simulation a Ray actor serves every message of a run, so ``serve`` runs in this process
and loads the backbone once. In a deployment Flower 1.41 starts a fresh ``flwr-clientapp`` process
per message; with ``node-worker='true'`` in the node config this process only forwards the message
to the node's long-lived worker (``node_worker``), which loads the backbone once per run. The server
sends one message per node per round carrying all the clients the node owns.

Node settings (``--node-config``): ``partition-ids`` (e.g. ``"0,1"``; in simulation Flower's
``partition-id`` is used), ``state-dir`` (persistent client states), ``data-dir`` (folder with the
benchmark data, i.e. ``FEDPEFT_DATA_DIR``), ``node-worker`` and the worker's settings (see ``node_worker``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedpeft.runtime.flower import node_worker
from fedpeft.runtime.flower.records import CLIENTS, NODE, Instruction, Reply
from fedpeft.runtime.secure.protocol import is_secure, secure_mod


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


Build = Callable[[str, dict[str, Any]], Any]  # (config YAML, node config) -> what a node's clients train with


def _run(settings: dict[str, Any], payloads: dict[int, bytes], node_config: dict[str, Any], train: bool,
         build: Build | None = None) -> Reply:
    if node_worker.uses_worker(node_config):
        if build is not None:
            raise ValueError("node-worker: this ClientApp builds its clients itself (your own trainers); it runs them "
                             "in its own process: drop node-worker from the node config")
        return node_worker.request(node_config, settings, payloads, train)
    # imported here: a ClientApp process that only forwards to the node worker never loads torch
    from fedpeft.runtime.flower.node_service import serve

    return serve(settings, payloads, node_config, train, build)


def make_client_app(build: Build | None = None) -> ClientApp:
    """fedpeft's ClientApp; ``build(config_yaml, node_config)`` makes the ``build.Built`` a node's clients train with
    (default: the config's own experiment, ``node_service``; ``integrations.transformers`` passes the user's
    trainers)."""
    app = ClientApp(mods=[secure_mod])

    def serve_message(msg: Message, context: Context, train: bool) -> Message:
        ins = Instruction.from_content(msg.content)
        return Message(_run(ins.settings, ins.payloads, dict(context.node_config), train, build).content(),
                       reply_to=msg)

    def serve_masked(msg: Message, context: Context) -> Message:
        """The masked-vector stage of secure aggregation (behind ``secure_mod``): the node's clients train, and
        their update tensors become the FitRes Flower's mod quantizes and masks."""
        from fedpeft.runtime.secure.protocol import masked_train

        def run_node(settings: dict[str, Any], payloads: dict[int, bytes]) -> tuple[dict[int, bytes], dict[int, str]]:
            reply = _run(settings, payloads, dict(context.node_config), True, build)
            return reply.payloads, reply.errors

        return masked_train(run_node)(msg, context)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        """``client_update`` for every client of this node named in the message (under secure aggregation, their
        masked update: see ``runtime.secure``)."""
        if is_secure(msg):
            return serve_masked(msg, context)
        return serve_message(msg, context, train=True)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        """``client_evaluate`` on each named client's local test shard."""
        return serve_message(msg, context, train=False)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        """Discovery: which fedpeft client ids this node owns."""
        ids = owned_clients(dict(context.node_config))
        content = RecordDict({CLIENTS: ConfigRecord({"client_ids": ids}),
                              NODE: MetricRecord({"pid": os.getpid()})})
        return Message(content, reply_to=msg)

    return app


client_app = make_client_app()
