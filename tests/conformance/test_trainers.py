"""Every registered trainer, on an adapter it trains (its row in ``cases.py``): one client step; a forward-only
trainer never calls backward (a hook on ``torch.autograd.backward`` proves it), a gradient trainer does, and
neither leaves a gradient on the frozen backbone."""

from __future__ import annotations

import pytest
import torch

from fedpeft.build import build_method
from fedpeft.comm.codec import decode, encode
from fedpeft.experiment import build_experiment
from fedpeft.resolve import load_config
from fedpeft.trainers import TRAINERS

from tests.conformance.cases import TRAINER_SKIPS, TRAINER_TASKS, least, trainer_case

pytestmark = pytest.mark.usefixtures("one_thread")


def _one_round_method(name: str):
    """The experiment and method of a one-round tiny run that trains with trainer ``name`` (its conformance case's
    adapter and aggregator, at their least settings)."""
    from conftest import tiny_overrides

    if name in TRAINER_SKIPS:
        pytest.skip(TRAINER_SKIPS[name])
    adapter, aggregator = trainer_case(name)
    over = {"method.adapter.name": adapter, "method.trainer.name": name, "method.aggregator.name": aggregator,
            "method.adapter.num_tokens": None, "method.trainer.max_steps": None, "method.trainer.batch_size": None,
            "federation.rounds": 1, "task.num_examples": 60}
    over |= {f"method.adapter.{k}": v for k, v in least("adapter", adapter).items()}
    over |= {f"method.trainer.{k}": v for k, v in least("trainer", name).items()}
    over |= TRAINER_TASKS.get(name, {})
    cfg = load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in over.items()}))
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    return exp, method


@pytest.mark.parametrize("name", TRAINERS.names())
def test_backward_only_where_declared_and_never_into_the_backbone(name, monkeypatch):
    exp, method = _one_round_method(name)
    calls = []
    real = torch.autograd.backward
    monkeypatch.setattr(torch.autograd, "backward", lambda *a, **k: calls.append(1) or real(*a, **k))
    inst = decode(encode(method.configure_round(method.server_init(), 1, [0])[0], method.wire))
    method.client_update(inst, exp.client(0))
    assert (not calls) == TRAINERS.get(name).forward_only, f"{len(calls)} backward calls"
    assert all(p.grad is None for p in exp.backbone.model.parameters())


@pytest.mark.parametrize("name", TRAINERS.names())
def test_the_update_format_carries_a_valid_reply_and_an_unchanged_start_decodes_to_itself(name):
    """The trainer's update format (``formats``): a client's reply to a real instruction passes the schema
    the format declares, decodes to tensors named and shaped like the global ones, and the trainer's start itself,
    cut by ``upload`` and decoded, is the start again (a zero update stays zero)."""
    from fedpeft.comm.update import Update, unpack
    from fedpeft.runtime.validation import validate_reply

    exp, method = _one_round_method(name)
    state = method.server_init()
    inst = decode(encode(method.configure_round(state, 1, [0])[0], method.wire))
    reply = decode(encode(method.client_update(inst, exp.client(0)), method.wire))
    schema = method.reply_schema(state)
    validate_reply(reply, schema, 0)
    glob = method.global_view(state)
    decoded = method.format.decode(unpack(reply, schema, 0), glob).tensors
    assert set(glob) <= set(decoded) or TRAINERS.get(name).kind != "params", sorted(decoded)
    for k in set(decoded) & set(glob):  # FedAvg-BBT's sigma and C join the global state at its first aggregation
        assert decoded[k].shape == glob[k].shape, k
    start = method.format.start(inst)
    if not decoded or TRAINERS.get(name).kind != "params":
        return  # nothing trained, or a search distribution: its start is not a reply
    rows = len(next(iter(start.values())))  # the token search's outputs for a prompt left as received
    unchanged = Update(0, dict(start), 1, {"token_ids": torch.zeros(rows, dtype=torch.long),
                                          "changed": torch.zeros(rows, dtype=torch.bool)})
    back = method.format.decode(method.format.upload(unchanged, start), start).tensors
    assert back.keys() == start.keys() and all(torch.equal(back[k].float(), start[k].float()) for k in start)
