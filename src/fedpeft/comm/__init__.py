"""Wire format and byte accounting for every message between server and clients."""

from fedpeft.comm.codec import Message, WireSpec, decode, encode

__all__ = ["Message", "WireSpec", "decode", "encode"]
