"""Local DP (FedPrompt §IV-F, Table V) and the outlier defence (§V): clipping, noise scales, determinism,
the accountant against dp_accounting, the filter, and a short run that resumes identically."""

from __future__ import annotations

import logging
import math

import dp_accounting
import pytest
import torch
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from fedpeft.aggregators import AGGREGATORS, WRAPPERS, AggregatorContext
from fedpeft.aggregators.outlier_filter import OutlierFilterSettings
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.privacy import epsilon_after, gaussian_sigma, sampling_rate
from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS
from fedpeft.transforms.ldp import Ldp, LdpSettings, clip_delta, gaussian_noise, laplace_noise

pytestmark = pytest.mark.usefixtures("one_thread")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- the ldp transform


def test_settings_need_exactly_one_of_noise_and_epsilon():
    with pytest.raises(ValueError, match="exactly one"):
        LdpSettings()
    with pytest.raises(ValueError, match="exactly one"):
        LdpSettings(noise=1.0, epsilon=1.0)


def test_delta_is_clipped_to_the_bound_before_noise():
    start = {"a": torch.zeros(3, 4), "b": torch.ones(5)}
    up = Update(0, {"a": torch.full((3, 4), 2.0), "b": torch.full((5,), -3.0)}, 7)
    t = Ldp(LdpSettings(mechanism="gaussian", clip=0.5, noise=0.3))
    out = t.apply(up, start, 1, _gen(11))
    noise = gaussian_noise(17, 0.3 * 0.5, _gen(11))  # the same draws, from the same generator only
    released = torch.cat([(out.tensors[k].double() - start[k].double()).reshape(-1) for k in ("a", "b")])
    assert float((released - noise).norm()) <= 0.5 + 1e-6
    assert out.weight == 7 and out.tensors["a"].dtype == torch.float32
    small = torch.tensor([0.1, -0.2])
    assert torch.equal(clip_delta(small, 1.0), small)  # already within the ball: unchanged
    assert math.isclose(float(clip_delta(torch.tensor([3.0, 4.0]), 1.0).norm()), 1.0, rel_tol=1e-12)


def test_laplace_and_gaussian_noise_have_the_configured_scale():
    n, b = 200_000, 0.37
    lap = laplace_noise(n, b, _gen(0))
    assert abs(float(lap.abs().mean()) / b - 1) < 0.05 and abs(float(lap.mean())) < 0.01
    assert abs(float(lap.std()) / (math.sqrt(2) * b) - 1) < 0.05
    gau = gaussian_noise(n, 0.8, _gen(1))
    assert abs(float(gau.std()) / 0.8 - 1) < 0.05
    # through the transform: zero delta, so the upload minus the start is the noise itself
    start = {"p": torch.zeros(n)}
    out = Ldp(LdpSettings(mechanism="laplace", noise=b)).apply(Update(0, {"p": torch.zeros(n)}, 1), start, 1,
                                                                _gen(2))
    assert abs(float(out.tensors["p"].abs().mean()) / b - 1) < 0.05
    out = Ldp(LdpSettings(mechanism="gaussian", clip=2.0, noise=0.5)).apply(
        Update(0, {"p": torch.zeros(n)}, 1), start, 1, _gen(3))
    assert abs(float(out.tensors["p"].std()) / (0.5 * 2.0) - 1) < 0.05


def test_noise_is_deterministic_per_generator_seed():
    start = {"p": torch.zeros(50)}
    up = Update(0, {"p": torch.linspace(-1, 1, 50)}, 1)
    t = Ldp(LdpSettings(mechanism="laplace", epsilon=5.0))
    a, b, c = (t.apply(up, start, 1, _gen(s)).tensors["p"] for s in (4, 4, 5))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_epsilon_mode_calibrates_the_scale_to_the_sensitivity():
    k, clip = 64, 0.5
    lap = Ldp(LdpSettings(mechanism="laplace", clip=clip, epsilon=2.0))
    assert math.isclose(lap.scale(k), 2 * math.sqrt(k) * clip / 2.0)  # b = Δ1/ε, Δ1 = 2√k·C
    gau = Ldp(LdpSettings(mechanism="gaussian", clip=clip, epsilon=1.0, delta=1e-5))
    z = gau.scale(k) / (2 * clip)  # noise std per unit of the L2 sensitivity 2C
    pld = PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(z))
    assert math.isclose(pld.get_epsilon(1e-5), 1.0, rel_tol=0.02)
    assert math.isclose(gaussian_sigma(1.0, 1e-5), z)


# ---------------------------------------------------------------- accounting


