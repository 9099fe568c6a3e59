"""LoRA variants that exchange one factor (``sharing.lora_factors``): FFA-LoRA (A frozen, B averaged: exact
aggregation of B·A at half the bytes) and FedSA-LoRA (A averaged, B kept on each client)."""

from __future__ import annotations

import pytest
import torch
from conftest import last_hidden_ours_and_peft, tiny_overrides

from fedpeft.build import build_method
from fedpeft.clients import sub_state
from fedpeft.comm.codec import Message, encode
from fedpeft.experiment import build_experiment
from fedpeft.methods.state import PRIVATE, ServerState
from fedpeft.resolve import load_config
from fedpeft.runtime.audit import audit_reply
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir

pytestmark = pytest.mark.usefixtures("one_thread")
A, B = ".lora_A.weight", ".lora_B.weight"


def _cfg(preset: str, model: str = "tiny-bert", **extra):
    over = {"method.name": preset, "model.name": model, "method.adapter.num_tokens": None,
            "method.trainer.weight_decay": 0.1, **extra}  # weight decay would move a merely gradient-free A
    return load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in over.items()}))


def _one_round(cfg):
    """The instructions, every client's reply and the aggregated state of round 1."""
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    state = method.server_init()
    clients = list(range(cfg.federation.num_clients))
    inst = method.configure_round(state, 1, clients)
    ctxs = {c: exp.client(c) for c in clients}
    replies = {c: method.client_update(inst[c], ctxs[c]) for c in clients}
    return exp, method, state, inst, replies, ctxs, method.aggregate(state, 1, replies)


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-llama"])
def test_ffa_lora_trains_and_sends_b_only_and_aggregates_b_a_exactly(model):
    cfg = _cfg("ffa-lora", model)
    exp, method, state, inst, replies, ctxs, new = _one_round(cfg)
    init = method.initial_params()
    a_keys, b_keys = sorted(k for k in init if k.endswith(A)), sorted(k for k in init if k.endswith(B))
    assert a_keys and len(a_keys) == len(b_keys)
    for c, reply in replies.items():
        assert sorted(reply.tensors) == b_keys  # A never leaves the client (it is the same seeded tensor anyway)
        assert sorted(k for k in inst[c].tensors if k.endswith((A, B))) == b_keys  # the download is B alone
        assert any(bool(reply.tensors[k].abs().sum() > 0) for k in b_keys)  # B trained
    g = ServerState.from_message(new).glob
    for k in a_keys:  # A is exactly its initialisation after training with weight decay and after aggregation
        assert torch.equal(g[k], init[k])
    weights = torch.tensor([float(len(ctxs[c].train)) for c in replies], dtype=torch.float64)
    weights /= weights.sum()
    for kb, ka in zip(b_keys, a_keys, strict=True):  # Σ_k w_k B_k·A == B̄·A: the average of the products, exactly
        mean_of_products = sum(w * replies[c].tensors[kb].double() @ init[ka].double()
                               for w, c in zip(weights, replies))
        assert torch.allclose(g[kb].double() @ init[ka].double(), mean_of_products, atol=1e-10)


def test_ffa_lora_clients_train_b_with_a_held_at_its_initialisation():
    """The client's plan freezes every A entry (and nothing else); training under it, with weight decay, leaves A
    bitwise at its initialisation while B moves: the B_k a client uploads was trained against the A the server
    multiplies it with."""
    cfg = _cfg("ffa-lora")
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    inst = method.configure_round(method.server_init(), 1, [0])[0]
    client = exp.client(0)
    start = method.sharing.client_params(method.format.start(method._decode_down(inst, client)), {})
    plan = method.sharing.plan(start, inst, client, 1)
    assert sorted(plan.frozen) == sorted(k for k in start if k.endswith(A))
    assert all(bool(m.all()) for m in plan.frozen.values())
    update, _ = method.trainer.fit(start, inst, client, 1, {}, frozen=plan.frozen)
    trained = update.tensors
    assert all(torch.equal(trained[k], start[k]) for k in plan.frozen)
    assert any(not torch.equal(trained[k], start[k]) for k in start if k.endswith(B))


def test_ffa_lora_sends_half_of_lora_bytes_on_square_projections(tmp_path):
    run_embedded(_cfg("fedavg-lora", federation__rounds=1), tmp_path / "lora")
    run_embedded(_cfg("ffa-lora", federation__rounds=1), tmp_path / "ffa")
    lora, ffa = (RunDir(tmp_path / n).read_metrics()[0] for n in ("lora", "ffa"))
    # q/k/v are square (d x d): A [r, d] and B [d, r] have the same size, so B alone is half, plus framing
    assert 0.45 < ffa["bytes_up"] / lora["bytes_up"] < 0.55
    assert 0.45 < ffa["bytes_down"] / lora["bytes_down"] < 0.55


