"""Reject malformed client replies before they can reach aggregation."""

from __future__ import annotations

import math

from fedpeft.comm.codec import Message
from fedpeft.comm.update import ReplySchema
from fedpeft.lazy import lazy

torch = lazy("torch")


class InvalidReply(ValueError):
    """A reply that must not be aggregated; the message says why."""


def validate_reply(reply: Message, schema: ReplySchema, client: int) -> None:
    """Check keys, shapes, wire dtype, finiteness and required scalars of client ``client``'s reply (and the
    method's own check of what that client may send); raise InvalidReply otherwise."""
    got, want = set(reply.tensors), set(schema.tensors)
    if got != want:
        missing, extra = sorted(want - got), sorted(got - want)
        raise InvalidReply(f"tensor keys differ: missing {missing}, unexpected {extra}")
    for name, shape in schema.tensors.items():
        t = reply.tensors[name]
        if len(t.shape) != len(shape) or any(w is not None and g != w for g, w in zip(t.shape, shape)):
            raise InvalidReply(f"'{name}' has shape {tuple(t.shape)}, expected {tuple(shape)}")
        if t.dtype != schema.dtype_of(name):
            raise InvalidReply(f"'{name}' has dtype {t.dtype}, expected {schema.dtype_of(name)}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise InvalidReply(f"'{name}' contains NaN or Inf")
    for key in schema.scalars:
        if key not in reply.scalars:
            raise InvalidReply(f"scalar '{key}' is missing")
        v = reply.scalars[key]
        if not (_number(v) and math.isfinite(v)):
            raise InvalidReply(f"scalar '{key}' is not a finite number: {v!r}")
    n = reply.scalars.get("num_examples")
    if n is not None and not (_number(n) and int(n) == n and n > 0):
        raise InvalidReply(f"num_examples must be a positive integer, got {n!r}")
    if schema.check is not None:
        try:
            schema.check(reply, client)
        except ValueError as e:
            raise InvalidReply(str(e)) from None


def validate_metrics(reply: Message) -> dict[str, float]:
    """An evaluation reply's metrics: no tensors, every value a number or None (``num_examples`` >= 0)."""
    if reply.tensors:
        raise InvalidReply(f"an evaluation reply carries no tensors, got {sorted(reply.tensors)}")
    bad = sorted(k for k, v in reply.scalars.items() if v is not None and not _number(v))
    if bad:
        raise InvalidReply(f"metrics {bad} are not numbers")
    n = reply.scalars.get("num_examples", 0)
    if not (n is not None and int(n) == n and n >= 0):
        raise InvalidReply(f"num_examples must be a non-negative integer, got {n!r}")
    return dict(reply.scalars)


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
