"""FedPepTAO: layer scores (Eq. 2–4), selection, Hessian ratio, Alg. 2 server algebra, partial sharing end to end
(the deep-prompt adapter itself: tests/unit/test_deep_prompt.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedpeft.aggregators import AggregatorContext
from fedpeft.aggregators.momentum_cv import (
    MomentumCV,
    MomentumCVSettings,
    init_state,
    momentum_cv_step,
    server_lr,
    step_diagnostics,
)
from fedpeft.build import build_method
from fedpeft.clients import sub_state
from fedpeft.comm.codec import Message, decode
from fedpeft.comm.update import Update
from fedpeft.config import ConfigError
from fedpeft.experiment import build_experiment
from fedpeft.methods import PRESETS
from fedpeft.sharing.hessian_ratio import (
    RATIO_ESTIMATORS,
    HessianOperator,
    RatioSettings,
    exact_spectrum,
    gap_ratio,
    lanczos_spectrum,
    secant_lipschitz,
    slq_plateau_ratio,
)
from fedpeft.sharing.layer_orders import num_selected, select_layers
from fedpeft.sharing.layer_selection import LayerSelectionSettings
from fedpeft.sharing.layer_scores import aggregate_weighted, cosine_kernel, kernel_score, layer_scores
from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS
from fedpeft.trainers.gradient import GradientSettings

EPS = 1e-5


# ---------------------------------------------------------------- Eq. 2–4: layer scores


def test_orthogonal_samples_score_one_and_identical_samples_score_huge():
    n = 4
    ortho = torch.eye(n, 10) * 3.0
    assert torch.allclose(cosine_kernel(ortho), torch.eye(n, dtype=torch.float64))
    assert kernel_score(cosine_kernel(ortho)) == pytest.approx(math.log(1 + EPS) + 1 / (1 + EPS), abs=1e-9)
    same = torch.ones(n, 10) + 1e-9 * torch.arange(10.0)
    lam = [n + EPS] + [EPS] * (n - 1)
    expected = sum(math.log(x) + 1 / x for x in lam) / n
    assert kernel_score(cosine_kernel(same)) == pytest.approx(expected, rel=1e-3)
    assert kernel_score(cosine_kernel(same)) > 0.9 * (n - 1) / (n * EPS)
    # the code's sum form is n times the paper's mean form; cosine makes the score scale-invariant
    k = cosine_kernel(torch.randn(n, 7, generator=torch.Generator().manual_seed(0)))
    assert kernel_score(k, reduce="sum") == pytest.approx(n * kernel_score(k))
    x = torch.randn(n, 3, 5, generator=torch.Generator().manual_seed(1))
    assert kernel_score(cosine_kernel(x)) == pytest.approx(kernel_score(cosine_kernel(7.5 * x)))


def test_layer_scores_and_weighted_aggregation():
    n = 4
    hidden = [torch.eye(n, 6).reshape(n, 2, 3), torch.ones(n, 2, 3)]
    s = layer_scores(hidden)
    assert s[0] == pytest.approx(1.0, abs=1e-4) and s[1] > 1e4
    assert layer_scores(hidden, score_last_layer=False)[1] == 0.0  # code quirk A5
    agg = aggregate_weighted([torch.tensor([1.0, 3.0]), torch.tensor([5.0, 7.0])], [30, 10])
    assert torch.allclose(agg, torch.tensor([2.0, 4.0], dtype=torch.float64))  # n_i/N weights (Eq. 4)
    with pytest.raises(ValueError):
        aggregate_weighted([torch.tensor([1.0])], [0])


def test_nonpad_scores_ignore_padded_positions():
    g = torch.Generator().manual_seed(0)
    hidden = [torch.randn(4, 5, 6, generator=g) for _ in range(2)]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    pads = (1 - mask).unsqueeze(-1).float()
    noisy = [h + 10 * torch.randn(4, 5, 6, generator=g) * pads for h in hidden]
    assert torch.allclose(layer_scores(hidden, mask=mask), layer_scores(noisy, mask=mask))
    assert not torch.allclose(layer_scores(hidden), layer_scores(noisy))  # the code's "all" sees the pads
    assert torch.allclose(layer_scores(hidden, mask=torch.ones(4, 5)), layer_scores(hidden))


def test_nonpad_layer_scores_of_a_batch_do_not_see_the_pad_tokens(tiny_cfg):
    cfg = _cfg(tiny_cfg)
    exp = build_experiment(cfg)
    policy = build_method(cfg, exp).sharing
    assert policy.settings.score_tokens == "all"  # default: the code's flattening (golden metrics unchanged)
    nonpad = type(policy)(LayerSelectionSettings(score_tokens="nonpad"), policy.ctx)
    data = exp.client(0).train
    batch = exp.objective.batch(data, list(range(8)))
    real = batch["attention_mask"].bool()
    assert not bool(real.all())
    other = dict(batch) | {"input_ids": torch.where(real, batch["input_ids"], 1234)}
    params = policy.ctx.initial_params()
    # other pad tokens change the hidden states at pad positions only (they are masked as keys)
    assert torch.allclose(nonpad.layer_scores(params, batch), nonpad.layer_scores(params, other))
    assert not torch.allclose(policy.layer_scores(params, batch), policy.layer_scores(params, other))


def test_selected_layers_are_the_top_ceil_r_L():
    scores = torch.tensor([0.3, 2.0, 1.0, 5.0, 0.1, 4.0])
    rng = np.random.default_rng(0)
    assert [num_selected(r, 6) for r in (0.01, 0.5, 0.51, 1.0)] == [1, 3, 4, 6]
    assert select_layers(scores, 0.5, "score", rng) == [1, 3, 5]
    assert select_layers(scores, 0.34, "score", rng) == [1, 3, 5]  # ceil(2.04) = 3
    assert select_layers(scores, 0.5, "ascending", rng) == [0, 1, 2]
    assert select_layers(scores, 0.5, "descending", rng) == [3, 4, 5]
    a = select_layers(scores, 0.5, "random", np.random.default_rng(7))
    assert a == select_layers(scores, 0.5, "random", np.random.default_rng(7)) and len(a) == 3


# ---------------------------------------------------------------- Alg. 1 lines 3–10: the ratio r


def _quadratic(a: torch.Tensor):
    return lambda th: 0.5 * th @ (a.float() @ th)


def test_exact_and_lanczos_spectrum_of_a_quadratic_and_gap_rule():
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    lam = torch.tensor([-0.5, 0.0, 0.1, 0.2, 3.0, 3.1], dtype=torch.float64)
    a = q @ torch.diag(lam) @ q.T
    op = HessianOperator(_quadratic(a), torch.zeros(6))
    got, w = exact_spectrum(op, 6)
    assert torch.allclose(got, lam, atol=1e-5) and torch.allclose(w.sum(), torch.tensor(1.0, dtype=torch.float64))
    nodes, weights = lanczos_spectrum(op, 6, 6, 1, torch.Generator().manual_seed(0))
    assert torch.allclose(nodes, lam, atol=1e-4) and weights.sum().item() == pytest.approx(1.0)
    # a quadratic has a linear gradient: the remainder B is constant, Lipschitz 0
    assert secant_lipschitz(_quadratic(a), op, torch.zeros(6), torch.ones(6)) == pytest.approx(0.0, abs=1e-4)
    # first gap (ascending) above 4L: between 0.2 and 3.0 -> k = 4, r = (6 - 4)/6
    assert gap_ratio(lam, w, lipschitz=0.5) == (pytest.approx(2 / 6), 4)
    assert gap_ratio(lam, w, lipschitz=0.1) == (pytest.approx(5 / 6), 1)  # 0.5 > 0.4 already
    assert gap_ratio(lam, w, lipschitz=1.0) == (1.0, None)  # no gap: keep every layer
    # SLQ plateau (code heuristic): half the mass sits far above a cluster near 0 -> 1 − CDF(t) plateaus at 0.5
    spec = torch.tensor([0.05, 0.1, 0.15, 0.2, 5.0, 5.1, 5.2, 5.3], dtype=torch.float64)
    assert slq_plateau_ratio(spec, torch.full((8,), 1 / 8, dtype=torch.float64)) == pytest.approx(0.5, abs=0.01)


def test_secant_lipschitz_of_a_quartic():
    loss = lambda th: (th ** 4).sum() / 12  # noqa: E731  grad th^3/3, Hessian diag(th^2)
    theta = torch.ones(3)
    op = HessianOperator(loss, theta)
    delta = torch.tensor([1.0, 0.0, 0.0])
    # B(sΔ) − B(0) = H sΔ − (∇F(θ+sΔ) − ∇F(θ)) = s − ((1+s)^3 − 1)/3 = −s² − s³/3 on the first axis
    expected = max(abs(-(s ** 2) - s ** 3 / 3) / s for s in (0.25, 0.5, 1.0))
    assert secant_lipschitz(loss, op, theta, delta) == pytest.approx(expected, rel=1e-4)


SPECTRUM = torch.tensor([0.1, 0.2, 0.3, 5.0, 5.2, 5.4, 5.6, 5.8], dtype=torch.float64)


def _quadratic_plus_quartic(c: float):
    """F(θ) = ½ Σ λ_j θ_j² + (c/12) Σ θ_j⁴: Hessian diag(λ) at θ = 0, and with Δ = 1 (θ^0 = 1, θ^t = 0) the
    remainder B(sΔ) − B(0) = −(c/3) s³ per axis, so the secant Lipschitz estimate is max_s (c/3) s² = c/3."""
    lam = SPECTRUM.float()
    return lambda th: 0.5 * (lam * th ** 2).sum() + c / 12 * (th ** 4).sum()


@pytest.mark.parametrize("c, k", [(1.5, 3), (0.03, 1), (6.0, None)])
@pytest.mark.parametrize("exact", [True, False])
def test_hessian_gap_estimator_on_a_known_spectrum(c, k, exact):
    """4𝓛 = 4c/3: 2.0 lies between the cluster gaps (0.1) and the big gap (4.7) -> k = 3, r = 5/8; 0.04 is below
    every gap -> k = 1, r = 7/8; 8.0 is above every gap -> no gap, r = 1 (keep every layer). The Lanczos path
    (more parameters than max_exact_params) finds all 8 distinct eigenvalues in 8 steps, and with eigenvectors
    on the axes every Rademacher probe puts weight 1/K on each, so its spectral mass equals (K − k)/K."""
    dim = len(SPECTRUM)
    s = RatioSettings(max_exact_params=dim if exact else dim - 1, lanczos_iters=dim)
    est = RATIO_ESTIMATORS.get("hessian_gap")
    res = est(_quadratic_plus_quartic(c), torch.zeros(dim), torch.ones(dim), s, torch.Generator().manual_seed(3))
    assert res.exact is exact and res.num_params == dim
    assert res.lipschitz == pytest.approx(c / 3, rel=1e-4)
    assert res.spectrum_min == pytest.approx(0.1, abs=1e-5) and res.spectrum_max == pytest.approx(5.8, abs=1e-4)
    assert res.gap_index == k
    assert res.ratio == pytest.approx(1.0 if k is None else (dim - k) / dim, abs=1e-6)
    # the official code's heuristic sees the same two clusters: 1 − CDF(t) plateaus at the upper cluster's mass
    # (with exactly half of it up there the plateau equals ratio(0)/2 up to rounding, the code's "below half"
    # test fires and its step-halving restarts until it takes the flat start near t = 0 as the plateau: r ≈ 1)
    slq = RATIO_ESTIMATORS.get("slq_plateau")(_quadratic_plus_quartic(c), torch.zeros(dim), torch.ones(dim), s,
                                              torch.Generator().manual_seed(3))
    assert slq.ratio == pytest.approx(5 / 8, abs=0.01)
    assert RATIO_ESTIMATORS.get("fixed")(None, None, None, RatioSettings(keep_ratio=0.3), None).ratio == 0.3


# ---------------------------------------------------------------- Alg. 2: server momentum + control variates


def _p(*vals: float) -> dict[str, torch.Tensor]:
    return {"x": torch.tensor(vals, dtype=torch.float32)}


def test_momentum_cv_round_one_and_two_match_spec_steps():
    s = MomentumCVSettings(server_lr=0.1, momentum=0.9)
    alpha, M = 0.5, 4
    st = init_state(_p(1.0, 2.0))
    # round 1: clients 0 (n=1, T=2) and 2 (n=3, T=4)
    up1 = {0: _p(2.0, 2.0), 2: _p(0.0, 4.0)}
    st1 = momentum_cv_step(st, up1, {0: 1, 2: 3}, {0: 2, 2: 4}, alpha, M, 1, s)
    wbar = 0.25 * torch.tensor([2.0, 2.0]) + 0.75 * torch.tensor([0.0, 4.0])
    assert torch.allclose(st1.w["x"], wbar) and torch.count_nonzero(st1.m["x"]) == 0  # A16: no step in round 1
    c0 = -(torch.tensor([2.0, 2.0]) - torch.tensor([1.0, 2.0])) / (2 * alpha)
    c2 = -(torch.tensor([0.0, 4.0]) - torch.tensor([1.0, 2.0])) / (4 * alpha)
    assert torch.allclose(st1.c[0]["x"], c0) and torch.allclose(st1.c[2]["x"], c2)
    cg1 = (2 / M) * (0.25 * c0 + 0.75 * c2)
    assert torch.allclose(st1.cg["x"], cg1)
    p1 = torch.tensor([1.0, 2.0]) - wbar
    assert torch.allclose(st1.prev["x"], p1)
    # round 2: only client 0 (n=2, T=1); client 2 keeps its c_2
    up2 = {0: _p(1.0, 1.0)}
    st2 = momentum_cv_step(st1, up2, {0: 2}, {0: 1}, alpha, M, 2, s)
    w1 = wbar
    c0_new = c0 - cg1 - (torch.tensor([1.0, 1.0]) - w1) / (1 * alpha)
    cg2 = cg1 + (1 / M) * (c0_new - c0)
    p2 = w1 - torch.tensor([1.0, 1.0])
    g = p1 - p2
    m = 0.9 * 0 + 0.1 * g + cg2 - c0_new
    assert torch.allclose(st2.c[0]["x"], c0_new, atol=1e-6)
    assert torch.allclose(st2.c[2]["x"], c2)  # not sampled: unchanged
    assert torch.allclose(st2.cg["x"], cg2, atol=1e-6)
    assert torch.allclose(st2.m["x"], m, atol=1e-6)
    assert torch.allclose(st2.w["x"], torch.tensor([1.0, 1.0]) - 0.1 * m, atol=1e-6)  # step on w̄ (A10)
    # paper-literal switches: g with the opposite sign, step from w^{r-1}
    lit = momentum_cv_step(st1, up2, {0: 2}, {0: 1}, alpha, M, 2, MomentumCVSettings(
        server_lr=0.1, momentum=0.9, sign="paper", base="previous"))
    m_lit = 0.1 * (-g) + cg2 - c0_new
    assert torch.allclose(lit.w["x"], w1 - 0.1 * m_lit, atol=1e-6)


def test_identical_clients_cancel_control_variates_and_chaining_differs():
    s = MomentumCVSettings(server_lr=0.5, momentum=0.9)
    st = init_state(_p(0.0, 0.0))
    same = {0: _p(1.0, -1.0), 1: _p(1.0, -1.0)}
    n, t = {0: 5, 1: 5}, {0: 3, 1: 3}
    st1 = momentum_cv_step(st, same, n, t, 0.1, 2, 1, s)
    st2 = momentum_cv_step(st1, {0: _p(1.5, -2.0), 1: _p(1.5, -2.0)}, n, t, 0.1, 2, 2, s)
    assert torch.allclose(st2.cg["x"], st2.c[0]["x"], atol=1e-6)  # c_g − c_i = 0 with full participation
    g = st1.prev["x"] - st2.prev["x"]
    assert torch.allclose(st2.m["x"], 0.1 * g, atol=1e-6)  # plain momentum on g_g
    no_cv = momentum_cv_step(st1, {0: _p(1.5, -2.0), 1: _p(1.5, -2.0)}, n, t, 0.1, 2, 2,
                             MomentumCVSettings(server_lr=0.5, control_variates=False))
    assert torch.allclose(no_cv.w["x"], st2.w["x"], atol=1e-6)
    assert torch.equal(no_cv.c[0]["x"], st1.c[0]["x"])  # without control variates c_i is left as it was
    chained = momentum_cv_step(st1, {0: _p(1.5, -2.0), 1: _p(1.5, -2.0)}, n, t, 0.1, 2, 2,
                               s.model_copy(update={"chaining": True}))
    assert not torch.allclose(chained.w["x"], st2.w["x"])


def test_fedavgm_mode_and_state_round_trip_and_restrict():
    s = MomentumCVSettings(server_lr=1.0, momentum=0.5, momentum_input="pseudo_grad", base="previous",
                           control_variates=False)
    st = init_state({"a": torch.tensor([1.0]), "b": torch.tensor([2.0])})
    out = momentum_cv_step(st, {3: {"a": torch.tensor([0.0]), "b": torch.tensor([0.0])}}, {3: 1}, {3: 1}, 0.1, 5, 1, s)
    assert torch.allclose(out.w["a"], torch.tensor([1.0 - 0.5 * 1.0]))  # m = (1−β) P, w = w − η m
    full = momentum_cv_step(st, {3: {"a": torch.tensor([0.0]), "b": torch.tensor([0.0])}}, {3: 1}, {3: 1}, 0.1, 5, 1,
                            MomentumCVSettings())
    # the registered aggregator keeps the same state as named tensors and gives the same step
    agg = MomentumCV(MomentumCVSettings(), AggregatorContext(5, 0, trainer=GradientSettings(lr=0.1)))
    w, state = agg.aggregate(st.w, [Update(3, {"a": torch.tensor([0.0]), "b": torch.tensor([0.0])}, 1,
                                           scalars={"steps": 1})], agg.init(st.w), 1)
    assert torch.equal(w["a"], full.w["a"]) and torch.equal(state.tensors["c/3::b"], full.c[3]["b"])
    assert torch.equal(state.tensors["P::a"], full.prev["a"])
    cut = agg.restrict(state, {"b"})
    assert sorted(cut.tensors) == ["P::b", "c/3::b", "cg::b", "m::b"]


def test_server_lr_decays_like_the_official_script():
    """example_roberta.sh: --server_lr 0.05; run_fed_pers_with_optim_v2.py l.322: no server step in round 1, then
    ``args.server_lr = max(args.server_lr * 0.99, 0.0001)`` before the step of every later round."""
    s = MomentumCVSettings(server_lr=0.05, lr_decay=0.99, lr_floor=1e-4)
    eta, official = 0.05, {}
    for r in range(2, 1000):
        eta = max(eta * 0.99, 0.0001)
        official[r] = eta
    assert all(server_lr(s, r) == pytest.approx(eta_r, rel=1e-9) for r, eta_r in official.items())
    assert server_lr(s, 2) == pytest.approx(0.0495) and server_lr(s, 999) == 1e-4
    assert server_lr(MomentumCVSettings(server_lr=0.05), 50) == 0.05  # γ = 1: constant (paper sweep)


def test_server_step_ratio_on_small_tensors():
    s = MomentumCVSettings(server_lr=0.05, lr_decay=0.99)
    st1 = momentum_cv_step(init_state(_p(0.0, 0.0)), {0: _p(1.0, 0.0)}, {0: 1}, {0: 1}, 0.1, 1, 1, s)
    assert step_diagnostics(st1) == {"server_lr": 0.0, "server_step_ratio": 0.0}  # round 1: no server step
    st2 = momentum_cv_step(st1, {0: _p(1.0, 2.0)}, {0: 1}, {0: 1}, 0.1, 1, 2, s)
    # one client of one: c_g − c_0 = 0; P^1 = (−1, 0), P^2 = w^1 − w̄^2 = (0, −2), g = P^1 − P^2 = (−1, 2), m = 0.1 g
    assert torch.allclose(st2.m["x"], torch.tensor([-0.1, 0.2]), atol=1e-6)
    ratio = 0.0495 * math.sqrt(0.05) / 2.0
    diag = step_diagnostics(st2)
    assert diag["server_lr"] == pytest.approx(0.0495) and diag["server_step_ratio"] == pytest.approx(ratio, rel=1e-6)
    # base average, no chaining: the step is exactly −η m on top of the FedAvg result
    wbar = torch.tensor([1.0, 2.0])
    assert float((st2.w["x"] - wbar).norm() / (wbar - st1.w["x"]).norm()) == pytest.approx(ratio, rel=1e-5)
    # clients that return w^{r−1} unchanged: no FedAvg move, no ratio
    st3 = momentum_cv_step(st2, {0: st2.w}, {0: 1}, {0: 1}, 0.1, 1, 3, s)
    assert "server_step_ratio" not in step_diagnostics(st3)
    # the registered aggregator logs both as server diagnostics
    agg = MomentumCV(s, AggregatorContext(1, 0, trainer=GradientSettings(lr=0.1)))
    glob = _p(0.0, 0.0)
    w1, state = agg.aggregate(glob, [Update(0, _p(1.0, 0.0), 1, scalars={"steps": 1})], agg.init(glob), 1)
    _, state = agg.aggregate(w1, [Update(0, _p(1.0, 2.0), 1, scalars={"steps": 1})], state, 2)
    assert agg.diagnostics(state) == pytest.approx(diag)


# ---------------------------------------------------------------- end to end: partial sharing


def _cfg(tiny_cfg, **extra):
    base = dict(method__name="fedpeptao", method__adapter__num_tokens=4, federation__num_clients=4,
                federation__clients_per_round=2, federation__rounds=4, method__sharing__warmup_rounds=2)
    return tiny_cfg(**(base | extra))


def test_presets_are_listed():
    for name in ("fedpeptao", "fedavg-prefix", "moms-adamd", "momd", "moms", "moms-con", "adamd"):
        assert name in PRESETS


def test_bad_options_name_the_field(tiny_cfg):
    with pytest.raises(ConfigError, match="method.sharing.order"):
        _cfg(tiny_cfg, method__sharing__order="sideways")
    with pytest.raises(ConfigError, match="method.sharing.name: 'layer_selection' shares the layers of deep_prompt"):
        _cfg(tiny_cfg, method__adapter__name="soft_prompt")


def test_random_order_draws_are_seeded_and_distinct(tiny_cfg, tmp_path):
    """order: random with random_draw k: k independent seeded draws (draw 0 = the stream it always had)."""
    def selected(i, **extra):
        cfg = _cfg(tiny_cfg, federation__rounds=2, method__sharing__order="random", **extra)
        run_embedded(cfg, tmp_path / str(i))
        return tuple(RunDir(tmp_path / str(i)).load_checkpoint()[1].scalars["sharing"]["selected"])

    draws = [selected(k, method__sharing__random_draw=k) for k in range(6)]
    assert selected("default") == draws[0] and len(set(draws)) == 2  # both 1-of-2 layer subsets occur


def test_upload_shrinks_to_selected_layers_and_private_layers_never_leave(tiny_cfg, tmp_path):
    cfg = _cfg(tiny_cfg)
    seen: dict[tuple[int, int], set[str]] = {}

    def hook(rnd, cid, data):
        seen[(rnd, cid)] = set(decode(data).tensors)
        return data

    summary = run_embedded(cfg, tmp_path / "run", reply_hook=hook)
    run = RunDir(tmp_path / "run")
    recs = [r for r in run.read_metrics() if r["round"] > 0]
    assert recs[0]["server"]["server_lr"] == 0.0  # no server step in round 1 (A16)
    assert all(r["server"]["server_lr"] == 1e-3 and r["server"]["server_step_ratio"] > 0 for r in recs[1:])
    _, state, clients, _ = run.load_checkpoint()
    h, d, L = 4, 32, 2
    sharing = state.scalars["sharing"]
    sl = sharing["selected"]
    assert sharing["selection_round"] == 2 and len(sl) == math.ceil(0.5 * L)
    assert sl == sorted(int(i) for i in np.argsort(-np.array(sharing["layer_scores"]), kind="stable")[:1])
    nsl = [l for l in range(L) if l not in sl]
    for rec in recs:
        for c in rec["clients"]:
            keys = seen[(rec["round"], c["client"])]
            if rec["round"] <= 2:  # all layers (+ the L scores in the selection round)
                prompt = h * L * 2 * d * 4
                assert {k for k in keys if k.startswith("prefix.")} == {f"prefix.{l}" for l in range(L)}
                extra = 4 * L if rec["round"] == 2 else 0
                assert prompt + extra < c["bytes_up"] <= prompt + extra + 1024
            else:
                assert keys == {f"prefix.{l}" for l in sl}
                assert h * len(sl) * 2 * d * 4 < c["bytes_up"] <= h * len(sl) * 2 * d * 4 + 512
    assert summary["upload_tensor_bytes"] == h * len(sl) * 2 * d * 4
    assert "peptao/layer_scores" in seen[(2, recs[1]["clients"][0]["client"])]
    # the server keeps every layer (NSL frozen at selection, for evaluate_global); its optimiser state only SL
    assert {k for k in state.tensors if k.startswith("prefix.")} == {f"prefix.{l}" for l in range(L)}
    assert {k.split("::")[1] for k in state.tensors if k.startswith("agg/")} == {f"prefix.{l}" for l in sl}
    assert nsl
    # every trained client keeps its full prompt copy (incl. NSL layers) as private state
    trained = {c["client"] for r in recs for c in r["clients"]}
    assert set(clients) == trained
    assert all({f"u/prefix.{l}" for l in range(L)} <= set(clients[c].tensors) for c in trained)


def test_private_layers_persist_across_rounds_and_survive_resume(tiny_cfg, tmp_path):
    cfg = _cfg(tiny_cfg, federation__rounds=5)
    run_embedded(cfg, tmp_path / "full")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=3)
    _, state3, clients3, _ = RunDir(tmp_path / "cut").load_checkpoint()
    run_embedded(cfg, tmp_path / "cut", resume=True)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]  # noqa: E731
    assert strip(RunDir(tmp_path / "cut").read_metrics()) == strip(RunDir(tmp_path / "full").read_metrics())
    _, state_a, clients_a, _ = RunDir(tmp_path / "full").load_checkpoint()
    _, state_b, clients_b, _ = RunDir(tmp_path / "cut").load_checkpoint()
    assert state_a.scalars == state_b.scalars
    assert all(torch.equal(state_a.tensors[k], state_b.tensors[k]) for k in state_a.tensors)
    assert all(torch.equal(clients_a[c].tensors[k], clients_b[c].tensors[k]) for c in clients_a
               for k in clients_a[c].tensors)
    # a client not sampled in rounds 4–5 keeps its private prompts and its server-side c_i unchanged
    recs = RunDir(tmp_path / "full").read_metrics()
    later = {c["client"] for r in recs[3:] for c in r["clients"]}
    idle = [c for c in clients3 if c not in later]
    for c in idle:
        assert all(torch.equal(clients3[c].tensors[k], clients_a[c].tensors[k]) for k in clients3[c].tensors)
        cks = [k for k in state_a.tensors if k.startswith(f"agg/c/{c}::")]
        assert cks and all(torch.equal(state3.tensors[k], state_a.tensors[k]) for k in cks)
    for c in later & set(clients3):
        nsl = [f"u/prefix.{l}" for l in range(2) if l not in state_a.scalars["sharing"]["selected"]]
        assert any(not torch.equal(clients3[c].tensors[k], clients_a[c].tensors[k]) for k in nsl)


def test_local_adam_is_reset_so_the_same_round_gives_the_same_upload(tiny_cfg):
    cfg = _cfg(tiny_cfg)
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    state = method.server_init()
    msg = method.configure_round(state, 1, [0])[0]
    ctx = exp.client(0)
    a = method.client_update(msg, ctx)
    b = method.client_update(msg, ctx)  # ctx.state now holds the private copy; shared slices are overwritten
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    assert a.scalars["steps"] == b.scalars["steps"] > 0


def test_personalised_evaluation_uses_the_clients_own_nsl_prompts(tiny_cfg):
    cfg = _cfg(tiny_cfg)
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    shared = {"prefix.1": torch.zeros(4, 2, 32)}
    ctx = exp.client(0)
    ctx.state = Message(tensors={"u/prefix.0": torch.full((4, 2, 32), 0.7), "u/prefix.1": torch.ones(4, 2, 32)})
    params = method.sharing.client_params(shared, sub_state(ctx.state, "u/"))
    assert torch.equal(params["prefix.0"], torch.full((4, 2, 32), 0.7))  # own NSL layer
    assert torch.equal(params["prefix.1"], torch.zeros(4, 2, 32))  # server's SL layer wins
    fresh = method.sharing.client_params(shared, sub_state(exp.client(1).state, "u/"))
    assert torch.equal(fresh["prefix.0"], method.initial_params()["prefix.0"])  # never trained: E^0 (A18)


def test_hessian_gap_ratio_on_tiny_llama(tiny_cfg, tmp_path):
    cfg = _cfg(tiny_cfg, model__name="tiny-llama", method__sharing__ratio_estimator="hessian_gap",
               method__sharing__warmup_rounds=1, federation__rounds=2, method__adapter__num_tokens=2,
               method__sharing__max_exact_params=16, method__sharing__lanczos_iters=6)
    summary = run_embedded(cfg, tmp_path / "run")
    recs = RunDir(tmp_path / "run").read_metrics()
    _, state, _, _ = RunDir(tmp_path / "run").load_checkpoint()
    rs = [c["peptao_ratio"] for c in recs[0]["clients"]]
    ns = [c["num_examples"] for c in recs[0]["clients"]]
    assert all(0 < r <= 1 for r in rs)
    sharing = state.scalars["sharing"]
    assert sharing["ratio"] == pytest.approx(sum(r * n for r, n in zip(rs, ns)) / sum(ns))
    assert len(sharing["selected"]) == num_selected(sharing["ratio"], 2)
    d_kv = 2 * 8  # tiny-llama: 2 key/value heads of 8
    assert summary["upload_tensor_bytes"] == 2 * len(sharing["selected"]) * 2 * d_kv * 4


def test_a_failed_selection_round_selects_in_the_next_completed_round(tiny_cfg, tmp_path):
    """Round t fails (every client raises, the round is skipped): the layers are selected in round t + 1, not
    never."""
    cfg = _cfg(tiny_cfg, federation__rounds=3, federation__clients_per_round=None, method__sharing__warmup_rounds=1,
               faults__fail_clients=[0, 1, 2, 3], faults__rounds=[1], federation__on_round_failure="skip")
    run_embedded(cfg, tmp_path / "run")
    recs = RunDir(tmp_path / "run").read_metrics()
    assert "round_failed" in recs[0] and "round_failed" not in recs[1]
    sharing = RunDir(tmp_path / "run").load_checkpoint()[1].scalars["sharing"]
    assert sharing["selection_round"] == 2 and len(sharing["selected"]) == 1


def test_fedavg_prefix_sends_every_layer_every_round(tiny_cfg, tmp_path):
    cfg = _cfg(tiny_cfg, method__name="fedavg-prefix", method__sharing__warmup_rounds=None, federation__rounds=2)
    summary = run_embedded(cfg, tmp_path / "run")
    assert summary["upload_tensor_bytes"] == 4 * 2 * 2 * 32 * 4
    _, state, _, _ = RunDir(tmp_path / "run").load_checkpoint()
    assert state.scalars["sharing"]["selected"] is None and not [k for k in state.tensors if k.startswith("agg/")]


@pytest.mark.slow
def test_fedpeptao_on_minilm_halves_the_upload(tmp_path):
    from fedpeft.resolve import load_config

    cfg = load_config(None, [
        "model.name=minilm", "task.name=synthetic-sentiment", "task.num_examples=120", "task.max_length=24",
        "method.name=fedpeptao", "method.adapter.num_tokens=2", "method.sharing.warmup_rounds=1",
        "method.trainer.max_steps=2", "federation.num_clients=3", "federation.rounds=2", "runtime.progress=false",
        "evaluation.local=false", "evaluation.round_zero=false"])
    exp = build_experiment(cfg)
    before = exp.backbone.checksum()
    summary = run_embedded(cfg, tmp_path / "run", experiment=exp)
    recs = RunDir(tmp_path / "run").read_metrics()
    per_layer = 2 * 2 * 384 * 4
    assert summary["upload_tensor_bytes"] == 3 * per_layer  # ⌈0.5 · 6⌉ layers
    assert recs[0]["bytes_up"] / 3 > 6 * per_layer and recs[1]["bytes_up"] / 3 < 3 * per_layer + 512
    assert exp.backbone.checksum() == before
