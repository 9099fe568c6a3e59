"""FedBPT's CMA-ES math: sigma' (Eqs. 14/16/17), the server step (Eq. 8), constants and calibration (App. A),
pycma's options (log weights, selective mirroring) and the covariance models."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedpeft.aggregators.server_cmaes import (
    ServerCMAESSettings,
    effective_size,
    server_cmaes_step,
    sigma_prime,
)
from fedpeft.trainers.cmaes import (
    CMAESSettings,
    CMAState,
    cma_constants,
    parent_weights,
    sample,
    selective_mirrors,
    tell,
)


def test_sigma_prime_worked_values_of_spec():
    # 10 clients, lambda = 5, I = 8, every sigma = 1 (spec §8.2 item 3, A14)
    sigmas = [np.ones(8)] * 10
    losses = list(np.linspace(0, 1, 10))
    assert sigma_prime(sigmas, losses, 5, "eq16") == pytest.approx(2.0, abs=1e-12)
    assert sigma_prime(sigmas, losses, 5, "eq17") == pytest.approx(1.788854, abs=1e-6)
    assert sigma_prime(sigmas, losses, 5, "code") == pytest.approx(2.0, abs=1e-12)
    # even lambda: the literal and the integer form agree
    assert sigma_prime(sigmas, losses, 4, "eq17") == pytest.approx(2.0, abs=1e-12)
    assert sigma_prime(sigmas, losses, 4, "eq16") == pytest.approx(2.0, abs=1e-12)


def test_sigma_prime_uses_only_the_best_half():
    losses = [0.1, 0.9, 0.2, 0.8]  # best half: clients 0 and 2
    sigmas = [np.full(2, 1.0), np.full(2, 100.0), np.full(2, 3.0), np.full(2, 100.0)]
    # eq16: mu = 2, mu_l = floor(5/2) = 2 -> sqrt((2*1 + 2*9) / 4)
    assert sigma_prime(sigmas, losses, 5, "eq16") == pytest.approx(math.sqrt(20 / 4))
    assert sigma_prime(sigmas, losses, 5, "eq17") == pytest.approx(2 * math.sqrt(20 / (4 * 5)))
    assert sigma_prime(sigmas, losses, 5, "raw", sigma_t=0.7) == 0.7


def test_server_mean_is_average_of_best_half_client_means():
    rng = np.random.default_rng(0)
    d, k = 30, 10
    st = CMAState(rng.normal(size=d), 0.8, np.eye(d))
    means = [st.mean + rng.normal(size=d) for _ in range(k)]
    losses = rng.random(k)
    step = server_cmaes_step(st, means, [np.full(8, 0.8)] * k, losses, 5, ServerCMAESSettings())
    best = np.argsort(losses)[: k // 2]
    np.testing.assert_allclose(step.state.mean, np.mean([means[i] for i in best], axis=0), atol=1e-12)
    assert sorted(step.parents) == sorted(best.tolist())
    assert step.sigma_prime == pytest.approx(math.sqrt(5 * 8 * 0.64 / (5 * 2)))
    # ratio transfer (A15): the client sigma changes by the server's multiplicative factor only
    assert step.state.sigma == pytest.approx(0.8 * step.sigma_server / step.sigma_prime)
    literal = server_cmaes_step(st, means, [np.full(8, 0.8)] * k, losses, 5,
                                ServerCMAESSettings(sigma_transfer="literal"))
    assert literal.state.sigma == pytest.approx(literal.sigma_server)


def test_constants_match_spec_for_d500():
    srv = cma_constants(500, parent_weights(10, 5))
    assert srv.mueff == pytest.approx(5.0)
    assert srv.cs == pytest.approx(0.01373, abs=5e-6)
    assert srv.ds == pytest.approx(1.0137, abs=5e-5)
    assert srv.cc == pytest.approx(0.00796, abs=5e-6)
    assert srv.c1 == pytest.approx(7.96e-6, rel=1e-3)
    assert srv.cmu == pytest.approx(2.54e-5, rel=2e-3)
    assert srv.chin == pytest.approx(22.35, abs=5e-3)
    cli = cma_constants(500, parent_weights(5))
    assert cli.mu == 2 and cli.mueff == pytest.approx(2.0)
    assert cli.cs == pytest.approx(0.00789, abs=5e-6)
    assert cli.cmu == pytest.approx(3.97e-6, rel=2e-3)


def test_tell_mean_is_parent_average_and_cmaes_minimises_a_sphere():
    rng = np.random.default_rng(1)
    d = 10
    k = cma_constants(d, parent_weights(6))
    st = CMAState(np.full(d, 3.0), 1.0, np.eye(d))
    x = sample(st, 6, rng)
    f = (x ** 2).sum(1)
    new = tell(st, k, x, f)
    np.testing.assert_allclose(new.mean, x[np.argsort(f)[:3]].mean(0), atol=1e-12)
    assert new.g == 1 and np.allclose(new.cov, new.cov.T)
    for _ in range(300):
        x = sample(new, 6, rng)
        new = tell(new, k, x, (x ** 2).sum(1))
    assert float((new.mean ** 2).sum()) < 1e-3 * 90


def _local_step(rng: np.random.Generator, alpha: np.ndarray, sigmas: np.ndarray, lam: int, d: int) -> np.ndarray:
    """A client's round under neutral (random) selection: sum_j sigma_j sum_i alpha_i y_{j,i} (Eqs. 12-13, C = I)."""
    y = rng.standard_normal((len(sigmas), lam, d))[:, : len(alpha)]
    return np.einsum("j,i,jid->d", sigmas, alpha, y)