def test_gaussian_accountant_matches_dp_accounting_reference():
    acc = RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 10_000)
    ref = acc.get_epsilon(1e-5)
    got = epsilon_after(10_000, "gaussian", noise_multiplier=1.1, q=0.01, delta=1e-5)
    assert got == pytest.approx(ref, rel=1e-12) and 4.0 < got < 8.0
    # no sampling: the plain Gaussian composed, and more rounds never spend less
    acc = RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(2.0), 5)
    assert epsilon_after(5, "gaussian", noise_multiplier=2.0, delta=1e-5) == pytest.approx(acc.get_epsilon(1e-5))
    assert epsilon_after(6, "gaussian", noise_multiplier=2.0) > epsilon_after(5, "gaussian", noise_multiplier=2.0)
    assert epsilon_after(0, "gaussian", noise_multiplier=2.0) == 0.0


def test_laplace_pure_epsilon_composes_additively():
    assert epsilon_after(7, "laplace", epsilon_per_round=0.3) == pytest.approx(2.1)
    # dp_accounting's PLD of the Laplace mechanism (noise multiplier b/Δ) approaches the same sum as δ → 0
    pld = PLDAccountant()
    pld.compose(dp_accounting.LaplaceDpEvent(1 / 0.3), 7)
    assert pld.get_epsilon(1e-12) <= 2.1 + 1e-3
    with pytest.raises(ValueError):
        epsilon_after(1, "laplace")


def test_sampling_rate_only_for_uniform_random_selection(tiny_cfg):
    def q(cfg):
        return sampling_rate(cfg.federation, cfg.method.selector)

    assert q(tiny_cfg(federation__num_clients=10, federation__clients_per_round=2)) == 0.2
    assert q(tiny_cfg()) == 1.0
    assert q(tiny_cfg(federation__num_clients=10, federation__clients_per_round=2,
                      method__selector__name="loss_difference")) == 1.0


# ---------------------------------------------------------------- outlier filter


def _filter():
    ctx = AggregatorContext(num_clients=5, seed=0)
    inner = AGGREGATORS.get("fedavg")(None, ctx)
    return WRAPPERS.get("outlier_filter")(OutlierFilterSettings(), ctx, inner)


def test_outlier_filter_drops_the_outlier_and_keeps_all_otherwise(caplog):
    glob = {"p": torch.zeros(2, 8)}
    g = _gen(0)
    honest = [Update(c, {"p": 0.1 * torch.randn(2, 8, generator=g)}, 10) for c in range(5)]
    f = _filter()
    state = f.init(glob)
    new, st = f.aggregate(glob, honest, state, 1)
    assert f.diagnostics(st)["filtered"] == 0
    assert torch.allclose(new["p"], torch.stack([u.tensors["p"] for u in honest]).mean(0), atol=1e-6)

    bad = honest[:4] + [Update(4, {"p": 3.0 + torch.randn(2, 8, generator=g)}, 10)]
    with caplog.at_level(logging.WARNING, logger="fedpeft.aggregators.outlier_filter"):
        new, st = f.aggregate(glob, bad, st, 2)
    assert f.diagnostics(st)["filtered"] == 1 and "[4]" in caplog.text
    assert torch.allclose(new["p"], torch.stack([u.tensors["p"] for u in honest[:4]]).mean(0), atol=1e-6)


def test_outlier_filter_needs_enough_clients_and_never_drops_everyone():
    glob = {"p": torch.zeros(4)}
    f = _filter()
    few = [Update(c, {"p": torch.full((4,), float(10 ** c))}, 1) for c in range(3)]
    assert f.transform(glob, few, 1) == few and f._filtered == 0  # below min_clients: untouched
    near = [Update(c, {"p": torch.tensor([1.0, 2.0, 3.0, 4.0]) + 1e-7 * c}, 1) for c in range(5)]
    assert len(f.transform(glob, near, 1)) == 5  # rounding-level differences are not outliers


# ---------------------------------------------------------------- in a run


def _strip(records):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def test_ldp_with_outlier_filter_runs_reports_epsilon_and_resumes_identically(tiny_cfg, tmp_path):
    cfg = tiny_cfg(federation__num_clients=5, method__transforms="[{name: ldp, mechanism: laplace, noise: 0.01}]",
                   method__wrappers="[{name: outlier_filter}]")
    summary = run_embedded(cfg, tmp_path / "full")
    recs = RunDir(tmp_path / "full").read_metrics()
    k = summary["trainable_params"]  # the soft prompt's coordinates
    assert [r["round"] for r in recs] == [1, 2] and all(math.isfinite(r["loss"]) for r in recs)
    for r in recs:
        assert r["server"]["epsilon"] == pytest.approx(r["round"] * 2 * math.sqrt(k) * 1.0 / 0.01)
        assert "filtered" in r["server"] and "delta" not in r["server"]
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1)
    run_embedded(cfg, tmp_path / "cut", resume=True)
    assert _strip(RunDir(tmp_path / "cut").read_metrics()) == _strip(recs)


