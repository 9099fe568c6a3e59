"""FedOpt family, median, trimmed mean, (Multi-)Krum and the clipping wrapper: invariants, hand-computed
equations, and agreement with Flower 1.41's own strategies on the same arrays."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedpeft.aggregators.base import AGGREGATORS, WRAPPERS, AggregatorBase, AggregatorContext
from fedpeft.aggregators.clipping import Clip, ClipSettings, clip_updates
from fedpeft.aggregators.fedavg import FedAvg
from fedpeft.aggregators.fedopt import (
    FedAdagrad,
    FedAdagradSettings,
    FedAdam,
    FedAdamSettings,
    FedAvgM,
    FedAvgMSettings,
    FedYogi,
    FedYogiSettings,
    adaptive_lr,
)
from fedpeft.aggregators.krum import Krum, KrumSettings, MultiKrum, MultiKrumSettings, krum_scores
from fedpeft.aggregators.median import Median, coordinate_median
from fedpeft.aggregators.trimmed_mean import TrimmedMean, TrimmedMeanSettings, trimmed_mean
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update

flwr_strategy = pytest.importorskip("flwr.serverapp.strategy")
from flwr.app import Array, ArrayRecord, Metadata, MetricRecord, RecordDict  # noqa: E402
from flwr.app import Message as FlwrMessage  # noqa: E402

logging.getLogger("flwr").setLevel(logging.WARNING)

CTX = AggregatorContext(num_clients=5, seed=0)
SHAPES = {"a": (3, 2), "b": (4,)}


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def make_glob(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}


def make_updates(glob, n=5, scale=1.0, seed=1, weights=None) -> list[Update]:
    g = torch.Generator().manual_seed(seed)
    weights = weights or [3, 1, 4, 1, 5, 9, 2][:n]
    return [Update(i, {k: v + scale * torch.randn(v.shape, generator=g) for k, v in glob.items()}, weights[i])
            for i in range(n)]


# The invariants every aggregator shares (declared needs, order independence, fixed points, the state through the
# codec) run over the registry in tests/conformance/test_aggregators.py.


def test_fedavgm_defaults_are_fedavg_fixed_point():
    glob = make_glob()
    xc = {k: v + 1.0 for k, v in glob.items()}
    agg = FedAvgM(FedAvgMSettings(), CTX)
    out, state = agg.aggregate(glob, [Update(i, dict(xc), 2 + i) for i in range(3)], agg.init(glob), 1)
    for k in glob:
        torch.testing.assert_close(out[k], xc[k], rtol=0, atol=0)
    assert state.tensors == {}  # Flower keeps no momentum vector when mu = 0


# ---------------------------------------------------------------- equations on hand-made numbers


def scalar_updates(values, weights=None, glob=0.0):
    weights = weights or [1] * len(values)
    return {"w": t(glob)}, [Update(i, {"w": t(v)}, w) for i, (v, w) in enumerate(zip(values, weights))]


def test_median_by_hand():
    assert coordinate_median([t(1.0), t(2.0), t(10.0)]).item() == 2.0
    assert coordinate_median([t(1.0), t(20.0), t(2.0), t(10.0)]).item() == 6.0  # even: mean of 2 and 10
    glob = {"w": t(0.0, 0.0)}
    ups = [Update(0, {"w": t(1.0, 7.0)}, 100), Update(1, {"w": t(2.0, -1.0)}, 1), Update(2, {"w": t(10.0, 3.0)}, 1)]
    out, _ = Median(None, CTX).aggregate(glob, ups, Message(), 1)
    assert out["w"].tolist() == [2.0, 3.0]  # unweighted, coordinate by coordinate


def test_trimmed_mean_by_hand():
    vals = [t(1.0, 50.0), t(2.0, -40.0), t(3.0, 3.0), t(4.0, 4.0), t(100.0, 5.0)]
    # beta = 0.2, n = 5: drop int(0.2 * 5) = 1 value at each end, average the middle 3
    assert trimmed_mean(vals, 0.2).tolist() == [3.0, 4.0]
    glob, ups = scalar_updates([1.0, 2.0, 3.0, 4.0, 100.0], weights=[1, 1, 1, 1, 1000])
    out, _ = TrimmedMean(TrimmedMeanSettings(beta=0.2), CTX).aggregate(glob, ups, Message(), 1)
    assert out["w"].item() == 3.0
    # beta = 0.25, n = 4: drop 1 at each end -> mean of 2 and 3; beta = 0: plain mean
    assert trimmed_mean([t(1.0), t(2.0), t(3.0), t(10.0)], 0.25).item() == 2.5
    assert trimmed_mean([t(1.0), t(2.0), t(3.0), t(10.0)], 0.0).item() == 4.0
    assert TrimmedMeanSettings().beta == 0.2  # Flower's FedTrimmedAvg default
    with pytest.raises(ValidationError):
        TrimmedMeanSettings(beta=0.5)
    with pytest.raises(ValueError, match=r"method\.aggregator\.beta"):
        trimmed_mean([t(1.0), t(2.0)], 0.5)  # (bypassing the settings bound) nothing would remain


# Krum, f = 1, n = 5 -> each score sums the n - f - 2 = 2 smallest squared distances to the others.
# deltas 0, .25, .5, .75, 10 (exact in binary):
#   s(0)   = .0625 + .25   = .3125        s(.25) = .0625 + .0625 = .125
#   s(.5)  = .0625 + .0625 = .125         s(.75) = .0625 + .25   = .3125
#   s(10)  = 9.25² + 9.5²  = 175.8125
KRUM_DELTAS = [0.0, 0.25, 0.5, 0.75, 10.0]


def krum_case(weights=(1, 2, 3, 4, 5)):
    glob = {"a": t(1.0), "b": t(-2.0)}
    ups = [Update(i, {"a": t(1.0 + d), "b": t(-2.0)}, w) for i, (d, w) in enumerate(zip(KRUM_DELTAS, weights))]
    return glob, ups


def test_krum_by_hand():
    scores = krum_scores(torch.tensor(KRUM_DELTAS, dtype=torch.float64).view(-1, 1), f=1)
    assert scores.tolist() == [0.3125, 0.125, 0.125, 0.3125, 175.8125]
    glob, ups = krum_case()
    out, _ = Krum(KrumSettings(num_malicious=1), CTX).aggregate(glob, ups, Message(), 1)
    assert out == {"a": t(1.25), "b": t(-2.0)}  # tie .125 between clients 1 and 2 -> lowest id; outlier ignored
    out_rev, _ = Krum(KrumSettings(num_malicious=1), CTX).aggregate(glob, ups[::-1], Message(), 1)
    assert out_rev == out
    # Multi-Krum m = 3: clients 1, 2 (.125) then the tie .3125 between 0 and 3 -> 0; weighted by n_k 1, 2, 3
    mk = MultiKrum(MultiKrumSettings(num_malicious=1, num_selected=3), CTX)
    out, _ = mk.aggregate(glob, ups, Message(), 1)
    torch.testing.assert_close(out["a"], t(1.0 + (1 * 0.0 + 2 * 0.25 + 3 * 0.5) / 6))
    mk_u = MultiKrum(MultiKrumSettings(num_malicious=1, num_selected=3, weighting="uniform"), CTX)
    out, _ = mk_u.aggregate(glob, ups, Message(), 1)
    torch.testing.assert_close(out["a"], t(1.25))


def test_krum_errors_name_the_field():
    with pytest.raises(ValueError, match=r"method\.aggregator\.num_malicious"):
        Krum(KrumSettings(num_malicious=2), CTX)  # 5 clients < 2f + 3 = 7
    glob, ups = krum_case()
    with pytest.raises(ValueError, match=r"method\.aggregator\.num_malicious"):
        Krum(KrumSettings(num_malicious=1), CTX).aggregate(glob, ups[:4], Message(), 1)  # 4 < 5 this round
    with pytest.raises(ValueError, match=r"method\.aggregator\.num_selected"):
        MultiKrum(MultiKrumSettings(num_selected=6), CTX)
    with pytest.raises(ValueError, match=r"method\.aggregator\.num_selected"):
        MultiKrum(MultiKrumSettings(num_selected=4), CTX).aggregate(glob, ups[:3], Message(), 1)
    with pytest.raises(ValidationError):
        KrumSettings(num_malicious=-1)


def test_clipping_by_hand():
    glob = {"a": t(1.0), "b": t(2.0)}
    big = Update(0, {"a": t(4.0), "b": t(6.0)}, 1)      # delta (3, 4): norm 5 -> scaled by 1/5
    small = Update(1, {"a": t(1.3), "b": t(2.4)}, 1)    # delta (.3, .4): norm .5 -> unchanged
    out, clipped = clip_updates(glob, [big, small], max_norm=1.0)
    assert clipped == 1
    torch.testing.assert_close(out[0].tensors["a"], t(1.6))
    torch.testing.assert_close(out[0].tensors["b"], t(2.8))
    assert out[1].tensors["a"] is small.tensors["a"] and out[1].tensors["b"] is small.tensors["b"]
    for u in out:
        norm = math.hypot(u.tensors["a"].item() - 1.0, u.tensors["b"].item() - 2.0)
        assert norm <= 1.0 + 1e-6
    agg = Clip(ClipSettings(max_norm=1.0), CTX, FedAvg(None, CTX))
    new, state = agg.aggregate(glob, [big, small], agg.init(glob), 1)
    torch.testing.assert_close(new["a"], t(1.0 + (0.6 + 0.3) / 2))
    torch.testing.assert_close(new["b"], t(2.0 + (0.8 + 0.4) / 2))
    assert agg.diagnostics(state) == {"clipped": 1}
    with pytest.raises(ValidationError):
        ClipSettings(max_norm=0.0)


class _Reporting(AggregatorBase):
    """An inner aggregator with its own scalar, checking it never sees the wrapper's."""

    def aggregate(self, glob, updates, state, round):
        assert "clipped" not in state.scalars
        return {k: updates[0].tensors[k] for k in glob}, Message({"m::a": torch.ones(1)}, {"inner": 2.5})


