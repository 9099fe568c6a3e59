"""Local gradient training of the adapter tensors (Adam / AdamW / SGD), backbone frozen; optional FedProx.

FedPrompt Alg. 1 ClientUpdate: P <- P - eta * grad l(P; b) over minibatches, with the experiments'
Adam and a step budget. FedProx (Li et al. 2020, Eq. 2) adds (mu/2)·||w - w^t||² to the local loss, w^t
being the tensors the client started from. The optimizer is fresh each round unless
``reset_optimizer`` is off, in which case its state is kept in the client's persistent store. With vectorised
clients (``runtime.client_batch``) each step's forward and backward are shared with the group's other clients
(``backbones.gather``); the optimizer step stays the client's own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.model.classifier import Classifier
from fedpeft.backbones.encoding import Encoded
from fedpeft.model.gather import ForwardGather
from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy
from fedpeft.rng import torch_rng
from fedpeft.trainers.base import PARAMS, TRAINERS, Penalty, TrainerBase

torch = lazy("torch")
F = lazy("torch.nn.functional")


class GradientSettings(BaseModel):
    """Settings of the gradient trainers (``adam``, ``adamw``, ``sgd``: the name picks the optimizer)."""

    model_config = ConfigDict(extra="forbid")
    lr: float = Field(0.03, gt=0, description="learning rate")
    head_lr: float | None = Field(None, gt=0, description="learning rate of the linear readout head's tensors "
                                                          "(head.weight, head.bias; None: lr, one rate for all)")
    batch_size: int = Field(16, ge=1, description="examples per local step")
    local_epochs: float = Field(1.0, gt=0, description="passes over the local data per round")
    max_steps: int | None = Field(None, ge=1, description="cap on optimizer steps per round")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty (adam, sgd) or decoupled decay (adamw)")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum")
    grad_clip: float | None = Field(1.0, gt=0, description="clip the gradient to this L2 norm (none: no clipping)")
    reset_optimizer: bool = Field(True, description="fresh optimizer state every round")
    prox_mu: float = Field(0.0, ge=0, description="FedProx proximal weight mu (0: plain local training)")
    schedule: Literal["constant", "linear"] = Field(
        "constant", description="learning rate over a round's steps: constant, or linear decay to 0 after the warm-up "
                                "(transformers' get_linear_schedule_with_warmup), restarted every round")
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="share of a round's steps over which the rate rises "
                                                            "linearly from 0 (int(steps · ratio) steps, as in HF)")


def lr_factor(step: int, steps: int, cfg: GradientSettings) -> float:
    """The rate's multiplier at optimizer step ``step`` (0-based) of ``steps``: HF's linear schedule with warm-up."""
    warmup = int(steps * cfg.warmup_ratio)
    if step < warmup:
        return step / max(1, warmup)
    if cfg.schedule == "constant":
        return 1.0
    return max(0.0, (steps - step) / max(1, steps - warmup))


@dataclass
class TrainResult:
    params: Params
    steps: int
    mean_loss: float
    optimizer_state: dict[str, torch.Tensor] | None


Optimizer = Callable[[list[dict], GradientSettings], "torch.optim.Optimizer"]
OPTIMIZERS: dict[str, Optimizer] = {
    "adam": lambda groups, s: torch.optim.Adam(groups, lr=s.lr, weight_decay=s.weight_decay),
    "adamw": lambda groups, s: torch.optim.AdamW(groups, lr=s.lr, weight_decay=s.weight_decay),
    "sgd": lambda groups, s: torch.optim.SGD(groups, lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay),
}
HEAD = "head."  # the linear readout's tensors (``model.readouts.linear``), trained at ``head_lr`` when it is set


def param_groups(names: list[str], cfg: GradientSettings) -> list[list[str]]:
    """The trained tensors' names by learning rate: one group (every tensor at ``lr``), or with ``head_lr`` the
    adapter's tensors then the readout head's (the optimizer's groups, in this order)."""
    if cfg.head_lr is None:
        return [names]
    groups = [[k for k in names if not k.startswith(HEAD)], [k for k in names if k.startswith(HEAD)]]
    return [g for g in groups if g]


def num_steps(n: int, cfg: GradientSettings) -> int:
    """Optimizer steps this round: ceil(epochs * n / B), capped by max_steps."""
    steps = max(1, math.ceil(cfg.local_epochs * n / cfg.batch_size))
    return min(steps, cfg.max_steps) if cfg.max_steps else steps


def _group_params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def _flat_state(opt: torch.optim.Optimizer, names: list[str]) -> dict[str, torch.Tensor]:
    """Optimizer state as plain named tensors on the CPU (checkpointable, no pickle); ``names`` in the optimizer's
    parameter order."""
    out = {}
    for name, p in zip(names, _group_params(opt)):
        for k, v in opt.state.get(p, {}).items():
            out[f"{name}::{k}"] = v.detach().cpu().clone() if torch.is_tensor(v) else torch.tensor(v)
    return out


def _load_flat_state(opt: torch.optim.Optimizer, names: list[str], flat: dict[str, torch.Tensor],
                     device: torch.device) -> None:
    for name, p in zip(names, _group_params(opt)):
        st = {k.split("::", 1)[1]: v.clone() for k, v in flat.items() if k.split("::", 1)[0] == name}
        if st:
            opt.state[p] = {k: (v.to(device) if k != "step" else v) for k, v in st.items()}


def train_local(clf: Classifier, params: Params, data: Encoded, optimizer: str, cfg: GradientSettings,
                generator: torch.Generator, optimizer_state: dict[str, torch.Tensor] | None = None,
                frozen: dict[str, torch.Tensor] | None = None, static: Params | None = None,
                together: ForwardGather | None = None, client: int = 0,
                penalty: Penalty | None = None, loss: Callable[[Any, dict], torch.Tensor] | None = None,
                batch_of: Callable[[Encoded, list[int]], dict] | None = None) -> TrainResult:
    """Train copies of ``params`` on ``data`` (on the classifier's device); shuffling comes from ``generator``.

    Entries where ``frozen`` is True get no gradient and are restored after every step (weight decay and
    optimizer state cannot move them: head pruning's frozen slices, spec A4). ``static``: backbone weights that
    replace the frozen ones in every forward of this client (physically pruned heads). ``together``: the group
    whose forward and backward each step shares (as client ``client``). ``penalty(tensors)`` is added to every
    step's loss (HetLoRA's tail-norm regulariser). ``loss(outputs, batch)`` and ``batch_of(data, rows)`` replace the
    objective's loss and batching (a preference trainer's loss, and the reference it adds to each batch)."""
    objective_loss = loss
    fixed = set(clf.adapter.fixed(params))  # part of the adapter, never trained (LoRA-SB's B and A)
    names = sorted(k for k in params if k not in fixed)
    work = {k: params[k].detach().to(clf.device, torch.float32).clone().requires_grad_(True) for k in names}
    work |= {k: params[k].detach().to(clf.device, torch.float32) for k in sorted(fixed)}
    anchor = {k: v.detach().clone() for k, v in work.items()} if cfg.prox_mu > 0 else None
    masks = {k: m.to(clf.device) for k, m in (frozen or {}).items() if bool(m.any())}
    keep = {k: work[k].detach().clone() for k in masks}
    groups = param_groups(names, cfg)
    rate = {True: cfg.lr if cfg.head_lr is None else cfg.head_lr, False: cfg.lr}  # keyed by "is the head"
    opt = OPTIMIZERS[optimizer]([{"params": [work[k] for k in g], "lr": rate[g[0].startswith(HEAD)]}
                                 for g in groups], cfg)
    ordered = [k for g in groups for k in g]  # the optimizer's parameter order
    if optimizer_state and not cfg.reset_optimizer:
        _load_flat_state(opt, ordered, optimizer_state, clf.device)
    steps, n = num_steps(len(data), cfg), len(data)
    scheduled = cfg.schedule != "constant" or cfg.warmup_ratio > 0
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, cfg)) if scheduled else None
    order = torch.empty(0, dtype=torch.long)
    total = 0.0
    for _ in range(steps):
        if len(order) < cfg.batch_size:  # new pass over the data; the tail of the last pass is kept
            order = torch.cat([order, torch.randperm(n, generator=generator)])
        idx, order = order[: min(cfg.batch_size, n)], order[min(cfg.batch_size, n):]
        batch = (batch_of or clf.batch)(data, idx.tolist())

        def loss_of(outputs, b: dict[str, torch.Tensor] = batch) -> torch.Tensor:
            loss = (objective_loss or clf.loss)(outputs, b)
            if anchor is not None:  # FedProx Eq. 2
                loss = loss + 0.5 * cfg.prox_mu * sum(((work[k] - anchor[k]) ** 2).sum() for k in names)
            if penalty is not None:
                loss = loss + penalty(work)
            return loss

        opt.zero_grad(set_to_none=True)
        if together is None:
            with clf.held(work, static) if clf.checkpointing else contextlib.nullcontext():
                loss = loss_of(clf.outputs(work, batch, static))  # checkpointing: the backward reruns the forward
                loss.backward()
            loss = loss.detach().double()  # summed on the device in float64 (as Python floats were): no wait per step
        else:
            loss = together.loss_and_backward(client, work, batch, loss_of, static)
        for k, m in masks.items():
            if work[k].grad is not None:
                work[k].grad.masked_fill_(m, 0.0)
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_([work[k] for k in names], cfg.grad_clip)
        opt.step()
        if sched is not None:
            sched.step()
        with torch.no_grad():
            for k, m in masks.items():
                work[k][m] = keep[k][m]
        total += loss
    state = None if cfg.reset_optimizer else _flat_state(opt, ordered)
    return TrainResult({k: v.detach().cpu() for k, v in work.items()}, steps, float(total) / steps, state)


