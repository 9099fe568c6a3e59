"""One federated round through a transformers ``Trainer``: its own ``train()`` for the round's steps, with the
learning-rate schedule, the optimizer state and the batches decided by fedpeft, so that rounds run on as one
training does.

The naive round, ``trainer.train()`` with ``max_steps`` the round's steps, restarts three things every round: the
scheduler (``Trainer`` makes one of the round's length at every ``train()``, so warm-up and decay repeat each round:
NVFlare's ``examples/advanced/llm_hf`` README, "Adaptation Step 1.5", plots the misaligned rate and aligns it with
``resume_from_checkpoint`` and a callback); when the trainer is made anew (a Flower ClientApp process per message),
the optimizer's moments; and the data order (accelerate's seedable sampler draws epoch 0's permutation again, so a
round shorter than an epoch sees the same first batches every round). Resuming from the trainer's own checkpoints
would reload its adapter over the global one and keep the state in the trainer's output folder, outside fedpeft's
checkpoints and client states; instead:

- **schedule**: made once per round by the trainer's own ``create_scheduler`` (``TrainingArguments.lr_scheduler_type``,
  warm-up, ``lr_scheduler_kwargs``) over the run's horizon (``schedule_steps``, rounds × local steps) and stepped to
  (round − 1) × local steps before ``train()`` uses it. It is a function of the round number, not of what the process
  remembers, so a fresh process, a resumed run and a client that skipped rounds all get the uninterrupted
  schedule's rate: after round r the scheduler stands at step r × local steps. ``Trainer`` keeps a scheduler it did
  not make itself (its ``_created_lr_scheduler`` flag, cleared here); a ``Trainer`` that replaced it anyway makes
  ``run_round`` raise rather than train on a restarted schedule.
- **optimizer state**: the trainer's own optimizer (``create_optimizer``: ``TrainingArguments.optim`` and its
  parameter groups), its per-parameter state (Adam's moments and step count) loaded before and read after the round
  as named tensors, which fedpeft keeps in the client's state: checkpointed with the run, stored by the Flower node,
  the same in every runtime. Empty: a fresh state (the first round, or ``reset_optimizer``).
- **batches**: the round's sampler yields steps × batch indices of fedpeft's own stream (successive permutations
  from the (seed, round, client) generator, ``gradient.train_local``'s order), so a round draws the batches fedpeft's
  gradient trainers would, and another shuffle every round.

Dropout and any other randomness in ``train()`` draw from torch's generator seeded for the (seed, round, client),
inside ``torch.random.fork_rng`` (the process's generator is left as it was).
"""

from __future__ import annotations

import warnings
from typing import Any

from fedpeft.lazy import lazy

torch = lazy("torch")

NO_SCHEDULE_STEP = ("reduce_lr_on_plateau", "greedy")  # schedulers stepped on evaluation metrics, not on steps


def round_order(n: int, count: int, generator: torch.Generator) -> list[int]:
    """``count`` example indices: successive permutations of ``range(n)`` drawn from ``generator``, concatenated."""
    parts, have = [], 0
    while have < count:
        parts.append(torch.randperm(n, generator=generator))
        have += n
    return torch.cat(parts)[:count].tolist()


class RoundSampler:
    """A fixed order of indices for the round's ``DataLoader`` (not a ``RandomSampler``: accelerate leaves it)."""

    def __init__(self, order: list[int]) -> None:
        self.order = order

    def __iter__(self):
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


def step_batch(trainer: Any) -> int:
    """Examples per optimizer step: the trainer's batch (fixed when it was made, from ``per_device_train_batch_size``)
    times the gradient accumulation."""
    batch = getattr(trainer, "_train_batch_size", None) or trainer.args.train_batch_size
    return int(batch) * int(trainer.args.gradient_accumulation_steps)


def _raw(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's wrapper (``train()`` wraps it; the wrapper forwards its state)."""
    from accelerate.optimizer import AcceleratedOptimizer

    return optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer


def _names(model: Any, optimizer: Any) -> list[str]:
    """The optimizer's parameters by their names in ``model``, in the optimizer's order."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for group in optimizer.param_groups for p in group["params"]]


def optimizer_state(optimizer: Any, names: list[str]) -> dict[str, torch.Tensor]:
    """The per-parameter state as named tensors on the CPU (``<parameter>::<key>``), as ``gradient.train_local``
    keeps its own."""
    flat = optimizer.state_dict()["state"]
    out = {}
    for i, name in enumerate(names):
        for k, v in flat.get(i, {}).items():
            out[f"{name}::{k}"] = v.detach().cpu().clone() if torch.is_tensor(v) else torch.tensor(v)
    return out


def load_optimizer_state(optimizer: Any, names: list[str], state: dict[str, torch.Tensor]) -> None:
    """Put ``state`` (``optimizer_state``'s tensors; empty: a fresh state) into ``optimizer`` through its own
    ``load_state_dict``, which places each value as the optimizer wants it (a fused Adam's step on the device)."""
    index = {n: i for i, n in enumerate(names)}
    per: dict[int, dict[str, Any]] = {}
    for key, value in state.items():
        name, k = key.split("::", 1)
        if name not in index:
            raise ValueError(f"the client's optimizer state names '{name}', which this trainer's optimizer does not "
                             "train (its parameters changed between rounds)")
        per.setdefault(index[name], {})[k] = value.clone()
    sd = optimizer.state_dict()
    optimizer.load_state_dict({"state": per, "param_groups": sd["param_groups"]})


def scheduler_at(trainer: Any, optimizer: Any, total: int, start: int) -> Any:
    """The trainer's scheduler over ``total`` steps (its ``create_scheduler``), stepped to step ``start``."""
    trainer.lr_scheduler = None
    scheduler = trainer.create_scheduler(num_training_steps=total, optimizer=optimizer)
    trainer._created_lr_scheduler = False  # made by us: train() keeps it (it would make one of the round's length)
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": nothing to step yet
        warnings.simplefilter("ignore")
        for _ in range(start):
            scheduler.step()
    return scheduler


def run_round(trainer: Any, steps: int, order: list[int], schedule: tuple[int, int], state: dict[str, torch.Tensor],
              seed: int) -> tuple[float, int, dict[str, torch.Tensor]]:
    """``steps`` optimizer steps of ``trainer.train()`` on the examples ``order`` names, the schedule (total steps,
    start step) and the optimizer ``state`` as the module doc says; returns the round's mean training loss, the
    steps taken and the optimizer state after them. ``trainer.args.max_steps`` and its sampler are the user's again
    afterwards."""
    optimizer = _raw(trainer.create_optimizer())
    names = _names(trainer.model, optimizer)
    load_optimizer_state(optimizer, names, state)
    scheduler = scheduler_at(trainer, optimizer, *schedule)
    args, own = trainer.args, trainer.__dict__.get("_get_train_sampler")
    saved = args.max_steps
    args.max_steps = steps
    trainer._get_train_sampler = lambda *a, **k: RoundSampler(order)
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            out = trainer.train()
    finally:
        args.max_steps = saved
        if own is None:
            del trainer._get_train_sampler
        else:
            trainer._get_train_sampler = own
    if trainer.lr_scheduler is not scheduler:
        raise RuntimeError("the transformers Trainer replaced fedpeft's learning-rate scheduler in train(): the "
                           "schedule would restart every round; this transformers version is not supported")
    trainer.lr_scheduler = None  # the next round makes its own; the trainer holds no scheduler of the user's
    return float(out.training_loss), int(trainer.state.global_step), optimizer_state(optimizer, names)