def test_clipping_diagnostics_merge_with_inner():
    glob = {"a": t(0.0)}
    agg = Clip(ClipSettings(max_norm=1.0), CTX, _Reporting(None, CTX))
    state = agg.init(glob)
    for r in (1, 2):
        _, state = agg.aggregate(glob, [Update(0, {"a": t(3.0)}, 1), Update(1, {"a": t(-5.0)}, 1)], state, r)
    assert agg.diagnostics(state) == {"inner": 2.5, "clipped": 2}
    assert agg.restrict(state, set()).scalars == {"inner": 2.5, "clipped": 2}
    assert agg.restrict(state, set()).tensors == {}


def test_fedadam_two_rounds_by_hand():
    b1, b2, eta, tau = 0.9, 0.99, 0.1, 1e-3   # Flower's FedAdam defaults
    glob, ups = scalar_updates([1.0, 2.0], weights=[1, 3])
    agg = FedAdam(FedAdamSettings(), CTX)
    x1, s1 = agg.aggregate(glob, ups, agg.init(glob), 1)
    d1 = (1 * 1.0 + 3 * 2.0) / 4                               # 1.75
    m1, v1 = (1 - b1) * d1, (1 - b2) * d1 ** 2
    eta1 = eta * math.sqrt(1 - b2 ** 2) / (1 - b1 ** 2)        # Flower: exponent round + 1
    e1 = 0.0 + eta1 * m1 / (math.sqrt(v1) + tau)
    assert x1["w"].item() == pytest.approx(e1, rel=1e-6)
    assert s1.tensors["m::w"].item() == pytest.approx(m1, rel=1e-6)
    assert s1.tensors["v::w"].item() == pytest.approx(v1, rel=1e-6)
    # round 2: symmetric updates around x1 (zero pseudo-gradient) -> the step comes from round 1's m and v
    x1v = x1["w"].item()
    _, ups2 = scalar_updates([x1v + 1.0, x1v - 1.0], weights=[2, 2])
    x2, s2 = agg.aggregate(x1, ups2, s1, 2)
    m2, v2 = b1 * m1, b2 * v1
    eta2 = eta * math.sqrt(1 - b2 ** 3) / (1 - b1 ** 3)
    assert x2["w"].item() == pytest.approx(x1v + eta2 * m2 / (math.sqrt(v2) + tau), rel=1e-6)
    assert s2.tensors["m::w"].item() == pytest.approx(m2, rel=1e-6)
    # the other bias corrections: Kingma & Ba's exponent t (round 1: η√(1−β₂)/(1−β₁) = η here) and none
    assert adaptive_lr(eta, b1, b2, 1, "standard") == pytest.approx(eta * math.sqrt(1 - b2) / (1 - b1))
    assert adaptive_lr(eta, b1, b2, 7, "none") == eta
    assert adaptive_lr(eta, b1, b2, 1, "flower") == pytest.approx(eta1)