def test_fedsa_lora_averages_a_and_keeps_each_clients_b():
    cfg = _cfg("fedsa-lora")
    exp, method, state, inst, replies, ctxs, new = _one_round(cfg)
    init = method.initial_params()
    a_keys, b_keys = sorted(k for k in init if k.endswith(A)), sorted(k for k in init if k.endswith(B))
    for c, reply in replies.items():
        assert sorted(reply.tensors) == a_keys  # B never leaves the device
        kept = sub_state(ctxs[c].state, PRIVATE)
        assert sorted(kept) == b_keys and any(bool(kept[k].abs().sum() > 0) for k in b_keys)
        assert audit_reply(encode(reply, method.wire), exp, c, private=kept) == []  # nor any value of it
    own = sub_state(ctxs[0].state, PRIVATE)
    leaky = Message(dict(replies[0].tensors) | {"x": own[b_keys[0]]}, replies[0].scalars)  # B under another name
    assert any("private tensor" in p for p in audit_reply(encode(leaky, method.wire), exp, 0, private=own))
    g = ServerState.from_message(new).glob
    assert all(torch.equal(g[k], init[k]) for k in b_keys)  # the global B stays at its zeros
    assert not torch.equal(g[a_keys[0]], init[a_keys[0]])  # the shared A moved
    # round 2: each client starts from the new A and its own B
    inst2 = method.configure_round(new, 2, [0, 1])
    start = {c: method.sharing.client_params(method.format.start(method._decode_down(inst2[c], ctxs[c])),
                                             sub_state(ctxs[c].state, PRIVATE)) for c in (0, 1)}
    for c in (0, 1):
        assert torch.equal(start[c][a_keys[0]], g[a_keys[0]])
        assert torch.equal(start[c][b_keys[0]], sub_state(ctxs[c].state, PRIVATE)[b_keys[0]])
    assert not torch.equal(start[0][b_keys[0]], start[1][b_keys[0]])


def test_fedsa_lora_run_scores_each_client_with_its_own_b_and_resumes(tmp_path):
    from fedpeft.runtime.embedded import StopAfterRound

    cfg = _cfg("fedsa-lora", federation__rounds=2)
    run_embedded(cfg, tmp_path / "full")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1)
    run_embedded(cfg, tmp_path / "cut", resume=True)
    full, cut = RunDir(tmp_path / "full").read_metrics(), RunDir(tmp_path / "cut").read_metrics()
    assert [r["local_accuracy"] for r in full] == [r["local_accuracy"] for r in cut]
    # personalised: each client's own B, so the clients' scores are not the global (B = 0) model's
    assert full[-1]["local_accuracy"] != full[-1]["accuracy"] or full[-1]["local_loss"] != full[-1]["loss"]


def test_the_factor_policies_refuse_other_adapters():
    from fedpeft.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match="sharing"):
        load_config(None, tiny_overrides(**{"method.name": "fedprompt", "method.sharing.name": "ffa"}))


def test_fedsa_lora_exports_each_clients_own_adapter_for_peft(tmp_path):
    """``fedpeft export --client K``: Ā with client K's B, loaded by PEFT, gives K's personalised outputs; the
    global export (B = 0) is the frozen backbone."""
    from typer.testing import CliRunner

    from fedpeft.cli import app
    from fedpeft.predict import open_model

    cfg = _cfg("fedsa-lora", federation__rounds=1)
    exp = build_experiment(cfg)
    run_embedded(cfg, tmp_path / "run", experiment=exp)
    res = CliRunner().invoke(app, ["export", str(tmp_path / "run"), str(tmp_path / "c1"), "--client", "1"])
    assert res.exit_code == 0, res.output
    own = open_model(tmp_path / "run", client=1).params
    assert any(bool(v.abs().sum() > 0) for k, v in own.items() if k.endswith(B))
    ours, theirs = last_hidden_ours_and_peft(exp, own, tmp_path / "c1")
    plain, _ = last_hidden_ours_and_peft(exp, open_model(tmp_path / "run").params, tmp_path / "c1")
    assert torch.allclose(ours, theirs, atol=1e-5) and not torch.allclose(ours, plain, atol=1e-4)


@pytest.mark.parametrize("preset, extra, local", [
    ("ffa-lora", {}, ()),                                          # the head averaged beside B
    ("fedsa-lora", {}, (B, "head")),                               # the head kept on the client with B (default)
    ("fedsa-lora", {"method.sharing.share_head": True}, (B,)),     # the head averaged beside A
], ids=["ffa-lora", "fedsa-lora", "fedsa-lora-share-head"])
def test_a_linear_task_head_travels_or_stays_as_the_policy_says(preset, extra, local):
    exp, method, state, inst, replies, ctxs, new = _one_round(_cfg(preset, **{"model.readout": "linear"}, **extra))
    init = method.initial_params()
    head = sorted(k for k in init if not k.endswith((A, B)))
    assert head and all(k.startswith("head") for k in head)  # the linear readout's weight and bias
    kept = [k for k in init if k.endswith(local) or ("head" in local and k in head)]
    sent = sorted(k for k in init if k not in kept and not (preset == "ffa-lora" and k.endswith(A)))
    for c, reply in replies.items():
        assert sorted(reply.tensors) == sent
        assert sorted(sub_state(ctxs[c].state, PRIVATE)) == sorted(kept)
    g = ServerState.from_message(new).glob
    moved = [not torch.equal(g[k], init[k]) for k in head]
    assert all(moved) if "head" not in local else not any(moved)  # averaged: moved; private: the global keeps init
