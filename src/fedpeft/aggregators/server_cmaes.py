"""FedBPT's server-level CMA-ES aggregation (spec §2.5 S7-S10, Appendix A Eqs. 6, 8, 16, 17).

The uploaded client means are a population "sampled" by the server: ranked by their uploaded
losses, the best half are the parents (equal weights, so the new mean is their plain average,
Eq. 8), and one CMA-ES update runs with the corrected step size sigma' (Eq. 16 by default, Eq. 14
with the weights actually applied otherwise). The local step size sent back is
sigma_t * sigma_srv / sigma'_t (ratio transfer, spec A15). C follows the trainer's covariance model
(full, diagonal or none), the same model the clients sample from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.base import AGGREGATORS, DISTRIBUTION, AggregatorBase, Params
from fedpeft.comm.codec import Message
from fedpeft.lazy import lazy
from fedpeft.trainers.cmaes import CMAState, Covariance, cma_constants, parent_weights, tell

torch = lazy("torch")

SigmaRule = Literal["eq16", "eq17", "code", "raw"]
Z = "z"  # the projected prompt's tensor: the global mean


class ServerCMAESSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sigma_rule: SigmaRule = Field("eq16", description="server step size: eq16 (Eq. 16 with integer mu, mu_l, "
                                                      "spec A14; Eq. 14 with the weights applied), eq17 (paper "
                                                      "literal), code (all clients), raw (uncorrected)")
    parents: Literal["half", "all"] = Field("half", description="best floor(|S|/2) clients (paper) or all (code)")
    weights: Literal["equal", "log"] = Field("equal", description="server recombination weights: equal (paper) or "
                                                                  "log (code: pycma CMA_mu = |S|, global_es.py)")
    sigma_transfer: Literal["ratio", "literal"] = Field("ratio", description="sigma sent to clients: "
                                                                             "sigma_t*sigma_srv/sigma' (code, A15) "
                                                                             "or sigma_srv (Alg. 1 literal)")
    sigma_min: float | None = Field(None, gt=0, description="optional floor on the client sigma (off by default)")


def effective_size(weights: np.ndarray) -> float:
    """mu_eff = (sum w)^2 / sum w^2, scale-free (= 1 / sum w^2 for weights summing to 1; exactly mu for mu equal)."""
    r = np.asarray(weights, dtype=np.float64)
    r = r / r.max()
    return float(r.sum() ** 2 / np.sum(r ** 2))


def sigma_prime(sigmas: Sequence[np.ndarray], losses: Sequence[float], popsize: int,
                rule: SigmaRule = "eq16", sigma_t: float | None = None, weights: np.ndarray | None = None,
                local_weights: np.ndarray | None = None) -> float:
    """Corrected server step size sigma'_t from the clients' I local step sizes.

    eq16: App. A Eq. 14 solved for sigma' with the recombination weights actually applied,
          sigma'^2 = mu_w sum_{k<=mu} w_k^2 S_k / mu_eff,l, S_k = sum_j (sigma_{t,j}^{k:S})^2 of the k-th best
          client, w the server's parent weights (``weights``, in rank order; default equal over the best
          floor(|S|/2)), mu_w = 1/sum w_k^2 and mu_eff,l = 1/sum alpha_i^2 of the local weights
          (``local_weights``; default equal over floor(lambda/2)). Equal weights give Eq. 16,
          sqrt(sum_{k in S'} S_k / (mu * mu_l)) with mu = floor(|S|/2), mu_l = floor(lambda/2) (spec A14);
          with unequal weights it is the w^2-weighted mean of S_k over mu_eff,l, so that
          sqrt(mu_w) C^{-1/2} (z_{t+1} - z_t) / sigma' ~ N(0, I) under neutral selection (Eq. 10).
    eq17: 2 sqrt(sum_{k in S'} sum_j sigma^2 / (|S| lambda)). The sum runs over the best half S' but the
          denominator has |S|: that is mu = |S|/2 rewritten (spec A30) -- do not "fix" it.
    code: sqrt(sum_{all k} sum_j sigma^2 / (|S| mu_l)) (authors' global_es.py, literal, whatever the weights).
    raw:  sigma_t itself (the uncorrected variant the paper argues diverges).
    """
    s = len(sigmas)
    if s == 0:
        raise ValueError("sigma_prime: no clients")
    order = np.argsort(np.asarray(losses), kind="stable")
    sq = np.array([float(np.sum(np.square(v))) for v in sigmas])
    mu, mu_l = max(1, s // 2), max(1, popsize // 2)
    if rule == "eq16":
        w = np.ones(mu) if weights is None else np.asarray(weights, dtype=np.float64)
        r2 = (w / w.max()) ** 2  # only the ratios of the weights matter
        mueff_l = mu_l if local_weights is None else effective_size(local_weights)
        return math.sqrt(float(np.sum(r2 * sq[order[: len(w)]])) / (float(r2.sum()) * mueff_l))
    if rule == "eq17":
        return 2 * math.sqrt(sq[order[:mu]].sum() / (s * popsize))
    if rule == "code":
        return math.sqrt(sq.sum() / (s * mu_l))
    if rule == "raw":
        if sigma_t is None:
            raise ValueError("sigma_prime: rule 'raw' needs sigma_t")
        return float(sigma_t)
    raise ValueError(f"method.aggregator.sigma_rule: unknown '{rule}' (allowed: eq16, eq17, code, raw)")


@dataclass
class ServerStep:
    """Result of one server CMA-ES step: the new state (sigma on the client scale) and diagnostics."""

    state: CMAState
    sigma_prime: float
    sigma_server: float
    parents: list[int]


def server_cmaes_step(state: CMAState, client_means: Sequence[np.ndarray], sigmas: Sequence[np.ndarray],
                      losses: Sequence[float], popsize: int, cfg: ServerCMAESSettings,
                      covariance: Covariance = "full", local_weights: str = "equal") -> ServerStep:
    """S7-S10: rank by loss, one ``tell`` with sigma'_t over the client means, then transfer sigma back.

    ``state.sigma`` is the client-scale sigma_t that was sent this round; the server's evolution paths
    and covariance persist in ``state`` across rounds. sigma' (eq16) uses the parents and weights of this
    ``tell`` and the clients' ``local_weights`` (their ``weights`` setting); ``covariance`` is the model of C
    that the clients also use.
    """
    s = len(client_means)
    mu = max(1, s // 2) if cfg.parents == "half" else s
    weights = parent_weights(s, mu, cfg.weights)
    sp = sigma_prime(sigmas, losses, popsize, cfg.sigma_rule, state.sigma, weights,
                     parent_weights(popsize, kind=local_weights))
    consts = cma_constants(state.mean.shape[0], weights)
    srv = CMAState(state.mean, sp, state.cov, state.ps, state.pc, state.g)
    x = np.stack([np.asarray(m, dtype=np.float64) for m in client_means])
    after = tell(srv, consts, x, np.asarray(losses, dtype=np.float64), covariance)
    sigma_srv = after.sigma
    sigma_next = state.sigma * sigma_srv / sp if cfg.sigma_transfer == "ratio" else sigma_srv
    if cfg.sigma_min is not None:
        sigma_next = max(sigma_next, cfg.sigma_min)
    parents = [int(i) for i in np.argsort(np.asarray(losses), kind="stable")[:mu]]
    after.sigma = float(sigma_next)
    return ServerStep(after, sp, float(sigma_srv), parents)


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.double().cpu().numpy()


@AGGREGATORS.register("server_cmaes", "FedBPT server-level CMA-ES over client means ranked by loss, corrected "
                      "step size sigma'", ServerCMAESSettings)
class ServerCMAES(AggregatorBase):
    """S7-S10 as a stateful aggregator: the global is the mean z_t; the state keeps sigma_t (client scale), C,
    the evolution paths and the generation; clients receive (sigma_t, C_t) through ``broadcast``."""

    accepts = frozenset({DISTRIBUTION})
    needs = frozenset({"sigmas", "loss"})

    def init(self, glob: Params) -> Message:
        """S2: sigma_0, C_0 = I, zero paths."""
        d = glob[Z].shape[0]
        tensors = {"cov": torch.eye(d, dtype=torch.float64), "ps": torch.zeros(d, dtype=torch.float64),
                   "pc": torch.zeros(d, dtype=torch.float64)}
        return Message(tensors, {"sigma": float(self.ctx.adapter.sigma0), "g": 0})

    def broadcast(self, state: Message) -> Message:
        return Message({"cov": state.tensors["cov"]}, {"sigma": state.scalars["sigma"]})

    def aggregate(self, glob: Params, updates, state: Message, round: int):
        t = state.tensors
        st = CMAState(_f64(glob[Z]), float(state.scalars["sigma"]), _f64(t["cov"]), _f64(t["ps"]), _f64(t["pc"]),
                      int(state.scalars["g"]))
        step = server_cmaes_step(st, [_f64(u.tensors[Z]) for u in updates],
                                 [_f64(u.aux_tensors["sigmas"]) for u in updates],
                                 [float(u.aux_tensors["loss"][0]) for u in updates], self.ctx.trainer.popsize,
                                 self.settings, self.ctx.trainer.covariance, self.ctx.trainer.weights)
        new = step.state
        tensors = {"cov": torch.from_numpy(new.cov), "ps": torch.from_numpy(new.ps), "pc": torch.from_numpy(new.pc)}
        scalars = {"sigma": float(new.sigma), "g": int(new.g), "sigma_prime": step.sigma_prime,
                   "sigma_server": step.sigma_server}
        return {Z: torch.from_numpy(new.mean)}, Message(tensors, scalars)
