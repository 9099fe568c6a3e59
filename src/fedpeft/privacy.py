"""Privacy accounting for the ``ldp`` transform (FedPrompt §IV-F / Table V; spec 003 §2.6, §7 row 19).

Gaussian: Rényi-DP accounting by ``dp_accounting.rdp.RdpAccountant`` of the subsampled Gaussian mechanism
(PoissonSampledDpEvent(q, GaussianDpEvent(z)) self-composed over the rounds), converted to ε at a given δ.
Laplace: pure ε by basic (sequential) composition, ε_T = Σ ε_round: dp_accounting's PLD and RDP accountants
both answer ∞ for LaplaceDpEvent at δ = 0, and for pure DP the sum is the standard composition bound.
``dp_accounting`` is imported lazily (it pulls in scipy and absl), so runs without DP never load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedpeft.config import Component, FederationConfig


def gaussian_epsilon(rounds: int, noise_multiplier: float, q: float = 1.0, delta: float = 1e-5) -> float:
    """ε after ``rounds`` compositions of the Poisson-subsampled Gaussian (noise std / L2 sensitivity = z)."""
    if rounds <= 0:
        return 0.0
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    event = dp_accounting.GaussianDpEvent(noise_multiplier)
    if q < 1.0:
        event = dp_accounting.PoissonSampledDpEvent(q, event)
    acc = RdpAccountant()
    acc.compose(event, int(rounds))
    return float(acc.get_epsilon(delta))


def laplace_epsilon(rounds: int, epsilon_per_round: float) -> float:
    """Pure ε after ``rounds`` releases of an ε_round-DP Laplace mechanism (basic composition: the sum)."""
    return float(max(int(rounds), 0) * epsilon_per_round)


def gaussian_sigma(epsilon: float, delta: float) -> float:
    """Noise std per unit L2 sensitivity of a single (ε, δ)-DP Gaussian release (dp_accounting's analytic
    calibration, Balle & Wang 2018)."""
    import dp_accounting

    return float(dp_accounting.get_sigma_gaussian(epsilon, delta))


def epsilon_after(rounds: int, mechanism: str, *, noise_multiplier: float | None = None,
                  epsilon_per_round: float | None = None, q: float = 1.0, delta: float = 1e-5) -> float:
    """ε after ``rounds`` rounds: ``gaussian`` (needs ``noise_multiplier``; (ε, δ) with sampling rate q) or
    ``laplace`` (needs ``epsilon_per_round``; pure ε, every round counted: the worst-case client)."""
    if mechanism == "gaussian":
        if noise_multiplier is None:
            raise ValueError("gaussian accounting needs noise_multiplier")
        return gaussian_epsilon(rounds, noise_multiplier, q, delta)
    if mechanism == "laplace":
        if epsilon_per_round is None:
            raise ValueError("laplace accounting needs epsilon_per_round")
        return laplace_epsilon(rounds, epsilon_per_round)
    raise ValueError(f"unknown mechanism {mechanism!r} (laplace or gaussian)")


def sampling_rate(fed: FederationConfig, sel: Component) -> float:
    """q = clients_per_round / num_clients for the uniform selector over all clients; 1 otherwise (a
    selector that is not uniformly random, a fraction or non-participants: no amplification is claimed).
    ``fed``: the ``federation`` section; ``sel``: ``method.selector``."""
    np_cfg = fed.non_participants
    if sel.name != "uniform" or sel.settings().get("fraction") or np_cfg.fraction > 0 or np_cfg.fold is not None:
        return 1.0
    return min(1.0, (fed.clients_per_round or fed.num_clients) / fed.num_clients)


__all__ = ["epsilon_after", "gaussian_epsilon", "gaussian_sigma", "laplace_epsilon", "sampling_rate"]
