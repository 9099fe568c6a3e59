"""fedpeft payloads inside Flower records: codec bytes as raw ``Array`` data, settings as ConfigRecord.

One Flower message goes to one SuperNode and may carry the instructions of several fedpeft clients
(a node can own several partitions): ``ArrayRecord`` key ``"<client id>"`` -> ``Array`` whose
``data`` is exactly the safetensors bytes of ``fedpeft.comm.codec.encode``. Nothing is pickled;
the receiving side calls ``codec.decode`` on those bytes, so fedpeft byte counts are identical to
the embedded runtime. Flower's own ``count_bytes()`` of the records is reported next to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

PAYLOAD = "fedpeft.payload"  # ArrayRecord: client id -> codec bytes
SETTINGS = "fedpeft.settings"  # ConfigRecord: round, config YAML, run key, ...
ERRORS = "fedpeft.errors"  # ConfigRecord: client id -> error text (a client that raised)
NODE = "fedpeft.node"  # MetricRecord: pid, backbone loads, ... of the process that answered
CLIENTS = "fedpeft.clients"  # ConfigRecord: the client ids a node owns (discovery reply)
STYPE = "fedpeft.codec"  # Array.stype marking raw fedpeft codec bytes


def pack_payloads(payloads: dict[int, bytes]) -> ArrayRecord:
    """Client id -> codec bytes, as an ArrayRecord of uint8 ``Array``s holding the bytes unchanged."""
    return ArrayRecord({str(cid): Array(dtype="uint8", shape=(len(b),), stype=STYPE, data=b)
                        for cid, b in sorted(payloads.items())})


def unpack_payloads(record: ArrayRecord) -> dict[int, bytes]:
    out = {}
    for key, arr in record.items():
        if arr.stype != STYPE:
            raise ValueError(f"array '{key}' is not a fedpeft codec payload (stype {arr.stype!r})")
        out[int(key)] = bytes(arr.data)
    return out


@dataclass
class Instruction:
    """What the server sends one node for one round: per-client payloads plus run settings."""

    payloads: dict[int, bytes]
    settings: dict[str, Any]

    def content(self) -> RecordDict:
        return RecordDict({PAYLOAD: pack_payloads(self.payloads), SETTINGS: ConfigRecord(dict(self.settings))})

    @classmethod
    def from_content(cls, content: RecordDict) -> Instruction:
        settings = dict(content.config_records[SETTINGS]) if SETTINGS in content.config_records else {}
        payloads = unpack_payloads(content.array_records[PAYLOAD]) if PAYLOAD in content.array_records else {}
        return cls(payloads, settings)


@dataclass
class Reply:
    """What a node answers: replies of the clients that succeeded, errors of those that raised, process info."""

    payloads: dict[int, bytes] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    node: dict[str, int | float] = field(default_factory=dict)

    def content(self) -> RecordDict:
        return RecordDict({
            PAYLOAD: pack_payloads(self.payloads),
            ERRORS: ConfigRecord({str(k): v for k, v in self.errors.items()}),
            NODE: MetricRecord(dict(self.node)),
        })

    @classmethod
    def from_content(cls, content: RecordDict) -> Reply:
        payloads = unpack_payloads(content.array_records[PAYLOAD]) if PAYLOAD in content.array_records else {}
        errors = {int(k): str(v) for k, v in content.config_records.get(ERRORS, ConfigRecord()).items()}
        node = dict(content.metric_records.get(NODE, MetricRecord()))
        return cls(payloads, errors, node)


def count_bytes(content: RecordDict) -> int:
    """Flower's own size of a message's records (sum of each record's ``count_bytes()``)."""
    return sum(rec.count_bytes() for rec in content.values())
