"""Serialize instructions and replies to bytes and back; the byte length is what we count.

The format is safetensors (a JSON header plus raw little-endian tensor bytes; no pickle). Tensors
are cast to a declared wire dtype (float32, float16, int16, ...) before encoding, so a float16
codec really halves the payload and the receiver really sees float16-rounded values. Scalars travel
as JSON in the safetensors metadata. Framing overhead = 8-byte header length + JSON header, which
for one tensor and a few scalars is ~150-300 bytes (see ``framing_overhead``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedpeft.lazy import lazy, lazy_dict

st = lazy("safetensors.torch")
torch = lazy("torch")

WIRE_DTYPES: Mapping[str, torch.dtype] = lazy_dict(lambda: {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "uint16": torch.uint16,
})
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


def own_dtypes(msg: Message) -> WireSpec:
    """A wire spec that keeps every tensor of ``msg`` in its own dtype (checkpoints, client states)."""
    return WireSpec("float32", tuple((k, str(v.dtype).removeprefix("torch.")) for k, v in msg.tensors.items()))


def encode(msg: Message, spec: WireSpec = WireSpec()) -> bytes:
    """Message -> bytes, casting each tensor to its wire dtype."""
    tensors = {
        k: v.detach().to("cpu", spec.dtype_for(k, v)).contiguous() for k, v in sorted(msg.tensors.items())
    }
    meta = {_META_KEY: json.dumps(msg.scalars, sort_keys=True, allow_nan=False)}
    return st.save(tensors, metadata=meta)


class UndecodableMessage(ValueError):
    """Bytes that are not a fedpeft message (truncated, random, a malformed or oversized header, too large)."""


# safetensors dtype names of the wire dtypes: anything else in a header is refused before loading
_ST_DTYPES = {"F32", "F16", "BF16", "F64", "I16", "I32", "I64", "U8", "U16"}


def decode(data: bytes, max_bytes: int | None = None) -> Message:
    """bytes -> Message; tensors keep their wire dtype (the receiver decides how to upcast).

    Untrusted bytes are checked before anything is allocated from them: the total length against ``max_bytes``,
    the 8-byte header length against the data, the JSON header (a mapping of tensors with a wire dtype, a shape of
    non-negative ints and in-range offsets, and string metadata), and the scalars (a JSON object). Any failure is an
    ``UndecodableMessage`` naming what is wrong."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UndecodableMessage(f"a message is bytes, got {type(data).__name__}")
    data = bytes(data)
    if max_bytes is not None and len(data) > max_bytes:
        raise UndecodableMessage(f"message of {len(data):,} bytes exceeds federation.max_message_bytes "
                                 f"({max_bytes:,})")
    header = _header(data)
    try:
        tensors = st.load(data)
    except Exception as e:  # noqa: BLE001 - safetensors' own checks (offsets, sizes, alignment)
        raise UndecodableMessage(f"not a safetensors message: {e}") from None
    try:
        scalars = json.loads(header.get("__metadata__", {}).get(_META_KEY, "{}"))
    except ValueError as e:
        raise UndecodableMessage(f"scalars are not JSON: {e}") from None
    if not isinstance(scalars, dict):
        raise UndecodableMessage(f"scalars must be a JSON object, got {type(scalars).__name__}")
    return Message(tensors=dict(tensors), scalars=scalars)


def _header(data: bytes) -> dict[str, Any]:
    """The safetensors JSON header of ``data``, checked (see ``decode``)."""
    if len(data) < 8:
        raise UndecodableMessage(f"truncated message: {len(data)} bytes, no header length")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise UndecodableMessage(f"header length {n:,} exceeds the {len(data) - 8:,} bytes after it")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise UndecodableMessage(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise UndecodableMessage("header must be a JSON object")
    body = len(data) - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise UndecodableMessage("header metadata must map names to strings")
            continue
        if not isinstance(info, dict) or info.get("dtype") not in _ST_DTYPES:
            raise UndecodableMessage(f"tensor '{name}': dtype {info.get('dtype') if isinstance(info, dict) else info!r}"
                                     f" is not a wire dtype")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise UndecodableMessage(f"tensor '{name}': shape {shape!r} is not a list of non-negative ints")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= body):
            raise UndecodableMessage(f"tensor '{name}': data offsets {offsets!r} outside the {body:,}-byte body")
    return header


def payload_bytes(msg: Message, spec: WireSpec = WireSpec()) -> int:
    """Raw tensor bytes only (numel x wire itemsize), without framing."""
    return sum(t.numel() * spec.dtype_for(k, t).itemsize for k, t in msg.tensors.items())


def framing_overhead(msg: Message, spec: WireSpec = WireSpec()) -> int:
    """Bytes of the encoded message that are not tensor data (header length, JSON header, padding)."""
    return len(encode(msg, spec)) - payload_bytes(msg, spec)


def to_numpy(msg: Message) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in msg.tensors.items()}
