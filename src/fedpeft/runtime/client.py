"""The client side of one exchange: bytes in, method call, bytes out. Shared by every runtime."""

from __future__ import annotations

from fedpeft.comm.codec import Message, decode, encode
from fedpeft.methods.base import ClientContext, Method


def handle_train(method: Method, payload: bytes, client: ClientContext) -> bytes:
    """Decode an instruction, run ``client_update`` and encode the reply in the method's wire format."""
    reply: Message = method.client_update(decode(payload), client)
    return encode(reply, method.wire)


def handle_evaluate(method: Method, payload: bytes, client: ClientContext) -> bytes:
    return encode(method.client_evaluate(decode(payload), client), method.wire)
