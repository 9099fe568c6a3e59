"""Server momentum with per-client control variates (FedPepTAO Alg. 2 lines 12–25; spec §2.9 executable form).

Round r on the shared tensors only, with p_i = n_i / Σ_{j∈S} n_j:

1. Δw_i = w_i − w^{r−1} for the uploaded w_i (nothing but w_i, n_i, T_i is sent).
2. w̄ = Σ p_i w_i and the pseudo-gradient P^r = w^{r−1} − w̄.
3. c_i ← c_i − c_g − Δw_i / (T_i α) for i ∈ S (T_i local steps, α the client lr); c_i unchanged for i ∉ S.
4. c_g ← c_g + (|S|/M) Σ_{i∈S} p_i (c_i^new − c_i^old).
5. Round 1 (no P^{r−1}): w = w̄, m = 0. Otherwise g = P^{r−1} − P^r (code sign, A9),
   m_i = β m + (1−β) g + c_g − c_i, m = Σ p_i m_i and w = w̄ − η^r m (step on the FedAvg result, A10;
   every m_i from the same m^{r−1}, no chaining, A11).
6. (selection) the aggregator's ``restrict`` slices m, c_g, every c_i and P to the selected layers.

η^r = max(η·γ^(r−1), floor) reproduces the official schedule: ``--server_lr 0.05`` in ``example_roberta.sh``
(also ``example_gpt2.sh``, ``example_llama.sh``) and, in every round with a server step (r ≥ 2),
``args.server_lr = max(args.server_lr * 0.99, 0.0001)`` before the step
(``encoder-only-roberta-large/run_fed_pers_with_optim_v2.py`` line 322; GPT-2 line 330, LLaMA line 314), i.e.
η·0.99^(r−1) in round r: ``server_lr: 0.05, lr_decay: 0.99`` (``lr_floor: 1e-4``). The paper (§4.6, App. B.2,
Fig. 2) sweeps η ∈ {1e-2, 5e-3, 1e-3, 5e-4}, best 1e-3 (the default here), and mentions no decay.

Server diagnostics (the state's scalars, logged per round): ``server_lr`` = the η^r of this round's step (0 in
a round without one, A16) and ``server_step_ratio`` = ‖η^r m^r‖ / ‖w̄^r − w^{r−1}‖, the size of the momentum
step relative to the FedAvg move (‖P^r‖); with ``base: average`` and no chaining, w^r − w̄^r = −η^r m^r exactly.

Switches give the paper-literal variants (``sign: paper``, ``base: previous``), the code-literal
chaining, Δc weighted by T_i (code) and the optimiser ablations: ``control_variates: false`` (MomS+AdamD),
``momentum_input: pseudo_grad`` with ``base: previous`` (MomS = FedAvgM; + control variates = MomS+Con).
The control variates live on the server only and never enter the local update.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.base import AGGREGATORS, SEP, AggregatorBase, slot, slot_tensors
from fedpeft.comm.codec import Message
from fedpeft.lazy import lazy

torch = lazy("torch")

Params = dict[str, "torch.Tensor"]


class MomentumCVSettings(BaseModel):
    """``method.aggregator`` keys of ``momentum_cv``."""

    model_config = ConfigDict(extra="forbid")
    server_lr: float = Field(1e-3, ge=0, description="η (paper best 1e-3; code example scripts 0.05)")
    lr_decay: float = Field(1.0, gt=0, le=1, description="η^r = max(η·γ^(r−1), lr_floor); code γ = 0.99")
    lr_floor: float = Field(1e-4, ge=0, description="lowest η^r of the decay (code 1e-4)")
    momentum: float = Field(0.9, ge=0, lt=1, description="β")
    control_variates: bool = Field(True, description="the c_g − c_i term (false: MomS+AdamD / MomS)")
    momentum_input: Literal["pseudo_grad_diff", "pseudo_grad"] = Field(
        "pseudo_grad_diff", description="Alg. 2 line 19 g = P^{r−1} − P^r, or P^r itself (FedAvgM, for MomS)")
    base: Literal["average", "previous"] = Field(
        "average", description="server step from w̄^r (code, A10) or from w^{r−1} (paper line 22)")
    sign: Literal["code", "paper"] = Field("code", description="g = P^{r−1} − P^r (code) or its negative (paper)")
    chaining: bool = Field(False, description="code-exact: per-client steps chained within a round (A11)")
    cv_weights: Literal["num_examples", "steps"] = Field("num_examples", description="weights of Δc (A15)")


@dataclass
class MomentumState:
    """Server state of Alg. 2 over named tensors: w, m, c_g, c_i per client id, previous pseudo-gradient."""

    w: Params
    m: Params
    cg: Params
    c: dict[int, Params] = field(default_factory=dict)
    prev: Params | None = None
    eta: float = 0.0  # η^r of the step that produced this state (0: no server step)


def _zeros(like: Params) -> Params:
    return {k: torch.zeros_like(v, dtype=torch.float64) for k, v in like.items()}


def _f64(p: Params) -> Params:
    return {k: v.double() for k, v in p.items()}


def _f32(p: Params) -> Params:
    return {k: v.float() for k, v in p.items()}


def _wsum(items: Sequence[Params], weights: Sequence[float]) -> Params:
    out = _zeros(items[0])
    for it, a in zip(items, weights):
        for k in out:
            out[k] += a * it[k].double()
    return out


def init_state(w: Params) -> MomentumState:
    """Alg. 2 line 1: w^0 = w, m = 0, c_g = 0, every c_i = 0 (absent c_i read as 0)."""
    return MomentumState(_f32(w), _f32(_zeros(w)), _f32(_zeros(w)))


def server_lr(s: MomentumCVSettings, round: int) -> float:
    """η^r = max(η·γ^(r−1), floor) (code schedule; constant η with γ = 1)."""
    if s.lr_decay == 1.0:
        return s.server_lr
    return max(s.server_lr * s.lr_decay ** (round - 1), s.lr_floor)


def momentum_cv_step(state: MomentumState, uploads: dict[int, Params], num_examples: dict[int, int],
                     steps: dict[int, int], client_lr: float, num_clients: int, round: int,
                     s: MomentumCVSettings) -> MomentumState:
    """One server round of spec §2.9 steps 1–5 (see the module docstring); float64 math, float32 state."""
    order = sorted(uploads)
    if not order:
        raise ValueError("momentum_cv: no uploads to aggregate")
    n = torch.tensor([float(num_examples[i]) for i in order], dtype=torch.float64)
    p = (n / n.sum()).tolist()
    w, m, cg = _f64(state.w), _f64(state.m), _f64(state.cg)
    ups = [_f64({k: uploads[i][k] for k in w}) for i in order]
    wbar = _wsum(ups, p)                                                    # step 2
    pseudo = {k: w[k] - wbar[k] for k in w}
    c = dict(state.c)
    new_c: dict[int, Params] = {}
    cg_new = cg
    if s.control_variates:                                                  # steps 3–4
        old = [_f64(c[i]) if i in c else _zeros(w) for i in order]
        for i, up, ci in zip(order, ups, old):
            scale = 1.0 / (float(steps[i]) * client_lr)
            new_c[i] = {k: ci[k] - cg[k] - scale * (up[k] - w[k]) for k in w}
        if s.cv_weights == "steps":
            t = torch.tensor([float(steps[i]) for i in order], dtype=torch.float64)
            q = (t / t.sum()).tolist()
        else:
            q = p
        dc = _wsum([{k: new_c[i][k] - o[k] for k in w} for i, o in zip(order, old)], q)
        frac = len(order) / num_clients
        cg_new = {k: cg[k] + frac * dc[k] for k in w}
        c.update({i: _f32(v) for i, v in new_c.items()})
    if s.momentum_input == "pseudo_grad":
        g = pseudo
    elif state.prev is None:                                                # A16: no g at round 1
        return MomentumState(_f32(wbar), _f32(_zeros(w)), _f32(cg_new), c, _f32(pseudo))
    else:
        prev = _f64(state.prev)
        sign = 1.0 if s.sign == "code" else -1.0
        g = {k: sign * (prev[k] - pseudo[k]) for k in w}
    eta, beta = server_lr(s, round), s.momentum
    base = wbar if s.base == "average" else w

    def m_i(m_from: Params, i: int) -> Params:
        corr = ({k: cg_new[k] - new_c[i][k] for k in w} if s.control_variates else _zeros(w))
        return {k: beta * m_from[k] + (1 - beta) * g[k] + corr[k] for k in w}

    if s.chaining:                                                          # code quirk (A11)
        ms, ws, m_cur, w_cur = [], [], m, base
        for i in order:
            m_cur = m_i(m_cur, i)
            w_cur = {k: w_cur[k] - eta * m_cur[k] for k in w}
            ms.append(m_cur)
            ws.append(w_cur)
        m_new, w_new = _wsum(ms, p), _wsum(ws, p)
    else:                                                                   # step 5
        m_new = _wsum([m_i(m, i) for i in order], p)
        w_new = {k: base[k] - eta * m_new[k] for k in w}
    return MomentumState(_f32(w_new), _f32(m_new), _f32(cg_new), c, _f32(pseudo), eta)


def _norm(p: Params) -> float:
    return math.sqrt(sum(float((v.double() ** 2).sum()) for v in p.values()))


def step_diagnostics(state: MomentumState) -> dict[str, float]:
    """``server_lr`` η^r and ``server_step_ratio`` ‖η^r m^r‖ / ‖P^r‖ (P^r = w^{r−1} − w̄^r, the FedAvg move)
    of the state one round produced; the ratio is left out when the clients returned w^{r−1} unchanged."""
    move = _norm(state.prev) if state.prev is not None else 0.0
    out = {"server_lr": state.eta}
    if move > 0.0:
        out["server_step_ratio"] = state.eta * _norm(state.m) / move
    return out


# ---------------------------------------------------------------- the registered aggregator


@AGGREGATORS.register("momentum_cv", "server momentum + per-client control variates (FedPepTAO Alg. 2; MomS, "
                      "MomS+Con, MomS+AdamD)", MomentumCVSettings)
class MomentumCV(AggregatorBase):
    """Alg. 2 as a stateful aggregator: the state holds m, c_g, every c_i and the previous pseudo-gradient
    (slots ``m``, ``cg``, ``c/<client>``, ``P``); w is the global itself. Reads each update's local steps T_i."""

    needs = frozenset({"steps"})

    @classmethod
    def secure_sum_with(cls, settings: MomentumCVSettings) -> bool:
        """Without control variates (MomS+AdamD, MomS) a round needs only w̄ = Σ p_i w_i: it runs under secure
        aggregation. The server-held c_i need each Δw_i (step 3), and the code's chaining each client in turn;
        the secure variant keeps c_i on the clients and sums them securely (SCAFFOLD-style), not built here."""
        return not settings.control_variates and not settings.chaining

    def aggregate(self, glob: Params, updates, state: Message, round: int):
        cids = sorted({int(k.split(SEP)[0][2:]) for k in state.tensors if k.startswith("c/")})
        prev = slot(state, "P", glob) if any(k.startswith("P" + SEP) for k in state.tensors) else None
        ms = MomentumState(_f32(glob), _f32(slot(state, "m", glob)), _f32(slot(state, "cg", glob)),
                           {i: _f32(slot(state, f"c/{i}", glob)) for i in cids}, None if prev is None else _f32(prev))
        uploads = {u.client: u.tensors for u in updates}
        n = {u.client: u.weight for u in updates}
        steps = {u.client: int(u.scalars["steps"]) for u in updates} if self.settings.control_variates else {}
        lr = getattr(self.ctx.trainer, "lr", None)
        if lr is None:
            raise ValueError("method.aggregator.name: momentum_cv needs a gradient trainer (its lr scales the "
                             "control variates)")
        new = momentum_cv_step(ms, uploads, n, steps, lr, self.ctx.num_clients, round, self.settings)
        tensors = slot_tensors("m", new.m) | slot_tensors("cg", new.cg)
        for i, ci in new.c.items():
            tensors |= slot_tensors(f"c/{i}", ci)
        if new.prev is not None:
            tensors |= slot_tensors("P", new.prev)
        return new.w, Message(tensors, step_diagnostics(new))