class GradientTrainer(TrainerBase):
    """Local gradient training of every tensor the client starts from; the update is the trained tensors."""

    def settings_for(self, client: ClientContext) -> GradientSettings:
        """The settings with the client's tier's step cap (``federation.client_profiles[].max_steps``)."""
        steps = client.profile.max_steps if client.profile is not None else None
        return self.settings if steps is None else self.settings.model_copy(update={"max_steps": steps})

    kind = PARAMS
    scalars = ("train_loss", "steps")
    provides = frozenset(scalars)
    vectorised = True
    optimizer: ClassVar[str]

    def fit(self, params: Params, instruction: Message, client: ClientContext, round: int,
            state: Params, frozen: dict[str, torch.Tensor] | None = None,
            static: Params | None = None, penalty: Penalty | None = None) -> tuple[Update, Params]:
        gen = torch_rng(client.seed, round, client.client_id, "local-train")
        res = train_local(self.clf, params, client.train, self.optimizer, self.settings_for(client), gen,
                          state or None, frozen, static, client.forward, client.client_id, penalty)
        update = Update(client.client_id, res.params, client.num_examples,
                        scalars={"train_loss": res.mean_loss, "steps": res.steps})
        return update, (res.optimizer_state or {})


@TRAINERS.register("adam", "gradient training with Adam", GradientSettings)
class AdamTrainer(GradientTrainer):
    optimizer = "adam"


@TRAINERS.register("adamw", "gradient training with AdamW (decoupled weight decay)", GradientSettings)
class AdamWTrainer(GradientTrainer):
    optimizer = "adamw"


@TRAINERS.register("sgd", "gradient training with SGD (optional momentum)", GradientSettings)
class SGDTrainer(GradientTrainer):
    optimizer = "sgd"
