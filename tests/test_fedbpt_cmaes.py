"""FedBPT's CMA-ES math: sigma' (Eqs. 16/17), the server step (Eq. 8), constants and calibration (App. A)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedpeft.aggregators.server_cmaes import (
    ServerCMAESSettings,
    server_cmaes_step,
    sigma_prime,
)
from fedpeft.trainers.cmaes import CMAState, cma_constants, parent_weights, sample, tell


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


def test_corrected_sigma_keeps_server_path_calibrated_under_neutral_selection():
    """App. A: with sigma' (Eq. 16) the normalised server step is ~N(0, I); with the raw local sigma it is ~2x too long."""
    d, clients, iters, lam, mu_l = 200, 10, 8, 5, 2
    norms = {}
    for rule in ("eq16", "raw"):
        rng = np.random.default_rng(7)
        st = CMAState(np.zeros(d), 1.0, np.eye(d))
        cfg = ServerCMAESSettings(sigma_rule=rule)
        for _ in range(40):
            means = []
            for _ in range(clients):  # local random walk with random (neutral) selection of mu_l of lambda
                steps = rng.standard_normal((iters, lam, d))[:, :mu_l].mean(1)
                means.append(st.mean + st.sigma * steps.sum(0))
            step = server_cmaes_step(st, means, [np.full(iters, st.sigma)] * clients, rng.random(clients), lam,
                                     cfg, update_cov=False)
            st = step.state
        k = cma_constants(d, parent_weights(clients, clients // 2))
        norms[rule] = np.linalg.norm(st.ps) / math.sqrt(1 - (1 - k.cs) ** (2 * st.g)) / k.chin
    assert 0.85 < norms["eq16"] < 1.15
    assert norms["raw"] > 1.7