def test_fedyogi_fedadagrad_fedavgm_by_hand():
    glob, ups = scalar_updates([1.0, 2.0], weights=[1, 3])
    d = 1.75
    y = FedYogi(FedYogiSettings(), CTX)     # eta .01, beta_1 .9, beta_2 .99, tau 1e-3
    x1, s1 = y.aggregate(glob, ups, y.init(glob), 1)
    m1, v1 = 0.1 * d, 0.01 * d ** 2         # v_0 = 0 < d² -> v1 = 0 + (1 - b2) d²
    assert x1["w"].item() == pytest.approx(0.01 * m1 / (math.sqrt(v1) + 1e-3), rel=1e-6)
    x1v = x1["w"].item()
    _, ups2 = scalar_updates([x1v + 0.1], weights=[1])   # d2² = .01 < v1 -> v2 = v1 - (1 - b2) d2²
    x2, s2 = y.aggregate(x1, ups2, s1, 2)
    assert s2.tensors["v::w"].item() == pytest.approx(v1 - 0.01 * 0.01, rel=1e-5)
    m2 = 0.9 * m1 + 0.1 * 0.1
    assert x2["w"].item() == pytest.approx(x1v + 0.01 * m2 / (math.sqrt(v1 - 1e-4) + 1e-3), rel=1e-5)

    a = FedAdagrad(FedAdagradSettings(), CTX)   # eta .1, beta_1 0 (m = delta), v += delta²
    x1, s1 = a.aggregate(glob, ups, a.init(glob), 1)
    assert x1["w"].item() == pytest.approx(0.1 * d / (d + 1e-3), rel=1e-6)
    x1v = x1["w"].item()
    _, ups2 = scalar_updates([x1v - 0.5], weights=[1])
    x2, s2 = a.aggregate(x1, ups2, s1, 2)
    assert s2.tensors["v::w"].item() == pytest.approx(d ** 2 + 0.25, rel=1e-6)
    assert x2["w"].item() == pytest.approx(x1v - 0.1 * 0.5 / (math.sqrt(d ** 2 + 0.25) + 1e-3), rel=1e-5)

    mo = FedAvgM(FedAvgMSettings(server_learning_rate=0.5, server_momentum=0.9), CTX)
    x1, s1 = mo.aggregate(glob, ups, mo.init(glob), 1)
    g1 = 0.0 - d                                          # g = x - avg; u_1 = g_1
    assert x1["w"].item() == pytest.approx(0.0 - 0.5 * g1, rel=1e-6)
    _, ups2 = scalar_updates([x1["w"].item() + 1.0], weights=[1])
    x2, s2 = mo.aggregate(x1, ups2, s1, 2)
    u2 = 0.9 * g1 + (-1.0)
    assert s2.tensors["momentum::w"].item() == pytest.approx(u2, rel=1e-6)
    assert x2["w"].item() == pytest.approx(x1["w"].item() - 0.5 * u2, rel=1e-6)


