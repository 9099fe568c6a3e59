"""Server optimisers on the FedAvg pseudo-gradient: FedAdam, FedYogi, FedAdagrad (Reddi et al., ICLR 2021,
"Adaptive Federated Optimization", Alg. 2) and FedAvgM (Hsu et al. 2019, "Measuring the Effects of
Non-Identical Data Distribution for Federated Visual Classification", server momentum).

Numerics follow Flower 1.41's own strategies (``flwr.serverapp.strategy.{fedopt,fedadam,fedyogi,fedadagrad,
fedavgm}``), with math in float64 here, so they agree with Flower to float32 rounding. With
p_k = n_k / Σ_j n_j over the accepted updates and x_t the current global:

    Δ_t = Σ_k p_k x_k − x_t                              (pseudo-gradient, an *ascent* direction)
    m_t = β₁ m_{t−1} + (1 − β₁) Δ_t                      (m_{−1} = 0; Alg. 2 line "m_t")
    FedAdagrad: v_t = v_{t−1} + Δ_t²                     (v_{−1} = 0)
    FedYogi:    v_t = v_{t−1} − (1 − β₂) Δ_t² sign(v_{t−1} − Δ_t²)
    FedAdam:    v_t = β₂ v_{t−1} + (1 − β₂) Δ_t²
    x_{t+1} = x_t + η_t m_t / (√v_t + τ)

η_t = η except for FedAdam, where Flower bias-corrects the rate with the *1-based* server round t as
η_t = η √(1 − β₂^{t+1}) / (1 − β₁^{t+1}) (``bias_correction: flower``; ``standard`` uses the exponent t as in
Kingma & Ba, ``none`` is the paper's Alg. 2 literally). Flower, unlike the paper (v_{−1} ≥ τ²), starts v
at zero; so do we. FedAdagrad in Flower fixes β₁ = 0 (m_t = Δ_t); ``beta_1`` is exposed with that default.

FedAvgM (Flower's SGD-with-momentum convention, as ``torch.optim.SGD``): g_t = x_t − Σ_k p_k x_k,
u_t = μ u_{t−1} + g_t (u_0 = g_0), x_{t+1} = x_t − η_s u_t. With μ = 0 and η_s = 1 (Flower's defaults)
this is plain FedAvg.

State (float32): slots ``m`` and ``v`` per shared tensor (FedAvgM: ``momentum``, kept only when μ > 0);
absent slots read as zeros, which is exactly Flower's first-round initialisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.base import (
    AGGREGATORS,
    PARAMS,
    AggregatorBase,
    Params,
    slot,
    slot_tensors,
    to_float32,
)
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.lazy import lazy

torch = lazy("torch")

Rule = Literal["adam", "yogi", "adagrad"]
BiasCorrection = Literal["flower", "standard", "none"]


# ---------------------------------------------------------------- settings (defaults = Flower 1.41's)


class FedAdamSettings(BaseModel):
    """``method.aggregator`` keys of ``fedadam`` (defaults of ``flwr.serverapp.strategy.FedAdam``)."""

    model_config = ConfigDict(extra="forbid")
    eta: float = Field(1e-1, gt=0, description="server learning rate η (Flower: 0.1)")
    beta_1: float = Field(0.9, ge=0, lt=1, description="first-moment decay β₁ (Flower: 0.9)")
    beta_2: float = Field(0.99, ge=0, lt=1, description="second-moment decay β₂ (Flower: 0.99)")
    tau: float = Field(1e-3, gt=0, description="adaptivity τ added to √v (Flower: 1e-3)")
    bias_correction: BiasCorrection = Field(
        "flower", description="η_t = η√(1−β₂^(t+1))/(1−β₁^(t+1)) (flower), exponent t (standard), η (none)")


class FedYogiSettings(BaseModel):
    """``method.aggregator`` keys of ``fedyogi`` (defaults of ``flwr.serverapp.strategy.FedYogi``)."""

    model_config = ConfigDict(extra="forbid")
    eta: float = Field(1e-2, gt=0, description="server learning rate η (Flower: 0.01)")
    beta_1: float = Field(0.9, ge=0, lt=1, description="first-moment decay β₁ (Flower: 0.9)")
    beta_2: float = Field(0.99, ge=0, lt=1, description="second-moment decay β₂ (Flower: 0.99)")
    tau: float = Field(1e-3, gt=0, description="adaptivity τ added to √v (Flower: 1e-3)")


class FedAdagradSettings(BaseModel):
    """``method.aggregator`` keys of ``fedadagrad`` (defaults of ``flwr.serverapp.strategy.FedAdagrad``)."""

    model_config = ConfigDict(extra="forbid")
    eta: float = Field(1e-1, gt=0, description="server learning rate η (Flower: 0.1)")
    beta_1: float = Field(0.0, ge=0, lt=1, description="first-moment decay β₁ (Flower fixes 0: m_t = Δ_t)")
    tau: float = Field(1e-3, gt=0, description="adaptivity τ added to √v (Flower: 1e-3)")


class FedAvgMSettings(BaseModel):
    """``method.aggregator`` keys of ``fedavgm`` (defaults of ``flwr.serverapp.strategy.FedAvgM``)."""

    model_config = ConfigDict(extra="forbid")
    server_learning_rate: float = Field(1.0, gt=0, description="server SGD rate η_s (Flower: 1.0)")
    server_momentum: float = Field(0.0, ge=0, lt=1, description="server momentum μ (Flower: 0.0 = FedAvg)")


# ---------------------------------------------------------------- pure math (float64)


def in_client_order(updates: Sequence[Update]) -> list[Update]:
    """The updates sorted by client id, so that every sum below is independent of the arrival order."""
    return sorted(updates, key=lambda u: u.client)


def weighted_mean64(glob: Params, updates: Sequence[Update]) -> Params:
    """Σ_k p_k x_k with p_k = n_k / Σ_j n_j, over the names of ``glob``, in float64."""
    if not updates:
        raise ValueError("no updates to aggregate")
    weights = [float(u.weight) for u in updates]
    total = sum(weights)
    if total <= 0 or any(w < 0 for w in weights):
        raise ValueError(f"update weights must be non-negative with a positive sum, got {weights}")
    out = {k: torch.zeros(v.shape, dtype=torch.float64) for k, v in glob.items()}
    for u in in_client_order(updates):
        p = float(u.weight) / total
        for k in out:
            out[k] += p * u.tensors[k].double()
    return out


def pseudo_gradient(glob: Params, updates: Sequence[Update]) -> Params:
    """Δ_t = Σ_k p_k x_k − x_t (Reddi et al. Alg. 2; Flower's ``delta_t``), float64."""
    avg = weighted_mean64(glob, updates)
    return {k: avg[k] - glob[k].double() for k in glob}


def adaptive_lr(eta: float, beta_1: float, beta_2: float, round: int, bias_correction: BiasCorrection) -> float:
    """η_t of FedAdam: Flower's η√(1−β₂^(t+1))/(1−β₁^(t+1)) with the 1-based round t, or the variants."""
    if bias_correction == "none":
        return eta
    t = round + 1.0 if bias_correction == "flower" else float(round)
    return eta * (1.0 - beta_2 ** t) ** 0.5 / (1.0 - beta_1 ** t)


def fedopt_step(rule: Rule, x: Params, delta: Params, m: Params, v: Params, *, eta: float, beta_1: float,
                beta_2: float, tau: float) -> tuple[Params, Params, Params]:
    """One server step of Alg. 2 (float64): returns (x_{t+1}, m_t, v_t); ``eta`` is the already-corrected η_t."""
    x_new, m_new, v_new = {}, {}, {}
    for k in x:
        d = delta[k].double()
        d2 = d * d
        mk = beta_1 * m[k].double() + (1.0 - beta_1) * d
        vk = v[k].double()
        if rule == "adagrad":
            vk = vk + d2
        elif rule == "yogi":
            vk = vk - (1.0 - beta_2) * d2 * torch.sign(vk - d2)
        elif rule == "adam":
            vk = beta_2 * vk + (1.0 - beta_2) * d2
        else:
            raise ValueError(f"unknown FedOpt rule {rule!r}")
        x_new[k] = x[k].double() + eta * mk / (torch.sqrt(vk) + tau)
        m_new[k], v_new[k] = mk, vk
    return x_new, m_new, v_new


def fedavgm_step(x: Params, avg: Params, momentum: Params, *, lr: float, mu: float) -> tuple[Params, Params]:
    """Flower's FedAvgM (float64): g = x − avg; u = μ u_prev + g; x − η_s u. ``momentum`` = zeros at the first
    round, which gives Flower's u = g."""
    g = {k: x[k].double() - avg[k].double() for k in x}
    u = {k: mu * momentum[k].double() + g[k] for k in x} if mu > 0.0 else g
    return {k: x[k].double() - lr * u[k] for k in x}, u


# ---------------------------------------------------------------- the registered aggregators


class _AdaptiveFedOpt(AggregatorBase):
    """Shared body of FedAdam / FedYogi / FedAdagrad: state slots ``m`` and ``v`` (float32)."""

    accepts = frozenset({PARAMS})
    needs = frozenset()
    secure_sum = True  # a server step on the pseudo-gradient w - (the weighted mean)
    rule: ClassVar[Rule]

    def _hyper(self, round: int) -> dict[str, float]:
        s = self.settings
        return {"eta": s.eta, "beta_1": s.beta_1, "beta_2": getattr(s, "beta_2", 0.0), "tau": s.tau}

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        delta = pseudo_gradient(glob, updates)
        m, v = slot(state, "m", glob), slot(state, "v", glob)
        x, m, v = fedopt_step(self.rule, glob, delta, m, v, **self._hyper(round))
        tensors = dict(state.tensors) | slot_tensors("m", m) | slot_tensors("v", v)
        return to_float32(x), Message(tensors, dict(state.scalars))


@AGGREGATORS.register("fedadam", "FedAdam: Adam on the FedAvg pseudo-gradient (Reddi et al. 2021 Alg. 2; "
                      "Flower's bias-corrected η)", FedAdamSettings)
class FedAdam(_AdaptiveFedOpt):
    rule = "adam"

    def _hyper(self, round: int) -> dict[str, float]:
        s = self.settings
        eta = adaptive_lr(s.eta, s.beta_1, s.beta_2, round, s.bias_correction)
        return {"eta": eta, "beta_1": s.beta_1, "beta_2": s.beta_2, "tau": s.tau}


@AGGREGATORS.register("fedyogi", "FedYogi: Yogi on the FedAvg pseudo-gradient (Reddi et al. 2021 Alg. 2)",
                      FedYogiSettings)
class FedYogi(_AdaptiveFedOpt):
    rule = "yogi"


@AGGREGATORS.register("fedadagrad", "FedAdagrad: Adagrad on the FedAvg pseudo-gradient (Reddi et al. 2021 "
                      "Alg. 2)", FedAdagradSettings)
class FedAdagrad(_AdaptiveFedOpt):
    rule = "adagrad"


@AGGREGATORS.register("fedavgm", "FedAvgM: server SGD with momentum on the FedAvg pseudo-gradient (Hsu et al. "
                      "2019)", FedAvgMSettings)
class FedAvgM(AggregatorBase):
    accepts = frozenset({PARAMS})
    needs = frozenset()
    secure_sum = True  # a server step on the pseudo-gradient w - (the weighted mean)

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        s = self.settings
        avg = weighted_mean64(glob, updates)
        x, u = fedavgm_step(glob, avg, slot(state, "momentum", glob), lr=s.server_learning_rate,
                            mu=s.server_momentum)
        tensors = dict(state.tensors)
        if s.server_momentum > 0.0:    # Flower keeps no momentum vector when μ = 0
            tensors |= slot_tensors("momentum", u)
        return to_float32(x), Message(tensors, dict(state.scalars))
