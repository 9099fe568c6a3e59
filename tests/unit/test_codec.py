import math

import pytest
import torch

from fedpeft.comm.codec import Message, WireSpec, decode, encode, framing_overhead, payload_bytes


def test_round_trip_keeps_values_and_scalars():
    t = torch.randn(20, 384)
    msg = Message({"prompt": t, "ids": torch.tensor([1, 2, 3], dtype=torch.int16)}, {"round": 3, "loss": 0.25})
    out = decode(encode(msg))
    assert torch.equal(out.tensors["prompt"], t)
    assert out.tensors["ids"].dtype == torch.int16 and out.tensors["ids"].tolist() == [1, 2, 3]
    assert out.scalars == {"round": 3, "loss": 0.25}


def test_byte_count_is_payload_plus_small_framing():
    msg = Message({"prompt": torch.randn(20, 384)}, {"num_examples": 178, "train_loss": 0.5, "steps": 12})
    data = encode(msg)
    assert payload_bytes(msg) == 20 * 384 * 4
    assert len(data) == payload_bytes(msg) + framing_overhead(msg)
    assert 0 < framing_overhead(msg) <= 1024


def test_float16_wire_halves_payload_and_rounds_values():
    t = torch.randn(64, 32)
    spec = WireSpec("float16")
    msg = Message({"prompt": t})
    out = decode(encode(msg, spec))
    assert out.tensors["prompt"].dtype == torch.float16
    assert payload_bytes(msg, spec) == 64 * 32 * 2
    assert torch.equal(out.tensors["prompt"].float(), t.half().float())
    assert not torch.equal(out.tensors["prompt"].float(), t)


def test_per_name_wire_override():
    spec = WireSpec("float32", (("idx", "int16"),))
    out = decode(encode(Message({"idx": torch.tensor([7, 30000]), "z": torch.ones(2)}), spec))
    assert out.tensors["idx"].dtype == torch.int16 and out.tensors["z"].dtype == torch.float32


def test_non_finite_scalars_are_refused():
    with pytest.raises(ValueError):
        encode(Message(scalars={"loss": math.nan}))


def test_garbage_bytes_are_refused():
    with pytest.raises(Exception):
        decode(b"\x00\x01not a message")