def test_settings_defaults_match_flower():
    fa, fy, fg, fm = (flwr_strategy.FedAdam(), flwr_strategy.FedYogi(), flwr_strategy.FedAdagrad(),
                      flwr_strategy.FedAvgM())
    for ours, theirs in ((FedAdamSettings(), fa), (FedYogiSettings(), fy), (FedAdagradSettings(), fg)):
        assert (ours.eta, ours.beta_1, ours.tau) == (theirs.eta, theirs.beta_1, theirs.tau)
        assert getattr(ours, "beta_2", 0.0) == theirs.beta_2
    assert (FedAvgMSettings().server_learning_rate, FedAvgMSettings().server_momentum) == (
        fm.server_learning_rate, fm.server_momentum)
    assert TrimmedMeanSettings().beta == flwr_strategy.FedTrimmedAvg().beta
    assert KrumSettings().num_malicious == flwr_strategy.Krum().num_malicious_nodes
    mk = flwr_strategy.MultiKrum()
    assert (MultiKrumSettings().num_malicious, MultiKrumSettings().num_selected) == (
        mk.num_malicious_nodes, mk.num_nodes_to_select)
    for name, model in (("fedadam", FedAdamSettings), ("fedyogi", FedYogiSettings),
                        ("fedadagrad", FedAdagradSettings), ("fedavgm", FedAvgMSettings),
                        ("trimmed_mean", TrimmedMeanSettings), ("krum", KrumSettings),
                        ("multi_krum", MultiKrumSettings)):
        assert AGGREGATORS.entry(name).settings is model
    assert AGGREGATORS.entry("median").settings is None
    assert WRAPPERS.entry("clip").settings is ClipSettings


