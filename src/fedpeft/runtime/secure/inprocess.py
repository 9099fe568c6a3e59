"""A Flower ``Grid`` whose nodes are in this process: the embedded runtime's way to run Flower's SecAgg+ workflow.

Every message crosses as Flower would send it: its records are serialized with Flower's protobuf serde and parsed
again on the other side (so no object is shared, and the byte counts are the serialized records'), then handed to the
node's handler (``secaggplus_mod`` around fedpeft's train step). A node whose handler raises, or that a test drops at a
stage, gives no reply, as a node that failed or timed out.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

Handler = Callable[[Any], Any]  # Message -> reply Message
STAGE_KEY = ("secaggplus_configs", "stage")


def wire_bytes(content) -> bytes:
    """A message's records as Flower serializes them (protobuf)."""
    from flwr.common.serde import recorddict_to_proto

    return recorddict_to_proto(content).SerializeToString()


def protocol_bytes(content) -> int:
    """What every runtime counts for one protocol message: its serialized records without the run settings a Flower
    node gets beside its instructions (the config YAML, paths; not counted in plain rounds either). Flower's
    ``count_bytes`` cannot size the protocol's lists of byte strings."""
    from flwr.app import ConfigRecord, RecordDict

    from fedpeft.runtime.secure.protocol import SETTING

    config = content.config_records.get("fitins.config")
    if config is None or not any(k.startswith(SETTING) for k in config):
        return len(wire_bytes(content))
    slim = RecordDict(dict(content))
    slim["fitins.config"] = ConfigRecord({k: v for k, v in config.items() if not k.startswith(SETTING)})
    return len(wire_bytes(slim))


def _wire(content) -> tuple[Any, int]:
    """The records as the receiver gets them (serialized and parsed) and their serialized length."""
    from flwr.common.serde import recorddict_from_proto
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

    data = wire_bytes(content)
    proto = ProtoRecordDict()
    proto.ParseFromString(data)
    return recorddict_from_proto(proto), len(data)


def stage_of(content) -> str:
    record = content.config_records.get(STAGE_KEY[0])
    return str(record[STAGE_KEY[1]]) if record is not None and STAGE_KEY[1] in record else "?"


@contextlib.contextmanager
def task_identity(run_id: int = 0, node_id: int = 1) -> Iterator[None]:
    """Flower's process-wide task identity, which its ``Message`` constructor reads, set while inside."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, 0
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def grid_class():
    from flwr.app import Message
    from flwr.serverapp.grid import Grid

    class InProcessGrid(Grid):
        def __init__(self, handlers: dict[int, Handler], drop: Callable[[int, str], bool] | None = None) -> None:
            self.handlers, self.drop = handlers, drop or (lambda node, stage: False)
            self.bytes_down: dict[int, int] = defaultdict(int)
            self.bytes_up: dict[int, int] = defaultdict(int)
            self.errors: dict[int, str] = {}
            self.dropped_at: dict[int, str] = {}

        def set_run(self, run) -> None:
            pass

        @property
        def run(self):
            return None

        def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
            return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

        def get_node_ids(self) -> Iterable[int]:
            return list(self.handlers)

        def push_messages(self, messages):  # pragma: no cover - the workflow only calls send_and_receive
            raise NotImplementedError("InProcessGrid delivers with send_and_receive")

        pull_messages = push_messages

        def send_and_receive(self, messages, *, timeout=None):
            replies = []
            for msg in messages:
                node = msg.metadata.dst_node_id
                stage = stage_of(msg.content)
                if node in self.dropped_at or node in self.errors:
                    continue  # a node that failed once stays gone for the round
                if self.drop(node, stage):
                    self.dropped_at[node] = stage
                    continue
                content, _ = _wire(msg.content)
                self.bytes_down[node] += protocol_bytes(msg.content)
                received = Message(content=content, dst_node_id=node, message_type=msg.metadata.message_type,
                                   group_id=msg.metadata.group_id)
                try:
                    reply = self.handlers[node](received)
                except Exception as e:  # noqa: BLE001 - a failing node gives no reply, as a dead one
                    self.errors[node] = f"{type(e).__name__}: {e}"
                    continue
                content, size = _wire(reply.content)
                self.bytes_up[node] += size
                replies.append(Message(content=content, reply_to=msg))  # from ``node``, to the server
            return replies

    return InProcessGrid
