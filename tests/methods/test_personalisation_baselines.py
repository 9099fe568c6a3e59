"""Personalisation baselines for FedPepTAO's private layers: local-only, FedAvg + FT, fixed private splits."""

from __future__ import annotations

from itertools import combinations

import pytest
import torch

from fedpeft.build import build_method
from fedpeft.clients import sub_state
from fedpeft.comm.codec import decode
from fedpeft.config import ConfigError
from fedpeft.experiment import build_experiment
from fedpeft.methods import PRESETS
from fedpeft.methods.state import POST_TUNE, PRIVATE, ServerState
from fedpeft.rng import numpy_rng
from fedpeft.runtime.embedded import run_embedded
from fedpeft.sharing.layer_orders import num_selected
from fedpeft.sharing.private import split_layers
from fedpeft.tracking.rundir import RunDir


def _build(cfg):
    exp = build_experiment(cfg)
    return exp, build_method(cfg, exp)


def _train(method, contexts, rounds: int):
    """``rounds`` rounds through the method's pure functions, every given client each round; the server state."""
    state = method.server_init()
    for rnd in range(1, rounds + 1):
        instructions = method.configure_round(state, rnd, sorted(contexts))
        replies = {c: method.client_update(m, contexts[c]) for c, m in instructions.items()}
        state = method.aggregate(state, rnd, replies)
    return state


def test_presets_are_listed():
    for name in ("local-only", "fedavg-ft", "fedper", "lg-fedavg"):
        assert name in PRESETS


# ---------------------------------------------------------------- local-only


@pytest.mark.parametrize("adapter", ["deep_prompt", "soft_prompt"])
def test_local_only_clients_train_alone_and_are_scored_on_their_own_shard(tiny_cfg, adapter):
    cfg = tiny_cfg(method__name="local-only", method__adapter__name=adapter)
    exp, method = _build(cfg)
    init = method.initial_params()
    together = {c: exp.client(c) for c in range(3)}
    state = method.server_init()
    for rnd in (1, 2):
        instructions = method.configure_round(state, rnd, sorted(together))
        replies = {c: method.client_update(m, together[c]) for c, m in instructions.items()}
        assert not set(init) & {k for m in [*instructions.values(), *replies.values()] for k in m.tensors}
        state = method.aggregate(state, rnd, replies)
    glob = ServerState.from_message(state).glob
    assert set(glob) == set(init) and all(torch.equal(glob[k], init[k]) for k in init)  # never aggregated
    own = {c: sub_state(ctx.state, PRIVATE) for c, ctx in together.items()}
    assert all(set(p) == set(init) for p in own.values())
    assert all(any(not torch.equal(a[k], b[k]) for k in init) for a, b in combinations(own.values(), 2))
    # client 0 trained with the others present ends exactly where it ends training alone: nothing is mixed
    alone = {0: exp.client(0)}
    _train(method, alone, 2)
    mine = sub_state(alone[0].state, PRIVATE)
    assert all(torch.equal(mine[k], own[0][k]) for k in init)
    # the personalised evaluation scores each client's own tensors on its own test shard
    for c, ctx in together.items():
        instruction = method.configure_evaluate(state, 2, [c])[c]
        assert method.client_evaluate(instruction, ctx).scalars == method.trainer.evaluate(own[c], ctx.test)


# ---------------------------------------------------------------- FedAvg + FT


def test_fedavg_ft_fine_tunes_the_final_global_model_on_the_whole_local_shard(tiny_cfg):
    cfg = tiny_cfg(method__name="fedavg-ft")
    assert cfg.method.aggregator.name == "fedavg" and cfg.method.sharing.name == "all"
    exp, method = _build(cfg)
    contexts = {c: exp.client(c) for c in range(3)}
    state = _train(method, contexts, cfg.federation.rounds)
    glob = ServerState.from_message(state).glob
    assert POST_TUNE not in method.configure_evaluate(state, 1, [0])[0].scalars  # only after the last round
    final = method.configure_evaluate(state, 2, [0])[0]
    assert final.scalars[POST_TUNE]
    ctx = contexts[0]
    out = method.client_evaluate(final, ctx).scalars
    assert out["post_shots"] == len(ctx.train) and out["post_steps"] == 20
    assert out["accuracy_global"] == method.trainer.evaluate(glob, ctx.test)["accuracy"]
    tuned, _ = method.post_tuning.tune(glob, ctx.train, numpy_rng(ctx.seed, 2, 0, "post-tuning"))
    assert set(tuned) == set(glob) and all(not torch.equal(tuned[k], glob[k]) for k in glob)
    assert out["accuracy"] == method.trainer.evaluate(tuned, ctx.test)["accuracy"]
    with pytest.raises(ConfigError, match="shots"):
        tiny_cfg(method__name="fedavg-ft", method__post_tuning__select="dev")


# ---------------------------------------------------------------- fixed private split (FedPer, LG-FedAvg)


def test_split_layers_and_adapter_check(tiny_cfg):
    assert split_layers(6, "top", None) == [0, 1, 2] and split_layers(6, "bottom", None) == [3, 4, 5]
    assert split_layers(5, "top", None) == [0, 1, 2] and split_layers(5, "bottom", None) == [2, 3, 4]
    assert len(split_layers(5, "top", None)) == num_selected(0.5, 5)  # as many shared layers as FedPepTAO at r=0.5
    assert split_layers(4, "bottom", 0) == [0, 1, 2, 3] and split_layers(4, "top", 4) == []
    with pytest.raises(ValueError, match="num_private"):
        split_layers(2, "top", 3)
    with pytest.raises(ConfigError, match="method.sharing.name: 'fixed_split' shares the layers of deep_prompt"):
        tiny_cfg(method__name="fedper", method__adapter__name="soft_prompt")


@pytest.mark.parametrize("name, private, shared", [("fedper", 1, 0), ("lg-fedavg", 0, 1)])
def test_private_layers_are_never_uploaded_and_differ_per_client(tiny_cfg, tmp_path, name, private, shared):
    """tiny-bert has L = 2 layers, k = ⌊L/2⌋ = 1: FedPer keeps the top layer private, LG-FedAvg the bottom one."""
    cfg = tiny_cfg(method__name=name)
    uploads: dict[tuple[int, int], set[str]] = {}

    def hook(rnd, cid, data):
        uploads[(rnd, cid)] = set(decode(data).tensors)
        return data

    run_embedded(cfg, tmp_path / "run", reply_hook=hook)
    p, s = f"prefix.{private}", f"prefix.{shared}"
    assert len(uploads) == 2 * 3 and all(keys == {s} for keys in uploads.values())  # from round 1 on
    _, state, clients, _ = RunDir(tmp_path / "run").load_checkpoint()
    assert state.scalars["sharing"]["selected"] == [shared]
    _, method = _build(cfg)
    init = method.initial_params()
    assert torch.equal(state.tensors[p], init[p]) and not torch.equal(state.tensors[s], init[s])
    views = {c: method.sharing.client_params({s: state.tensors[s]}, sub_state(m, PRIVATE)) for c, m in clients.items()}
    assert len(views) == 3
    assert all(torch.equal(v[s], state.tensors[s]) for v in views.values())  # shared: the aggregate on every client
    assert all(not torch.equal(v[p], init[p]) for v in views.values())  # private: trained on the device ...
    assert all(not torch.equal(a[p], b[p]) for a, b in combinations(views.values(), 2))  # ... and its own