@pytest.mark.parametrize("weights", ["equal", "log"])
def test_corrected_sigma_keeps_server_path_calibrated_under_neutral_selection(weights):
    """App. A: with sigma' (Eq. 16/14) the normalised server step is ~N(0, I); with the raw local sigma ~2x too long."""
    d, clients, iters, lam = 200, 10, 8, 5
    alpha = parent_weights(lam, kind=weights)
    norms = {}
    for rule in ("eq16", "raw"):
        rng = np.random.default_rng(7)
        st = CMAState(np.zeros(d), 1.0, np.eye(d))
        cfg = ServerCMAESSettings(sigma_rule=rule, weights=weights)
        for _ in range(40):
            means = [st.mean + _local_step(rng, alpha, np.full(iters, st.sigma), lam, d) for _ in range(clients)]
            step = server_cmaes_step(st, means, [np.full(iters, st.sigma)] * clients, rng.random(clients), lam,
                                     cfg, covariance="none", local_weights=weights)
            st = step.state
        k = cma_constants(d, parent_weights(clients, clients // 2, weights))
        norms[rule] = np.linalg.norm(st.ps) / math.sqrt(1 - (1 - k.cs) ** (2 * st.g)) / k.chin
    assert 0.85 < norms["eq16"] < 1.15
    assert norms["raw"] > 1.6


def test_log_weights_are_pycmas_default():
    """pycma RecombinationWeights(lambda): positive part of ln((lambda+1)/2) - ln(i); CMA_mu = mu uses 2 mu."""
    w = parent_weights(5, kind="log")  # the authors' local CMA-ES (lambda = 5, pycma defaults)
    raw = np.array([math.log(3), math.log(3) - math.log(2)])
    np.testing.assert_allclose(w, raw / raw.sum(), rtol=1e-12)
    np.testing.assert_allclose(w, [0.73042271, 0.26957729], atol=1e-8)  # pycma 4.x positive_weights
    assert 1 / np.sum(w ** 2) == pytest.approx(1.649649838880741, rel=1e-12)  # pycma's weights.mueff
    # the authors' server: popsize = CMA_mu = |S| = 10 -> RecombinationWeights(20): every client a parent, w > 0
    w_all = parent_weights(10, 10, "log")
    raw_all = math.log(10.5) - np.log(np.arange(1, 11))
    np.testing.assert_allclose(w_all, raw_all / raw_all.sum(), rtol=1e-12)
    assert np.all(w_all > 0) and np.all(np.diff(w_all) < 0)
    # best half of 10 with log weights: RecombinationWeights(10)
    raw_half = math.log(5.5) - np.log(np.arange(1, 6))
    np.testing.assert_allclose(parent_weights(10, 5, "log"), raw_half / raw_half.sum(), rtol=1e-12)
    assert effective_size(w) == pytest.approx(1 / np.sum(w ** 2), rel=1e-12)
    assert effective_size(np.full(3, 1 / 3)) == 3.0


def test_sigma_prime_with_log_weights_by_hand():
    """Eq. 14 with the weights applied: sigma'^2 = mu_w sum_k w_k^2 S_k / mu_eff,l, on 4 clients, I = 2."""
    losses = [0.3, 0.1, 0.4, 0.2]  # ranking: client 1, client 3, client 0, client 2
    sigmas = [np.array([10.0, 10.0]), np.array([1.0, 2.0]), np.array([10.0, 10.0]), np.array([2.0, 2.0])]
    # server: best half (mu = 2) with log weights of lambda_s = 4 -> raw ln 2.5, ln 2.5 - ln 2
    r1, r2 = math.log(2.5), math.log(2.5) - math.log(2)
    s1, s2 = 1 + 4, 4 + 4  # S of client 1 and client 3
    mu_w_times_sum = (r1 ** 2 * s1 + r2 ** 2 * s2) / (r1 ** 2 + r2 ** 2)
    # clients: log weights of lambda = 5 -> raw ln 3, ln 1.5; mu_eff,l = (sum)^2 / sum of squares
    a1, a2 = math.log(3), math.log(1.5)
    mueff_l = (a1 + a2) ** 2 / (a1 ** 2 + a2 ** 2)
    want = math.sqrt(mu_w_times_sum / mueff_l)
    assert want == pytest.approx(1.769961, abs=1e-6)
    got = sigma_prime(sigmas, losses, 5, "eq16", weights=parent_weights(4, 2, "log"),
                      local_weights=parent_weights(5, kind="log"))
    assert got == pytest.approx(want, rel=1e-12)
    # equal weights given explicitly are Eq. 16 exactly: sqrt((5 + 8) / (2 * 2))
    assert sigma_prime(sigmas, losses, 5, "eq16", weights=parent_weights(4, 2)) == math.sqrt(13 / 4)
    assert sigma_prime(sigmas, losses, 5, "eq16", weights=parent_weights(4, 2),
                       local_weights=parent_weights(5)) == math.sqrt(13 / 4)
    # all clients as parents with equal weights: the authors' formula (rule 'code')
    assert sigma_prime(sigmas, losses, 5, "eq16", weights=parent_weights(4, 4)) == \
        pytest.approx(sigma_prime(sigmas, losses, 5, "code"), rel=1e-12)


@pytest.mark.parametrize("parents,weights", [("half", "equal"), ("half", "log"), ("all", "log"), ("all", "equal")])
def test_sigma_prime_normalises_the_server_step_with_the_weights_applied(parents, weights):
    """Eq. 10: sqrt(mu_w) (z_{t+1} - z_t) / sigma' ~ N(0, I) under neutral selection, clients with unequal sigmas.

    The hard-coded mu = floor(|S|/2), mu_l = floor(lambda/2) missed it by mu_l / mu_eff,l = 1.21 in variance with
    log weights (and summed only the best half when all clients are parents)."""
    d, clients, iters, lam = 50, 8, 3, 5
    rng = np.random.default_rng(3)
    alpha = parent_weights(lam, kind=weights)
    cfg = ServerCMAESSettings(parents=parents, weights=weights)
    w = parent_weights(clients, clients // 2 if parents == "half" else clients, weights)
    normalised, hard_coded = [], []
    st = CMAState(np.zeros(d), 1.0, np.eye(d))
    for _ in range(300):
        sig = [np.full(iters, c) for c in rng.uniform(0.3, 2.0, clients)]
        means = [_local_step(rng, alpha, s, lam, d) for s in sig]
        losses = rng.random(clients)
        step = server_cmaes_step(st, means, sig, losses, lam, cfg, covariance="none", local_weights=weights)
        normalised.append(math.sqrt(1 / np.sum(w ** 2)) * step.state.mean / step.sigma_prime)
        best = np.argsort(losses)[: clients // 2]
        old = math.sqrt(sum(float(np.sum(sig[i] ** 2)) for i in best) / (clients // 2 * (lam // 2)))
        hard_coded.append(normalised[-1] * step.sigma_prime / old)
    assert np.var(normalised) == pytest.approx(1.0, abs=0.06)
    if (parents, weights) == ("half", "log"):
        assert np.var(hard_coded) > 1.12


def test_selective_mirror_directions_follow_pycma():
    """m_old - x of the worst candidate; a worst candidate that was itself a mirror is not mirrored back."""
    x = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [0.5, 0.5]])
    fit = np.array([0.2, 0.1, 0.9, 0.3])
    m_old = np.array([1.0, 1.0])
    np.testing.assert_array_equal(selective_mirrors(m_old, x, fit, 1), [[-2.0, -2.0]])
    np.testing.assert_array_equal(selective_mirrors(m_old, x, fit, 2), [[-2.0, -2.0], [0.5, 0.5]])
    assert selective_mirrors(m_old, x, np.array([0.2, 0.1, 0.0, 0.3]), 1, were_mirrors=1).shape == (1, 2)
    assert selective_mirrors(m_old, x, np.array([0.9, 0.1, 0.0, 0.3]), 1, were_mirrors=1).shape == (0, 2)


def test_injected_mirror_is_kept_or_rescaled_like_pycma():
    d, lam = 6, 5
    st = CMAState(np.full(d, 0.5), 0.5, np.diag(np.arange(1.0, d + 1)))
    short = 0.1 * np.ones(d)  # Mahalanobis length < sqrt(d): kept as it is
    x = sample(st, lam, np.random.default_rng(4), np.array([short]))
    np.testing.assert_array_equal(x[0], st.mean + short)
    np.testing.assert_array_equal(x[1:], sample(st, lam - 1, np.random.default_rng(4)))  # then the usual draws
    long = 10 * np.ones(d)  # too long: rescaled to |N(0, I)| of one fresh draw, drawn before the others
    rng = np.random.default_rng(4)
    x = sample(st, lam, rng, np.array([long]))
    ref = np.random.default_rng(4)
    chi = np.linalg.norm(ref.standard_normal(d))
    mahalanobis = np.linalg.norm(long / np.sqrt(np.diagonal(st.cov))) / st.sigma
    np.testing.assert_allclose(x[0], st.mean + long * chi / mahalanobis, rtol=1e-12)
    np.testing.assert_array_equal(x[1:], sample(st, lam - 1, ref))
    assert x.shape == (lam, d)
    with pytest.raises(ValueError, match="mirrors"):
        CMAESSettings(popsize=5, mirrors=3)


def test_cmaes_with_pycma_options_minimises_a_sphere():
    """Log weights and one selective mirror per iteration (pycma's defaults at lambda = 5)."""
    rng = np.random.default_rng(2)
    d, lam = 10, 5
    k = cma_constants(d, parent_weights(lam, kind="log"))
    st, mirrors = CMAState(np.full(d, 3.0), 1.0, np.eye(d)), None
    for _ in range(400):
        x = sample(st, lam, rng, mirrors)
        f = (x ** 2).sum(1)
        mirrors = selective_mirrors(st.mean, x, f, 1, 0 if mirrors is None else len(mirrors))
        st = tell(st, k, x, f)
    assert float((st.mean ** 2).sum()) < 1e-3 * 90


def test_diagonal_model_keeps_C_diagonal_and_none_keeps_I():
    rng = np.random.default_rng(5)
    d = 8
    k = cma_constants(d, parent_weights(6))
    st = CMAState(np.zeros(d), 1.0, np.eye(d))
    x = sample(st, 6, rng)
    f = (x ** 2).sum(1)
    full, diag, none = (tell(st, k, x, f, c) for c in ("full", "diagonal", "none"))
    assert np.any(full.cov - np.diag(np.diagonal(full.cov)))
    np.testing.assert_array_equal(diag.cov, np.diag(np.diagonal(diag.cov)))
    np.testing.assert_allclose(np.diagonal(diag.cov), np.diagonal(full.cov), rtol=1e-12)  # same first update
    np.testing.assert_array_equal(none.cov, np.eye(d))
    np.testing.assert_array_equal(diag.mean, full.mean)
    # the server step in diagonal mode, several rounds: C stays diagonal
    st = CMAState(np.zeros(d), 1.0, np.eye(d))
    for _ in range(5):
        means = [st.mean + rng.standard_normal(d) for _ in range(6)]
        st = server_cmaes_step(st, means, [np.full(3, st.sigma)] * 6, rng.random(6), 5, ServerCMAESSettings(),
                               covariance="diagonal").state
    np.testing.assert_array_equal(st.cov, np.diag(np.diagonal(st.cov)))
    assert not np.allclose(np.diagonal(st.cov), 1.0)
    # sampling from a diagonal C is m + sigma sqrt(diag C) N(0, I)
    np.testing.assert_allclose(sample(st, 4, np.random.default_rng(1)),
                               st.mean + st.sigma * np.sqrt(np.diagonal(st.cov))
                               * np.random.default_rng(1).standard_normal((4, d)), rtol=1e-12)


def test_draws_do_not_depend_on_the_eigensolvers_basis(monkeypatch):
    """With repeated eigenvalues (C = I plus a rank-2 update, as after a first CMA-ES step) the eigenbasis within
    the repeated eigenspace, and every eigenvector's sign, are the eigensolver's choice, which differs between CPU
    kernels (issue 35). Sampling through the symmetric root B D B^T draws the same candidates from any basis."""
    d = 6
    rng = np.random.default_rng(0)
    u, v = rng.standard_normal(d), rng.standard_normal(d)
    cov = np.eye(d) + 0.3 * np.outer(u, u) + 0.2 * np.outer(v, v)
    st = CMAState(np.arange(d, dtype=float), 0.7, cov)
    vals, vecs = np.linalg.eigh(cov)
    assert np.sum(np.isclose(vals, 1.0)) == d - 2  # a 4-fold eigenvalue
    # another valid eigenbasis: rotate within the repeated eigenspace and flip the other vectors' signs
    q, _ = np.linalg.qr(rng.standard_normal((d - 2, d - 2)))
    rep = np.isclose(vals, 1.0)
    other = vecs.copy()
    other[:, rep] = vecs[:, rep] @ q
    other[:, ~rep] *= -1
    np.testing.assert_allclose(other @ np.diag(vals) @ other.T, cov, atol=1e-12)
    want = sample(st, 5, np.random.default_rng(3))
    monkeypatch.setattr(np.linalg, "eigh", lambda a: (vals, other))
    np.testing.assert_allclose(sample(st, 5, np.random.default_rng(3)), want, atol=1e-12)
