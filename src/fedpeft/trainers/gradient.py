"""Local gradient training of the adapter tensors (Adam / AdamW / SGD), backbone frozen.

FedPrompt Alg. 1 ClientUpdate: P <- P - eta * grad l(P; b) over minibatches, with the experiments'
Adam and a step budget. The optimizer is fresh each round unless ``reset_optimizer`` is off, in
which case its state is returned so the caller can keep it in the client's persistent store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.base import Params
from fedpeft.backbones.classifier import Classifier
from fedpeft.backbones.encoding import Encoded
from fedpeft.registry import Registry


class GradientSettings(BaseModel):
    """Settings of the gradient trainers (``adam``, ``adamw``, ``sgd``: the name picks the optimizer)."""

    model_config = ConfigDict(extra="forbid")
    lr: float = Field(0.03, gt=0)
    batch_size: int = Field(16, ge=1)
    local_epochs: float = Field(1.0, gt=0, description="passes over the local data per round")
    max_steps: int | None = Field(None, ge=1, description="cap on optimizer steps per round")
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum")
    grad_clip: float | None = Field(1.0, gt=0)
    reset_optimizer: bool = Field(True, description="fresh optimizer state every round")


TRAINERS: Registry[str] = Registry("trainer")  # name -> optimizer family
TRAINERS.add("adam", "adam", "gradient training with Adam", GradientSettings)
TRAINERS.add("adamw", "adamw", "gradient training with AdamW (decoupled weight decay)", GradientSettings)
TRAINERS.add("sgd", "sgd", "gradient training with SGD (optional momentum)", GradientSettings)


@dataclass
class TrainResult:
    params: Params
    steps: int
    mean_loss: float
    optimizer_state: dict[str, torch.Tensor] | None


def num_steps(n: int, cfg: GradientSettings) -> int:
    """Optimizer steps this round: ceil(epochs * n / B), capped by max_steps."""
    steps = max(1, math.ceil(cfg.local_epochs * n / cfg.batch_size))
    return min(steps, cfg.max_steps) if cfg.max_steps else steps


def make_optimizer(name: str, cfg: GradientSettings, tensors: list[torch.Tensor]) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(tensors, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(tensors, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(tensors, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def _flat_state(opt: torch.optim.Optimizer, names: list[str]) -> dict[str, torch.Tensor]:
    """Optimizer state as plain named tensors (checkpointable, no pickle)."""
    out = {}
    for name, p in zip(names, opt.param_groups[0]["params"]):
        for k, v in opt.state.get(p, {}).items():
            out[f"{name}::{k}"] = v.detach().clone() if torch.is_tensor(v) else torch.tensor(v)
    return out


def _load_flat_state(opt: torch.optim.Optimizer, names: list[str], flat: dict[str, torch.Tensor]) -> None:
    for name, p in zip(names, opt.param_groups[0]["params"]):
        st = {k.split("::", 1)[1]: v.clone() for k, v in flat.items() if k.split("::", 1)[0] == name}
        if st:
            opt.state[p] = st


def train_local(
    clf: Classifier,
    params: Params,
    data: Encoded,
    optimizer: str,
    cfg: GradientSettings,
    generator: torch.Generator,
    optimizer_state: dict[str, torch.Tensor] | None = None,
) -> TrainResult:
    """Train copies of ``params`` on ``data``; the shuffling order comes from ``generator`` only."""
    names = sorted(params)
    work = {k: params[k].detach().clone().float().requires_grad_(True) for k in names}
    opt = make_optimizer(optimizer, cfg, [work[k] for k in names])
    if optimizer_state and not cfg.reset_optimizer:
        _load_flat_state(opt, names, optimizer_state)
    steps, n = num_steps(len(data), cfg), len(data)
    order = torch.empty(0, dtype=torch.long)
    total = 0.0
    for step in range(steps):
        if len(order) < cfg.batch_size:  # new pass over the data; the tail of the last pass is kept
            order = torch.cat([order, torch.randperm(n, generator=generator)])
        idx, order = order[: min(cfg.batch_size, n)], order[min(cfg.batch_size, n):]
        batch = clf.batch(data, idx.tolist())
        loss = F.cross_entropy(clf.logits(work, batch), batch["labels"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_([work[k] for k in names], cfg.grad_clip)
        opt.step()
        total += loss.item()
    state = None if cfg.reset_optimizer else _flat_state(opt, names)
    return TrainResult({k: v.detach() for k, v in work.items()}, steps, total / steps, state)
