"""Every registered adapter, composed without a preset (its row in ``cases.py`` names a trainer that can train it),
on tiny BERT and tiny LLaMA, classifying, and generating where it can: one client's round through the codec, its
tensors as declared, the upload's tensor bytes as the reply schema declares them, the frozen backbone unchanged and
without gradients, the server's aggregate finite."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedpeft.adapters import ADAPTERS
from fedpeft.build import build_method
from fedpeft.comm.codec import decode, encode
from fedpeft.experiment import build_experiment
from fedpeft.resolve import load_config

from tests.conformance.cases import ADAM, adapter_case, least

pytestmark = pytest.mark.usefixtures("one_thread")
CASES = [(a, "tiny-bert", "classification") for a in ADAPTERS.names()] + \
        [(a, "tiny-llama", "classification") for a in ADAPTERS.names()] + \
        [(a, "tiny-llama", "generation") for a in ADAPTERS.names()]


def _generation_task(folder) -> dict[str, str]:
    words = ["apple", "river", "stone", "cloud", "green", "music"]
    rows = [{"instruction": f"Join {a} and {b}", "response": f"{a} {b}"} for a in words for b in words if a != b]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:24]) + "\n")
    (folder / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows[24:30]) + "\n")
    return {"task.name": "jsonl", "task.path": str(folder), "task.response_column": "response",
            "task.max_length": 48, "task.max_response_length": 6, "task.num_examples": None}


@pytest.mark.parametrize("adapter, model, objective", CASES)
def test_one_round_without_a_preset(adapter, model, objective, tmp_path):
    from conftest import tiny_overrides

    case = adapter_case(adapter)
    if objective == "generation" and not case.generation:
        pytest.skip(f"{adapter} does not generate")
    over = {"model.name": model, "federation.rounds": 1, "method.adapter.num_tokens": None,
            "method.trainer.max_steps": None, "method.trainer.batch_size": None,
            "method.adapter.name": adapter, "method.aggregator.name": case.aggregator,
            "task.num_examples": 60}
    over |= {f"method.adapter.{k}": v for k, v in least("adapter", adapter).items()}
    over |= {f"method.trainer.{k}": v for k, v in (case.trainer or ADAM).items()}
    if objective == "generation":
        over |= _generation_task(tmp_path)
    cfg = load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in over.items()}))
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    before = exp.backbone.checksum()
    state = method.server_init()
    params = method.initial_params()
    assert any(v.is_floating_point() for v in params.values()) == case.trains  # (demonstrations: token ids)
    assert all(torch.isfinite(v).all() for v in params.values() if v.is_floating_point())
    inst = decode(encode(method.configure_round(state, 1, [0])[0], method.wire))
    reply = decode(encode(method.client_update(inst, exp.client(0)), method.wire))
    schema = method.reply_schema(state)
    declared = sum(math.prod(shape) * schema.dtype_of(k).itemsize for k, shape in schema.tensors.items())
    assert declared == sum(v.numel() * v.element_size() for v in reply.tensors.values())
    assert exp.backbone.checksum() == before
    assert all(p.grad is None for p in exp.backbone.model.parameters())
    new = method.aggregate(state, 1, {0: reply})
    assert all(torch.isfinite(v).all() for v in new.tensors.values() if v.is_floating_point())
