"""Clients of different LoRA ranks: resource tiers (``federation.client_profiles``), the ``ranks`` sharing policy
(truncated download, zero-padded upload), HetLoRA's sparsity-weighted aggregation and self-pruning, FlexLoRA's
SVD redistribution, FLoRA's stacking: each rule on small hand-made tensors, then whole runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import last_hidden_ours_and_peft, tiny_overrides

from fedpeft.aggregators.flexlora import FlexLoRA, svd_factors
from fedpeft.aggregators.hetlora import HetLoRA, sparsity_weights
from fedpeft.aggregators.stacking import compact, stack
from fedpeft.build import build_method
from fedpeft.comm.codec import Message, decode, encode
from fedpeft.comm.lora_pairs import A, B, pad, products, rank_mask, truncate
from fedpeft.comm.update import Update
from fedpeft.config import ClientProfile
from fedpeft.data.participants import profile_of_clients
from fedpeft.experiment import build_experiment
from fedpeft.methods.state import ServerState
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.runtime.validation import InvalidReply, validate_reply
from fedpeft.sharing.lora_ranks import tail_score
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS

pytestmark = pytest.mark.usefixtures("one_thread")
TIERS = [{"name": "small", "share": 0.5, "rank": 2}, {"name": "large", "share": 0.5, "rank": 8}]


def _cfg(preset: str, tiers=TIERS, **extra):
    over = {"method.name": preset, "model.name": "tiny-bert", "method.adapter.num_tokens": None,
            "method.adapter.r": 8, "federation.num_clients": 4, "federation.client_profiles": tiers, **extra}
    return load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in over.items()}))


def _lora(gen: torch.Generator, rank: int, d_in: int = 5, d_out: int = 4, modules=("m1", "m2")):
    return {k: v for m in modules for k, v in ((m + A, torch.randn(rank, d_in, generator=gen)),
                                               (m + B, torch.randn(d_out, rank, generator=gen)))}


# ---------------------------------------------------------------- the rules on hand-made tensors


def test_truncation_and_zero_padding_keep_the_product():
    g = torch.Generator().manual_seed(0)
    p = _lora(g, 3) | {"head": torch.randn(2)}
    padded = pad(p, 7)
    assert padded[f"m1{A}"].shape == (7, 5) and padded[f"m1{B}"].shape == (4, 7)
    assert torch.equal(padded["head"], p["head"])
    for m, d in products(padded).items():
        torch.testing.assert_close(d, products(p)[m])  # zero rows of A and zero columns of B add nothing
    back = truncate(padded, 3)
    assert all(torch.equal(back[k], p[k]) for k in p)
    mask = rank_mask(padded, 3)
    assert not mask[f"m1{A}"][:3].any() and mask[f"m1{A}"][3:].all() and mask[f"m1{B}"][:, 3:].all()


def test_tiers_are_assigned_by_largest_remainder_and_by_the_seed():
    tiers = [ClientProfile(name=n, share=s, rank=r) for n, s, r in (("a", 0.34, 4), ("b", 0.33, 8), ("c", 0.33, 16))]
    got = profile_of_clients(tiers, 10, seed=0)
    assert [sum(p is t for p in got) for t in tiers] == [4, 3, 3]  # 3.4, 3.3, 3.3: the one left goes to a
    assert [p.name for p in got] == [p.name for p in profile_of_clients(tiers, 10, seed=0)]
    assert [p.name for p in got] != [p.name for p in profile_of_clients(tiers, 10, seed=1)]
    assert profile_of_clients([], 3, 0) == [None, None, None]


def test_flexlora_factors_are_the_truncated_svd_numpy_gives():
    delta = torch.randn(6, 9, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    b, a = svd_factors(delta, 3)
    u, s, vh = np.linalg.svd(delta.numpy(), full_matrices=False)
    np.testing.assert_allclose((b @ a).numpy(), (u[:, :3] * s[:3]) @ vh[:3], atol=1e-10)
    np.testing.assert_allclose(a.numpy() @ a.numpy().T, np.eye(3), atol=1e-10)  # A = V_rᵀ: orthonormal rows
    b, a = svd_factors(delta[:2], 4)  # fewer singular values than the rank: zero-padded
    assert b.shape == (2, 4) and a.shape == (4, 9) and not a[2:].any()
    torch.testing.assert_close(b @ a, delta[:2])


def test_flexlora_averages_the_clients_products_of_mixed_ranks_then_truncates():
    g = torch.Generator().manual_seed(2)
    glob = pad(_lora(g, 4), 4)
    ups = [Update(k, pad(_lora(g, r), 4), n) for k, (r, n) in enumerate([(1, 10), (2, 30), (4, 60)])]
    new, _ = FlexLoRA(None, None).aggregate(glob, ups, Message(), 1)
    for m in ("m1", "m2"):
        mean = sum(w * products(u.tensors)[m] for w, u in zip((0.1, 0.3, 0.6), ups))
        u_, s, vh = np.linalg.svd(mean.numpy(), full_matrices=False)
        want = (u_[:, :4] * s[:4]) @ vh[:4]  # the rank-4 truncation of Σ_k p_k B_k A_k (p by example counts)
        np.testing.assert_allclose(products(new)[m].numpy(), want, atol=1e-5)
        # a rank-2 client's download is the best rank-2 approximation of the same mean
        np.testing.assert_allclose(products(truncate(new, 2))[m].numpy(), (u_[:, :2] * s[:2]) @ vh[:2], atol=1e-5)


def test_hetlora_weights_by_the_norm_of_each_clients_product_over_zero_padded_factors():
    g = torch.Generator().manual_seed(3)
    small, large = pad(_lora(g, 1), 3), _lora(g, 3)
    large = {k: 5 * v for k, v in large.items()}
    norms = [float(torch.sqrt(sum((d ** 2).sum() for d in products(p).values()))) for p in (small, large)]
    w = sparsity_weights([small, large])
    assert w == pytest.approx([n / sum(norms) for n in norms]) and w[1] > w[0]
    new, _ = HetLoRA(None, None).aggregate(large, [Update(0, small, 1), Update(1, large, 1000)], Message(), 1)
    for k in small:  # the example counts do not enter: only the norms
        torch.testing.assert_close(new[k], (w[0] * small[k].double() + w[1] * large[k].double()).float())
    # the rows only the large client trained are its rows scaled by its weight (the small client's padding is zero)
    torch.testing.assert_close(new[f"m1{A}"][1:], large[f"m1{A}"][1:] * w[1])


def test_tail_score_is_the_sum_of_products_of_the_tail_norms():
    g = torch.Generator().manual_seed(4)
    p = _lora(g, 4)
    want = sum(float(p[m + B][:, 3:].norm() * p[m + A][3:].norm()) for m in ("m1", "m2"))
    assert float(tail_score(p, [(f"m1{A}", f"m1{B}"), (f"m2{A}", f"m2{B}")], 3, 4)) == pytest.approx(want)


def test_stacking_adds_the_weighted_products_exactly_and_compaction_keeps_them():
    g = torch.Generator().manual_seed(6)
    glob = _lora(g, 2)
    ups = [_lora(g, r) for r in (1, 3)]
    new = stack(glob, ups, [1.0, 3.0])
    assert new[f"m1{A}"].shape == (6, 5) and new[f"m1{B}"].shape == (4, 6)
    for m in ("m1", "m2"):  # B A + Σ p_k B_k A_k, p = (1/4, 3/4), with no cross terms
        want = products(glob)[m] + 0.25 * products(ups[0])[m] + 0.75 * products(ups[1])[m]
        torch.testing.assert_close(products(new)[m], want, rtol=1e-5, atol=1e-5)
    small = compact(new)  # 6 rows > D = min(4, 5): re-factorised exactly at rank 4
    assert small[f"m1{A}"].shape == (4, 5) and small[f"m1{B}"].shape == (4, 4)
    for m in ("m1", "m2"):
        torch.testing.assert_close(products(small)[m], products(new)[m], rtol=1e-5, atol=1e-5)
    assert compact(glob) is glob  # 2 rows: nothing to do


def test_stacking_leaves_out_the_initial_lora_whose_product_is_zero():
    g = torch.Generator().manual_seed(7)
    init = {k: (torch.zeros_like(v) if k.endswith(B) else v) for k, v in _lora(g, 2).items()}  # B = 0: ΔW = 0
    ups = [_lora(g, r) for r in (1, 3)]
    new = stack(init, ups, [1.0, 1.0])
    assert new[f"m1{A}"].shape == (4, 5) and new[f"m1{B}"].shape == (4, 4)  # Σ r_k rows, none of the initial 2
    for m in ("m1", "m2"):
        torch.testing.assert_close(products(new)[m], 0.5 * products(ups[0])[m] + 0.5 * products(ups[1])[m])
    again = stack(new, ups[:1], [1.0])  # a stack with a non-zero product is kept
    assert again[f"m1{A}"].shape == (5, 5)


# ---------------------------------------------------------------- runs with resource tiers


def _round_one(cfg):
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    state = method.server_init()
    inst = method.configure_round(state, 1, list(range(4)))
    return exp, method, state, inst


@pytest.mark.parametrize("preset", ["flexlora", "hetlora"])
def test_each_tier_receives_trains_and_uploads_at_its_rank(preset):
    exp, method, state, inst = _round_one(_cfg(preset, **{"method.sharing.self_prune": False}))
    schema = method.reply_schema(state)
    replies = {}
    for c in range(4):
        rank = exp.profiles[c].rank
        assert {tuple(v.shape) for k, v in inst[c].tensors.items() if k.endswith(A)} == {(rank, 32)}
        client = exp.client(c)
        reply = decode(encode(method.client_update(inst[c], client), method.wire))
        validate_reply(reply, schema, c)
        assert reply.scalars["rank"] == rank
        assert {tuple(v.shape) for k, v in reply.tensors.items() if k.endswith(B)} == {(32, rank)}
        replies[c] = reply
    small = [c for c in range(4) if exp.profiles[c].rank == 2]
    large = [c for c in range(4) if exp.profiles[c].rank == 8]
    assert len(encode(inst[small[0]], method.wire)) < 0.4 * len(encode(inst[large[0]], method.wire))
    # a reply is accepted only at the rank of its client: a small client's reply in a large client's place fails
    with pytest.raises(InvalidReply, match="rank"):
        validate_reply(replies[small[0]], schema, large[0])
    with pytest.raises(InvalidReply, match="rank"):
        validate_reply(replies[large[0]], schema, small[0])
    forged = Message(truncate(replies[large[0]].tensors, 2), dict(replies[large[0]].scalars))  # says rank 8
    with pytest.raises(InvalidReply, match="rank"):
        validate_reply(forged, schema, large[0])
    glob = ServerState.from_message(method.aggregate(state, 1, replies)).glob
    assert {tuple(v.shape) for k, v in glob.items() if k.endswith(A)} == {(8, 32)}  # the global LoRA at r = 8


def test_the_padding_beyond_a_clients_rank_stays_zero_while_it_trains():
    exp, method, state, inst = _round_one(_cfg("flexlora", **{"method.trainer.weight_decay": 0.1}))
    c = next(c for c in range(4) if exp.profiles[c].rank == 2)
    client = exp.client(c)
    start = method.sharing.client_params(method.format.start(inst[c]), {})
    plan = method.sharing.plan(start, inst[c], client, 1)
    update, _ = method.trainer.fit(start, inst[c], client, 1, {}, frozen=plan.frozen)
    for k, v in update.tensors.items():
        if k.endswith(A):
            assert not v[2:].any() and v[:2].ne(start[k][:2]).any()
        elif k.endswith(B):
            assert not v[:, 2:].any()


def test_self_pruning_drops_the_tail_when_its_score_falls():
    cfg = _cfg("hetlora", **{"method.sharing.prune_lambda": 50.0, "federation.rounds": 3})
    exp, method, state, inst = _round_one(cfg)
    # a received LoRA with a large tail: the penalty shrinks it, so the client prunes to ⌊0.99·8⌋ = 7
    c = next(c for c in range(4) if exp.profiles[c].rank == 8)
    g = torch.Generator().manual_seed(5)
    loud = Message({k: torch.randn(v.shape, generator=g) for k, v in inst[c].tensors.items()}, dict(inst[c].scalars))
    reply = method.client_update(loud, exp.client(c))
    assert reply.scalars["rank"] == 7 and reply.scalars["tail_score"] >= 0
    assert {tuple(v.shape) for k, v in reply.tensors.items() if k.endswith(A)} == {(7, 32)}
    validate_reply(decode(encode(reply, method.wire)), method.reply_schema(state), c)  # lower rank: accepted
    deeper = Message(truncate(reply.tensors, 6), dict(reply.scalars) | {"rank": 6})  # below what pruning gives
    with pytest.raises(InvalidReply, match="rank 8 \\(or 7 after self-pruning\\)"):
        validate_reply(decode(encode(deeper, method.wire)), method.reply_schema(state), c)
    new = method.aggregate(state, 1, {c: decode(encode(reply, method.wire))})
    assert ServerState.from_message(new).sharing.scalars["ranks"][str(c)] == 7
    assert {tuple(v.shape) for k, v in method.configure_round(new, 2, [c])[c].tensors.items()
            if k.endswith(A)} == {(7, 32)}  # and it is sent rank 7 from then on


def test_tier_step_caps_apply_per_client(tmp_path):
    tiers = [{"name": "slow", "share": 0.5, "rank": 2, "max_steps": 1}, {"name": "fast", "share": 0.5, "rank": 8}]
    cfg = _cfg("flexlora", tiers, **{"federation.rounds": 1, "method.trainer.max_steps": 3})
    summary = run_embedded(cfg, tmp_path / "run")
    rec = RunDir(tmp_path / "run").read_metrics()[0]
    tier = {int(c): name for c, name in summary["client_tiers"].items()}
    assert sorted(set(tier.values())) == ["fast", "slow"]
    for c in rec["clients"]:
        assert c["steps"] == (1 if tier[c["client"]] == "slow" else 3)
        assert c["rank"] == (2 if tier[c["client"]] == "slow" else 8)


@pytest.mark.parametrize("preset", ["hetlora", "flexlora"])
def test_a_tiered_run_resumes_to_the_uninterrupted_records(preset, tmp_path):
    cfg = _cfg(preset, **{"federation.rounds": 2})
    run_embedded(cfg, tmp_path / "full")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1)
    run_embedded(cfg, tmp_path / "cut", resume=True)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]  # noqa: E731
    full = RunDir(tmp_path / "full").read_metrics()
    assert strip(RunDir(tmp_path / "cut").read_metrics()) == strip(full)
    assert "local_accuracy" in full[-1]  # each client scored at its own rank
    # a client's adapter (predict / export --client) is the global LoRA at that client's rank
    from fedpeft.predict import open_model

    glob = open_model(tmp_path / "full").params
    ranks = ServerState.from_message(RunDir(tmp_path / "full").load_checkpoint()[1]).sharing.scalars["ranks"]
    for c in range(4):  # (its tier's rank, or lower after self-pruning)
        own = open_model(tmp_path / "full", client=c).params
        want = pad(truncate(glob, ranks[str(c)]), 8)
        assert set(own) == set(want), set(own) ^ set(want)
        assert all(torch.equal(own[k], want[k]) for k in own)


@pytest.mark.parametrize("over, match", [
    ({"method.name": "fedavg-lora"}, "client_profiles.0.rank: sharing 'head_pruning'"),
    ({"method.adapter.r": 4}, "client_profiles.1.rank: 8 exceeds method.adapter.r"),
])
def test_tiers_the_method_cannot_honour_fail_before_loading(over, match):
    from fedpeft.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match=match):
        _cfg("flexlora", **over)


def test_a_step_cap_needs_a_gradient_trainer():
    from fedpeft.config import ConfigError

    tiers = [{"name": "all", "share": 1.0, "max_steps": 2}]
    with pytest.raises((ConfigError, ValueError), match="client_profiles.0.max_steps: trainer 'cmaes'"):
        load_config(None, tiny_overrides(method__name="fedbpt", method__trainer__max_steps=None,
                                         method__trainer__batch_size=None, federation__client_profiles=tiers))
    with pytest.raises((ConfigError, ValueError), match="shares must sum to 1"):
        load_config(None, tiny_overrides(federation__client_profiles=[{"name": "a", "share": 0.5}]))


def test_flora_clients_train_a_fresh_lora_over_the_frozen_stack_and_upload_it_alone():
    cfg = _cfg("flora", **{"method.trainer.weight_decay": 0.1})
    exp, method, state, inst = _round_one(cfg)
    glob = ServerState.from_message(state).glob
    schema = method.reply_schema(state)
    replies = {}
    for c in range(4):
        client = exp.client(c)
        start = method.sharing.client_params(method.format.start(inst[c]), {})
        plan = method.sharing.plan(start, inst[c], client, 1)
        rank = exp.profiles[c].rank
        update, _ = method.trainer.fit(plan.params, inst[c], client, 1, {}, frozen=plan.frozen)
        for k, v in update.tensors.items():  # the stack is frozen, the fresh block (A drawn anew, B = 0) trained
            if k.endswith(A):
                assert torch.equal(v[:8], glob[k]) and v.shape == (8 + rank, 32) and v[8:].ne(0).any()
            elif k.endswith(B):
                assert torch.equal(v[:, :8], glob[k]) and v[:, 8:].ne(0).any()
        reply = decode(encode(method.client_update(inst[c], client), method.wire))
        validate_reply(reply, schema, c)
        assert {tuple(v.shape) for k, v in reply.tensors.items() if k.endswith(A)} == {(rank, 32)}
        replies[c] = reply
    small = next(c for c in range(4) if exp.profiles[c].rank == 2)
    large = next(c for c in range(4) if exp.profiles[c].rank == 8)
    with pytest.raises(InvalidReply, match="rank"):
        validate_reply(replies[small], schema, large)
    new = ServerState.from_message(method.aggregate(state, 1, replies)).glob
    n = {c: float(len(exp.client(c).train)) for c in range(4)}
    ups = {c: {k: v.float() for k, v in replies[c].tensors.items()} for c in range(4)}
    for m in products(glob):  # exact: the global product gains Σ_k (n_k / N) B_k A_k
        want = products(glob)[m] + sum(n[c] / sum(n.values()) * products(ups[c])[m] for c in range(4))
        torch.testing.assert_close(products(new)[m], want, rtol=1e-4, atol=1e-6)


def test_flora_runs_with_tiers_resumes_and_exports_its_grown_stack_for_peft(tmp_path):
    from typer.testing import CliRunner

    from fedpeft.cli import app
    from fedpeft.predict import open_model

    cfg = _cfg("flora", **{"federation.rounds": 2})
    exp = build_experiment(cfg)
    run_embedded(cfg, tmp_path / "full", experiment=exp)
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", experiment=exp, stop_after_round=1)
    run_embedded(cfg, tmp_path / "cut", experiment=exp, resume=True)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]  # noqa: E731
    full = RunDir(tmp_path / "full").read_metrics()
    assert strip(RunDir(tmp_path / "cut").read_metrics()) == strip(full)
    assert full[1]["bytes_down"] > full[0]["bytes_down"]  # the stack (and its download) grew
    res = CliRunner().invoke(app, ["export", str(tmp_path / "full"), str(tmp_path / "peft")])
    assert res.exit_code == 0, res.output
    params = open_model(tmp_path / "full").params
    assert {tuple(v.shape) for k, v in params.items() if k.endswith(A)} == {(32, 32)}  # compacted to D = 32
    ours, theirs = last_hidden_ours_and_peft(exp, params, tmp_path / "peft")
    assert torch.allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("preset, tiers", [("ffa-lora", []), ("hetlora", TIERS), ("flexlora", TIERS)])
def test_the_final_global_lora_exports_for_peft(preset, tiers, tmp_path):
    """The global LoRA after mixed-rank rounds (HetLoRA's zero-padded, FlexLoRA's SVD factors at the global rank)
    or with FFA-LoRA's frozen A, loaded by ``PeftModel.from_pretrained``, gives fedpeft's outputs."""
    from typer.testing import CliRunner

    from fedpeft.cli import app
    from fedpeft.predict import open_model

    cfg = _cfg(preset, tiers=tiers, **{"federation.rounds": 2})
    exp = build_experiment(cfg)
    run_embedded(cfg, tmp_path / "run", experiment=exp)
    res = CliRunner().invoke(app, ["export", str(tmp_path / "run"), str(tmp_path / "peft")])
    assert res.exit_code == 0, res.output
    params = open_model(tmp_path / "run").params
    assert any(bool(v.abs().sum() > 0) for k, v in params.items() if k.endswith(B))  # trained, not the zero init
    ours, theirs = last_hidden_ours_and_peft(exp, params, tmp_path / "peft")
    assert torch.allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("over, match", [
    ({"method.aggregator.name": "fedavg"}, "sharing 'stacking' uploads what only stack can combine"),
    ({"method.sharing.name": "all"}, "'stack' reads \\['fresh_lora'\\]"),
    ({"method.wrappers": [{"name": "clip", "max_norm": 1.0}]},  # a fresh block has no difference from the stack
     "method.wrappers.0.name: 'clip' works on each client's difference from the global model; sharing 'stacking'"),
    ({"method.trainer.reset_optimizer": False},  # Adam's moments would belong to last round's fresh block
     "method.trainer.reset_optimizer: false carries optimizer moments from round to round; sharing 'stacking'"),
])
def test_stacking_and_its_aggregator_go_together(over, match):
    from fedpeft.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match=match):
        _cfg("flora", tiers=[], **over)
