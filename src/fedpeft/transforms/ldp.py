"""Local differential privacy of the uploaded update (FedPrompt §IV-F, Table V; spec 003 §2.6, §7 row 19).

The client's delta Δ = w^k − w^t (all k float coordinates it uploads, flattened) is clipped to ‖Δ‖₂ ≤ C and
i.i.d. noise is added per coordinate before upload: w^k ← w^t + clip_C(Δ) + n. The paper clips gradients per
step: that is the trainer's ``grad_clip``; per-step clipping there plus this delta clip bound the sensitivity
(the released delta always lies in the L2 ball of radius C).

Sensitivity (local DP: a client's data may be replaced by anything): two clipped deltas differ by at most the
ball's diameter, Δ₂ = 2C in L2 and Δ₁ ≤ √k·Δ₂ = 2√k·C in L1 (Cauchy–Schwarz). Laplace: b = ``noise`` or
b = Δ₁/ε, each upload is (Δ₁/b)-LDP. Gaussian: std = ``noise``·C (the DP-FedAvg noise multiplier), or the
analytic (ε, δ) calibration for Δ₂ = 2C. Noise is drawn only from the generator ``apply`` receives.
Only the update tensors are privatised; auxiliary scalars such as the training loss are not.
Per round the server metrics carry: Laplace ``epsilon`` = t·Δ₁/b (pure, a client in all t rounds); Gaussian
``epsilon`` at ``delta`` for adding/removing one client (sensitivity C, sampling rate q, DP-FedAvg) and
``epsilon_local`` against the server that sees each upload (Δ₂ = 2C, q = 1).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy
from fedpeft.privacy import gaussian_epsilon, gaussian_sigma, laplace_epsilon
from fedpeft.transforms.base import TRANSFORMS, TransformBase

torch = lazy("torch")


class LdpSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mechanism: Literal["laplace", "gaussian"] = Field("laplace", description="the noise added to the clipped "
                                                                          "delta")
    clip: float = Field(1.0, gt=0, description="C: the client's delta is clipped to L2 norm <= C")
    noise: float | None = Field(None, gt=0, description="Laplace scale b, or Gaussian std / C (noise multiplier)")
    epsilon: float | None = Field(None, gt=0, description="per-upload epsilon the noise is calibrated to "
                                                           "(instead of noise)")
    delta: float = Field(1e-5, gt=0, lt=1, description="Gaussian: the delta of the (epsilon, delta) guarantee")

    @model_validator(mode="after")
    def _one_of(self) -> LdpSettings:
        if (self.noise is None) == (self.epsilon is None):
            raise ValueError("set exactly one of noise and epsilon")
        return self


def clip_delta(delta: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Δ · min(1, C / ‖Δ‖₂)."""
    norm = float(torch.linalg.vector_norm(delta))
    return delta if norm <= max_norm else delta * (max_norm / norm)


def laplace_noise(n: int, b: float, generator: torch.Generator) -> torch.Tensor:
    """n i.i.d. Laplace(0, b) draws (float64): b·(E₁ − E₂) with E ~ Exp(1)."""
    e = torch.empty(2, n, dtype=torch.float64).exponential_(generator=generator)
    return b * (e[0] - e[1])


def gaussian_noise(n: int, std: float, generator: torch.Generator) -> torch.Tensor:
    return std * torch.randn(n, dtype=torch.float64, generator=generator)


@TRANSFORMS.register("ldp", "local DP: clip the client's delta to L2 <= clip and add Laplace or Gaussian noise "
                     "(FedPrompt §IV-F)", LdpSettings)
class Ldp(TransformBase):
    def l1_sensitivity(self, k: int) -> float:
        return 2.0 * math.sqrt(k) * self.settings.clip

    def scale(self, k: int) -> float:
        """Laplace b, or the Gaussian std, for k coordinates."""
        s = self.settings
        if s.mechanism == "laplace":
            return s.noise if s.noise is not None else self.l1_sensitivity(k) / s.epsilon
        return s.noise * s.clip if s.noise is not None else gaussian_sigma(s.epsilon, s.delta) * 2.0 * s.clip

    def apply(self, update: Update, start: Params, round: int, generator: torch.Generator) -> Update:
        keys = sorted(k for k, v in update.tensors.items() if v.is_floating_point())
        missing = [k for k in keys if k not in start]
        if missing:
            raise ValueError(f"ldp: update tensors {missing} have no starting value to take a delta from")
        if not keys:
            return update
        base = torch.cat([start[k].detach().double().cpu().reshape(-1) for k in keys])
        delta = clip_delta(torch.cat([update.tensors[k].detach().double().cpu().reshape(-1) for k in keys]) - base,
                           self.settings.clip)
        n = delta.numel()
        draw = laplace_noise if self.settings.mechanism == "laplace" else gaussian_noise
        noisy = base + delta + draw(n, self.scale(n), generator)
        out, off = dict(update.tensors), 0
        for k in keys:
            v = update.tensors[k]
            out[k] = noisy[off: off + v.numel()].view(v.shape).to(v.device, torch.float32)
            off += v.numel()
        return update.with_tensors(out)

    def diagnostics(self, round: int, params: Params) -> dict[str, float]:
        """ε after ``round`` rounds for the worst-case client (one that took part in every round)."""
        s = self.settings
        k = sum(v.numel() for v in params.values() if v.is_floating_point())  # >= the uploaded coordinates
        if s.mechanism == "laplace":
            return {"epsilon": laplace_epsilon(round, self.l1_sensitivity(k) / self.scale(k))}
        std = self.scale(k)  # client level: add/remove one client, sensitivity C, sampled with rate q
        return {"epsilon": gaussian_epsilon(round, std / s.clip, self.ctx.sampling_rate, s.delta), "delta": s.delta,
                "epsilon_local": gaussian_epsilon(round, std / (2.0 * s.clip), 1.0, s.delta)}
