"""The exchange seam: stages chained by ``method.exchange``, decided from their capability records before anything
loads, and the LoRA aggregation error of every round — each rule on hand-made tensors, then whole runs."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from conftest import assert_resumes_identically, tiny_overrides

from fedpeft.build import build
from fedpeft.comm.lora_pairs import A, B, pairs, products
from fedpeft.config import ConfigError
from fedpeft.exchange.aggregation_error import aggregation_error
from fedpeft.exchange.pipeline import merge_plans
from fedpeft.sharing.base import ClientPlan
from fedpeft.exchange.stages import STAGES
from fedpeft.methods.state import PRIVATE, ServerState
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded
from fedpeft.sharing.private_tensors import private_names
from fedpeft.tracking.rundir import RunDir

pytestmark = pytest.mark.usefixtures("one_thread")
TIERS = [{"name": "small", "share": 0.5, "rank": 2}, {"name": "large", "share": 0.5, "rank": 4}]


def _cfg(**over):
    base = {"method.adapter.num_tokens": None, "model.readout": "linear"}
    return load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in (base | over).items()}))


def _ranks_fedsa(**over):
    return _cfg(**{"method.name": "hetlora", "method.exchange": "[ranks, fedsa]", "method.aggregator.name": "fedavg",
                   "method.adapter.r": 4, "federation.client_profiles": json.dumps(TIERS), **over})


def _pruning_private(**over):
    return _cfg(**{"method.name": "headprune", "method.exchange": "[head_pruning, private]", **over})


# ---------------------------------------------------------------- the aggregation error on hand-made factors


def _factors(gen, rank=2, d_in=3, d_out=4):
    return {"m" + A: torch.randn(rank, d_in, generator=gen, dtype=torch.float64),
            "m" + B: torch.randn(d_out, rank, generator=gen, dtype=torch.float64)}


def test_fedavg_of_the_factors_is_inexact_by_the_cross_terms():
    g = torch.Generator().manual_seed(0)
    before, c1, c2 = _factors(g), _factors(g), _factors(g)
    mean = {k: 0.25 * c1[k] + 0.75 * c2[k] for k in c1}  # weights 1 : 3
    exact = 0.25 * c1["m" + B] @ c1["m" + A] + 0.75 * c2["m" + B] @ c2["m" + A]
    want = float(torch.linalg.norm(mean["m" + B] @ mean["m" + A] - exact) / torch.linalg.norm(exact))
    got = aggregation_error(before, mean, [c1, c2], [1, 3])
    assert want > 0.01 and got == pytest.approx(want, rel=1e-12)


def test_a_common_frozen_a_and_a_stack_are_exact():
    g = torch.Generator().manual_seed(1)
    before = _factors(g)
    bs = [torch.randn(4, 2, generator=g, dtype=torch.float64) for _ in range(3)]
    ffa = {"m" + A: before["m" + A], "m" + B: sum(b / 3 for b in bs)}  # FFA-LoRA: only B uploaded and averaged
    assert aggregation_error(before, ffa, [{"m" + B: b} for b in bs], [1, 1, 1]) < 1e-12
    fresh = [_factors(g, rank=1) for _ in range(2)]  # FLoRA: fresh blocks stacked under the global one
    stacked = {"m" + A: torch.cat([before["m" + A]] + [0.5 * f["m" + A] for f in fresh]),
               "m" + B: torch.cat([before["m" + B]] + [f["m" + B] for f in fresh], dim=1)}
    assert aggregation_error(before, stacked, fresh, [1, 1], fresh=True) < 1e-12
    assert aggregation_error(before, ffa, [{"m" + B: b} for b in bs], [1, 1, 1], skip=frozenset({"m" + B})) is None


# ---------------------------------------------------------------- what a chain may be


@pytest.mark.parametrize("chain, field, why", [
    ("[ffa, fedsa]", "method.exchange", "both decide which tensors are exchanged"),
    ("[ranks, head_pruning]", "method.exchange", "both decide the shape a tensor travels in"),
    ("[stacking, fedsa]", "method.exchange", "both decide which tensors are exchanged"),
    ("[fedsa, fedsa]", "method.exchange", "appears twice"),
    ("[fixed_split, ranks]", "method.exchange", "no adapter both serve"),
])
def test_a_chain_of_stages_deciding_the_same_thing_is_refused_naming_the_pair(chain, field, why):
    with pytest.raises(ConfigError, match=why) as e:
        _cfg(**{"method.name": "fedavg-lora", "method.exchange": chain})
    assert field in str(e.value)


def test_an_aggregator_reading_each_product_refuses_a_chain_that_keeps_b_private():
    with pytest.raises(ConfigError, match="hetlora.*reads each client's LoRA product"):
        _ranks_fedsa(**{"method.aggregator.name": "hetlora"})


def test_sharing_is_the_one_stage_chain_and_a_chain_takes_the_presets_settings():
    one = _cfg(**{"method.name": "fedsa-lora"})
    assert [s.name for s in one.method.stages()] == ["fedsa"] and one.method.exchange == []
    chain = _ranks_fedsa()
    assert [s.name for s in chain.method.stages()] == ["ranks", "fedsa"]
    assert chain.method.stages()[0].self_prune is True  # hetlora's ranks settings carry over
    assert chain.method.sharing.name == "ranks" and chain.method.components()["exchange"] == ["ranks", "fedsa"]
    assert _pruning_private(**{"method.sharing.sparsity": 0.5}).method.stages()[0].sparsity == 0.5  # --set sharing.*
    with pytest.raises(ConfigError, match="method.sharing: 'ffa' beside method.exchange"):
        _ranks_fedsa(**{"method.sharing.name": "ffa"})
    with pytest.raises(ConfigError, match="method.exchange.1.name: unknown sharing policy 'nope'"):
        _cfg(**{"method.name": "fedavg-lora", "method.exchange": "[all, nope]"})


def test_merged_plans_freeze_what_any_stage_freezes_and_add_the_penalties():
    m1 = {"x": torch.tensor([True, False, False])}
    m2 = {"x": torch.tensor([False, False, True]), "y": torch.tensor([True])}
    plan = merge_plans([ClientPlan(frozen=m1, penalty=lambda w: 1.0), ClientPlan(frozen=m2, penalty=lambda w: 2.0)],
                       ["a", "b"])
    assert plan.frozen["x"].tolist() == [True, False, True] and plan.frozen["y"].tolist() == [True]
    assert plan.penalty({}) == 3.0
    with pytest.raises(ValueError, match=r"stages \['a', 'b'\] both set the client's 'params'"):
        merge_plans([ClientPlan(params={}), ClientPlan(params={})], ["a", "b"])


def test_private_names_by_pattern_and_by_top_layer():
    names = ["enc.layer.0.q.lora_A.weight", "enc.layer.1.q.lora_A.weight", "enc.layer.1.q.lora_B.weight",
             "head.weight", "head.bias", "prefix.0", "prefix.1"]
    assert private_names(names, ["head.*"], 0) == {"head.weight", "head.bias"}
    assert private_names(names, [], 1) == {"enc.layer.1.q.lora_A.weight", "enc.layer.1.q.lora_B.weight", "prefix.1"}


# ---------------------------------------------------------------- whole runs


def test_ranks_with_fedsa_uploads_a_at_each_rank_and_keeps_b_and_the_head_on_the_device(tmp_path):
    cfg = _ranks_fedsa()
    run_embedded(cfg, tmp_path / "run")
    recs = RunDir(tmp_path / "run").read_metrics()
    ranks = {c["client"]: c["rank"] for c in recs[0]["clients"]}
    assert sorted(set(ranks.values())) == [2, 4] and all(c["status"] == "ok" for r in recs for c in r["clients"])
    assert "aggregation_error" not in recs[-1]["server"]  # B is private: the server never sees a product
    _, state, clients = RunDir(tmp_path / "run").load_checkpoint()[:3]
    st = ServerState.from_message(state)
    assert all(not st.glob[k].any() for k in st.glob if k.endswith(B))  # the global B: never trained on the server
    for cid, cstate in clients.items():
        own = {k[len(PRIVATE):]: v for k, v in cstate.tensors.items() if k.startswith(PRIVATE)}
        assert own and all(k.endswith(B) or k.startswith("head.") for k in own)
        assert any(v.any() for k, v in own.items() if k.endswith(B))  # each device trained its own B


def test_head_pruning_with_a_private_head_uploads_the_kept_heads_of_the_base_layers(tmp_path):
    cfg = _pruning_private(**{"method.sharing.sparsity": 0.5, "method.sharing.quota": "per_layer"})
    run_embedded(cfg, tmp_path / "run")
    rec = RunDir(tmp_path / "run").read_metrics()[-1]
    assert all(c["status"] == "ok" and c["kept_head_ids"] for c in rec["clients"])
    assert rec["server"]["aggregation_error"] > 0  # FedAvg of the factors of the shared layers
    method = build(cfg).method
    st = ServerState.from_message(method.server_init())
    shared = set(method.sharing.shared(st.glob, st.sharing, 1))
    top = max(int(k.split(".layer.")[1].split(".")[0]) for k in st.glob if ".layer." in k)
    assert shared and not any(k.startswith("head.") or f".layer.{top}." in k for k in shared)


@pytest.mark.parametrize("make", [_ranks_fedsa, _pruning_private], ids=["ranks+fedsa", "head_pruning+private"])
def test_a_chained_run_resumes_to_the_uninterrupted_records_and_state(make, tmp_path):
    assert_resumes_identically(make(**{"federation.rounds": 2}), tmp_path, stop_after_round=1)


# ---------------------------------------------------------------- conformance: every stage, chains of two


def _adapter_for(stages) -> str:
    """LoRA where every stage serves it (or no adapter serves them all: the checker refuses), else the first
    adapter they all serve."""
    served = None
    for n in stages:
        mine = STAGES.get(n).adapters
        served = mine if served is None else served if mine is None else served & mine
    return "lora" if served is None or "lora" in served or not served else sorted(served)[0]


def _chains() -> list[tuple[str, str]]:
    """Every ordered pair of registered stages that the checker accepts on an adapter both serve (``all``, which
    decides nothing, left out)."""
    out = []
    for a, b in itertools.permutations([n for n in STAGES.names() if n != "all"], 2):
        adapter = _adapter_for((a, b))
        try:
            _cfg(**{"method.name": "fedavg-lora", "method.adapter.name": adapter, "method.exchange": f"[{a}, {b}]",
                    **({"method.adapter.num_tokens": 2} if adapter == "deep_prompt" else {}),
                    **({"method.sharing.warmup_rounds": 1} if "layer_selection" in (a, b) else {})})
        except ConfigError:
            continue
        out.append((a, b))
    return out


# the adapters the gradient trainer trains, with the settings that make them tiny: a stage that names no adapters
# serves them all (the black-box adapters' uploads are their trainers' formats, checked by the formats' conformance)
GRADIENT_ADAPTERS = {"lora": {"method.adapter.r": 4}, "lora_sb": {"method.adapter.r": 4},
                     "soft_prompt": {"method.adapter.num_tokens": 2}, "deep_prompt": {"method.adapter.num_tokens": 2},
                     "p_tuning": {"method.adapter.num_tokens": 2}, "full": {}}


def _stage_cases() -> list[tuple[tuple[str, ...], str]]:
    """Every registered stage on every adapter it serves, then the sampled chains on an adapter both serve."""
    single = [((n,), a) for n in STAGES.names() for a in sorted(STAGES.get(n).adapters or GRADIENT_ADAPTERS)]
    return single + [(c, _adapter_for(c)) for c in _chains()[::2]]


@pytest.mark.parametrize("stages, adapter", _stage_cases(), ids=lambda x: "+".join(x) if isinstance(x, tuple) else x)
def test_every_stage_and_sampled_chains_round_trip_and_a_zero_update_stays_zero(stages, adapter, tmp_path,
                                                                                 monkeypatch):
    """Clients that do not move (their training returns what they started from) upload what they were sent: every
    stage's send, receive, upload, check and expand, on every adapter it serves, must give the aggregator replies of
    the declared shapes (all accepted) that leave each global tensor as it was (LoRA factors: the product B·A, which
    zero-padding keeps)."""
    import fedpeft.trainers.gradient as gradient

    monkeypatch.setattr(gradient, "train_local", lambda clf, params, *a, **k: gradient.TrainResult(
        {n: v.clone() for n, v in params.items()}, 1, 0.0, None))
    over = {"method.name": "fedavg-lora", "method.adapter.name": adapter, "federation.rounds": 1,
            "evaluation.local": False, "federation.client_profiles": json.dumps(TIERS), **GRADIENT_ADAPTERS[adapter]}
    if "layer_selection" in stages:
        over["method.sharing.warmup_rounds"] = 1
    if "ranks" not in stages and "stacking" not in stages:
        over["federation.client_profiles"] = None
    if "stacking" in stages:
        over |= {"method.aggregator.name": "stack"}
    over["method.exchange"] = "[" + ", ".join(stages) + "]"
    cfg = _cfg(**over)
    run_embedded(cfg, tmp_path / "run")
    rec = RunDir(tmp_path / "run").read_metrics()[-1]
    assert [c["status"] for c in rec["clients"]] == ["ok"] * len(rec["clients"]), rec["clients"]
    method = build(cfg).method
    start = ServerState.from_message(method.server_init()).glob
    end = ServerState.from_message(RunDir(tmp_path / "run").load_checkpoint()[1]).glob
    factors = {k for ab in pairs(start).values() for k in ab}
    for k in set(start) - factors:
        assert torch.equal(start[k], end[k]), k
    for m, p in products(start).items():
        torch.testing.assert_close(products(end)[m], p, atol=1e-6, rtol=0)


def test_fedex_makes_the_tiers_of_ranks_exact(tmp_path):
    """A combination no paper names: clients at their tiers' ranks (zero-padded, averaged) with FedEx-LoRA's residual
    folded in, so the padded average loses nothing: every round's aggregation error is float rounding."""
    cfg = _cfg(**{"method.name": "fedex-lora", "method.exchange": "[ranks, fedex]", "method.adapter.r": 4,
                  "federation.client_profiles": json.dumps(TIERS)})
    run_embedded(cfg, tmp_path / "run")
    recs = RunDir(tmp_path / "run").read_metrics()
    assert {c["rank"] for c in recs[0]["clients"]} == {2, 4}
    assert all(r["server"]["aggregation_error"] <= 1e-6 for r in recs)