def test_gaussian_ldp_reports_epsilon_and_delta(tiny_cfg, tmp_path):
    cfg = tiny_cfg(federation__rounds=1, federation__clients_per_round=2,
                   method__transforms="[{name: ldp, mechanism: gaussian, noise: 1.1, clip: 0.5}]")
    run_embedded(cfg, tmp_path / "run")
    server = RunDir(tmp_path / "run").read_metrics()[0]["server"]
    assert server["delta"] == 1e-5
    assert server["epsilon"] == pytest.approx(epsilon_after(1, "gaussian", noise_multiplier=1.1, q=2 / 3))
    assert server["epsilon_local"] == pytest.approx(epsilon_after(1, "gaussian", noise_multiplier=0.55))


# ---------------------------------------------------------------- central DP: DP-FedAvg


def _dp(clip: float, z: float, num_clients: int = 4, q: float = 1.0):
    from fedpeft.aggregators.dp_fedavg import DpFedAvgSettings

    ctx = AggregatorContext(num_clients=num_clients, seed=3, sampling_rate=q)
    return WRAPPERS.get("dp_fedavg")(DpFedAvgSettings(clip=clip, noise_multiplier=z), ctx,
                                     AGGREGATORS.get("uniform")(None, ctx))


def test_dp_fedavg_is_the_clipped_uniform_mean_plus_noise_of_std_z_s_over_m():
    from fedpeft.rng import SHARED, torch_rng

    glob = {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([0.0])}
    ups = [Update(0, {"a": torch.tensor([4.0, 5.0]), "b": torch.tensor([0.0])}, 50),  # delta norm 5 -> clipped to 1
           Update(1, {"a": torch.tensor([1.0, 1.5]), "b": torch.tensor([0.0])}, 1)]   # norm 0.5: kept
    agg = _dp(clip=1.0, z=0.8, q=0.5)
    new, state = agg.aggregate(glob, ups, agg.init(glob), 2)
    # weights ignored
    mean = {"a": torch.tensor([1.0 + (0.6 + 0.0) / 2, 1.0 + (0.8 + 0.5) / 2]), "b": torch.tensor([0.0])}
    gen = torch_rng(3, 2, SHARED, "dp-fedavg")
    std = 0.8 * 1.0 / 2
    for k in sorted(glob):  # the noise, drawn in key order from the round's derived stream
        expect = mean[k].double() + std * torch.randn(mean[k].shape, generator=gen, dtype=torch.float64)
        assert torch.allclose(new[k].double(), expect, atol=1e-6)
    assert state.scalars["clipped"] == 1 and state.scalars["dp_noise_std"] == pytest.approx(std)
    assert state.scalars["epsilon"] == pytest.approx(epsilon_after(2, "gaussian", noise_multiplier=0.8, q=0.5))
    assert agg.diagnostics(state)["epsilon"] == state.scalars["epsilon"]
    # empirically: zero deltas from m = 5 clients leave only the noise, of std z*S/m
    big = {"p": torch.zeros(20_000)}
    new, _ = _dp(clip=2.0, z=1.5).aggregate(big, [Update(c, {"p": torch.zeros(20_000)}, 1) for c in range(5)],
                                           Message(), 1)
    assert float(new["p"].std()) == pytest.approx(1.5 * 2.0 / 5, rel=0.03) and abs(float(new["p"].mean())) < 0.01


def test_dp_fedavg_wraps_only_the_uniform_mean(tiny_cfg):
    from fedpeft.config import ConfigError

    with pytest.raises(ConfigError, match="dp_fedavg' wraps only uniform"):
        tiny_cfg(method__wrappers="[{name: dp_fedavg, clip: 1.0, noise_multiplier: 1.0}]")
    with pytest.raises(ConfigError, match="noise_multiplier"):
        tiny_cfg(method__aggregator__name="uniform", method__wrappers="[{name: dp_fedavg, clip: 1.0}]")


def test_dp_fedavg_run_reports_epsilon_and_resumes_identically(tiny_cfg, tmp_path):
    cfg = tiny_cfg(federation__num_clients=4, federation__clients_per_round=2, method__aggregator__name="uniform",
                   method__wrappers="[{name: dp_fedavg, clip: 0.5, noise_multiplier: 1.2}]")
    run_embedded(cfg, tmp_path / "full")
    recs = RunDir(tmp_path / "full").read_metrics()
    for r in recs:
        assert r["server"]["epsilon"] == pytest.approx(
            epsilon_after(r["round"], "gaussian", noise_multiplier=1.2, q=0.5))
        assert r["server"]["dp_noise_std"] == pytest.approx(1.2 * 0.5 / 2)
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1)
    run_embedded(cfg, tmp_path / "cut", resume=True)
    assert _strip(RunDir(tmp_path / "cut").read_metrics()) == _strip(recs)
