"""Serialize instructions and replies to bytes and back; the byte length is what we count.

The format is safetensors (a JSON header plus raw little-endian tensor bytes; no pickle). Tensors
are cast to a declared wire dtype (float32, float16, int16, ...) before encoding, so a float16
codec really halves the payload and the receiver really sees float16-rounded values. Scalars travel
as JSON in the safetensors metadata. Framing overhead = 8-byte header length + JSON header, which
for one tensor and a few scalars is ~150-300 bytes (see ``framing_overhead``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

WIRE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "uint16": torch.uint16,
}
_META_KEY = "fedpeft"


@dataclass
class Message:
    """A server->client instruction or client->server reply: named tensors plus JSON scalars."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WireSpec:
    """Which wire dtype each tensor travels in: ``default`` for floats, overrides by name."""

    default: str = "float32"
    overrides: tuple[tuple[str, str], ...] = ()

    def dtype_for(self, name: str, t: torch.Tensor) -> torch.dtype:
        for key, dt in self.overrides:
            if key == name:
                return WIRE_DTYPES[dt]
        if t.is_floating_point():
            return WIRE_DTYPES[self.default]
        return t.dtype


def encode(msg: Message, spec: WireSpec = WireSpec()) -> bytes:
    """Message -> bytes, casting each tensor to its wire dtype."""
    tensors = {
        k: v.detach().to("cpu", spec.dtype_for(k, v)).contiguous() for k, v in sorted(msg.tensors.items())
    }
    meta = {_META_KEY: json.dumps(msg.scalars, sort_keys=True, allow_nan=False)}
    return st_save(tensors, metadata=meta)


def decode(data: bytes) -> Message:
    """bytes -> Message; tensors keep their wire dtype (the receiver decides how to upcast)."""
    tensors = st_load(data)
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    scalars = json.loads(header.get("__metadata__", {}).get(_META_KEY, "{}"))
    return Message(tensors=dict(tensors), scalars=scalars)


def payload_bytes(msg: Message, spec: WireSpec = WireSpec()) -> int:
    """Raw tensor bytes only (numel x wire itemsize), without framing."""
    return sum(t.numel() * spec.dtype_for(k, t).itemsize for k, t in msg.tensors.items())


def framing_overhead(msg: Message, spec: WireSpec = WireSpec()) -> int:
    """Bytes of the encoded message that are not tensor data (header length, JSON header, padding)."""
    return len(encode(msg, spec)) - payload_bytes(msg, spec)


def to_numpy(msg: Message) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in msg.tensors.items()}