# ---------------------------------------------------------------- against Flower 1.41's strategies
# Flower's strategies are driven directly through ``aggregate_train`` with reply messages built from an explicit
# ``Metadata`` (no Grid or running SuperLink needed). ``configure_train`` needs a Grid, so we set what it would
# record instead: ``current_arrays`` (FedOpt: a dict of ndarrays; FedAvgM: an ArrayRecord).


def flwr_replies(updates: list[Update]) -> list[FlwrMessage]:
    out = []
    for u in updates:
        md = Metadata(run_id=0, message_id=str(u.client), src_node_id=u.client + 1, dst_node_id=0,
                      reply_to_message_id="", group_id="", created_at=0.0, ttl=60.0, message_type="train")
        content = RecordDict({"arrays": ArrayRecord({k: Array(v.numpy().copy()) for k, v in u.tensors.items()}),
                              "metrics": MetricRecord({"num-examples": u.weight})})
        out.append(FlwrMessage(content=content, metadata=md))
    return out


def from_flwr(arrays: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.asarray(a.numpy(), dtype=np.float32)) for k, a in arrays.items()}


ROUND_WEIGHTS = [[3, 1, 4, 1, 5], [10, 20, 1, 7, 2], [1, 1, 1, 50, 1]]


@pytest.mark.parametrize("ours,theirs", [
    (lambda: FedAdam(FedAdamSettings(), CTX), lambda: flwr_strategy.FedAdam()),
    (lambda: FedYogi(FedYogiSettings(), CTX), lambda: flwr_strategy.FedYogi()),
    (lambda: FedAdagrad(FedAdagradSettings(), CTX), lambda: flwr_strategy.FedAdagrad()),
    (lambda: FedAdam(FedAdamSettings(eta=0.3, beta_1=0.5, beta_2=0.9, tau=1e-2), CTX),
     lambda: flwr_strategy.FedAdam(eta=0.3, beta_1=0.5, beta_2=0.9, tau=1e-2)),
], ids=["fedadam", "fedyogi", "fedadagrad", "fedadam-custom"])
def test_fedopt_matches_flower(ours, theirs):
    agg, strat = ours(), theirs()
    glob = make_glob(seed=3)
    state = agg.init(glob)
    for r, weights in enumerate(ROUND_WEIGHTS, start=1):
        ups = make_updates(glob, scale=0.3, seed=10 + r, weights=weights)
        strat.current_arrays = {k: v.numpy().copy() for k, v in glob.items()}   # what configure_train records
        ref, _ = strat.aggregate_train(r, flwr_replies(ups))
        glob, state = agg.aggregate(glob, ups, state, r)
        ref = from_flwr(ref)
        for k in glob:
            torch.testing.assert_close(glob[k], ref[k], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(state.tensors[f"m::{k}"], torch.from_numpy(strat.m_t[k]).float(),
                                       rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(state.tensors[f"v::{k}"], torch.from_numpy(strat.v_t[k]).float(),
                                       rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("lr,mu", [(0.5, 0.9), (1.0, 0.0), (0.7, 0.0)])
def test_fedavgm_matches_flower(lr, mu):
    agg = FedAvgM(FedAvgMSettings(server_learning_rate=lr, server_momentum=mu), CTX)
    strat = flwr_strategy.FedAvgM(server_learning_rate=lr, server_momentum=mu)
    glob = make_glob(seed=4)
    state = agg.init(glob)
    for r, weights in enumerate(ROUND_WEIGHTS, start=1):
        ups = make_updates(glob, scale=0.3, seed=20 + r, weights=weights)
        strat.current_arrays = ArrayRecord({k: Array(v.numpy().copy()) for k, v in glob.items()})
        ref, _ = strat.aggregate_train(r, flwr_replies(ups))
        glob, state = agg.aggregate(glob, ups, state, r)
        ref = from_flwr(ref)
        for k in glob:
            torch.testing.assert_close(glob[k], ref[k], rtol=1e-5, atol=1e-6)


def _with_outlier(glob, n, seed):
    ups = make_updates(glob, n=n, scale=0.2, seed=seed, weights=[3, 1, 4, 1, 5, 9, 2][:n])
    ups[1] = ups[1].with_tensors({k: v + 25.0 for k, v in ups[1].tensors.items()})
    return ups


@pytest.mark.parametrize("n", [4, 5, 7])
def test_robust_rules_match_flower(n):
    glob = make_glob(seed=5)
    ups = _with_outlier(glob, n, seed=30 + n)
    ctx = AggregatorContext(num_clients=7, seed=0)
    cases = [(Median(None, ctx), flwr_strategy.FedMedian()),
             (TrimmedMean(TrimmedMeanSettings(beta=0.2), ctx), flwr_strategy.FedTrimmedAvg(beta=0.2)),
             (TrimmedMean(TrimmedMeanSettings(beta=0.3), ctx), flwr_strategy.FedTrimmedAvg(beta=0.3))]
    f = (n - 3) // 2     # the largest f with n >= 2f + 3
    cases += [(Krum(KrumSettings(num_malicious=f), ctx), flwr_strategy.Krum(num_malicious_nodes=f)),
              (MultiKrum(MultiKrumSettings(num_malicious=f, num_selected=n - f - 1), ctx),
               flwr_strategy.MultiKrum(num_malicious_nodes=f, num_nodes_to_select=n - f - 1))]
    for ours, theirs in cases:
        out, _ = ours.aggregate(glob, ups, Message(), 1)
        ref, _ = theirs.aggregate_train(1, flwr_replies(ups))     # fresh replies: Flower pops their arrays
        ref = from_flwr(ref)
        for k in glob:
            torch.testing.assert_close(out[k], ref[k], rtol=1e-5, atol=1e-6)
        if isinstance(ours, MultiKrum):    # the outlier is never selected
            assert all((out[k] - ups[1].tensors[k]).abs().max() > 1.0 for k in glob)
