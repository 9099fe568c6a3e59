import math

import pytest
import torch

from fedpeft.comm.codec import Message
from fedpeft.methods.base import ReplySchema
from fedpeft.runtime.validation import InvalidReply, validate_reply

SCHEMA = ReplySchema({"prompt": (4, 8)}, torch.float32, ("num_examples", "train_loss"))


def good() -> Message:
    return Message({"prompt": torch.zeros(4, 8)}, {"num_examples": 10, "train_loss": 0.3})


def test_good_reply_passes():
    validate_reply(good(), SCHEMA, 0)


@pytest.mark.parametrize("mutate, reason", [
    (lambda m: m.tensors.update(extra=torch.zeros(1)), "unexpected"),
    (lambda m: m.tensors.pop("prompt"), "missing"),
    (lambda m: m.tensors.update(prompt=torch.zeros(4, 9)), "shape"),
    (lambda m: m.tensors.update(prompt=torch.zeros(4, 8, dtype=torch.float64)), "dtype"),
    (lambda m: m.tensors["prompt"].__setitem__((0, 0), math.nan), "NaN"),
    (lambda m: m.tensors["prompt"].__setitem__((1, 1), math.inf), "NaN or Inf"),
    (lambda m: m.scalars.pop("train_loss"), "train_loss"),
    (lambda m: m.scalars.update(num_examples=0), "positive"),
    (lambda m: m.scalars.update(num_examples="ten"), "finite number"),
])
def test_malformed_replies_are_rejected(mutate, reason):
    msg = good()
    mutate(msg)
    with pytest.raises(InvalidReply, match=reason):
        validate_reply(msg, SCHEMA, 0)
