"""Figure 10: an SFT client's local steps against TRL's ``SFTTrainer`` on the same batches, at equal work and
with fedpeft's own saving (issue 69's timing fairness).

SmolLM2-135M-Instruct with ``fedit``'s LoRA (r 16, alpha 32, every linear projection of the attention and MLP
blocks, no dropout), AdamW at 3e-4 with clipping at 1.0, one client's steps of 4 WebNLG rows of at most 256 tokens
(fedpeft's encoding: the chat template, the loss on the response tokens only). Three arms, rotated in one run
(A B C, B C A, C A B, ...), each from the same start on the same batches in the same order:

- **fedpeft**: the whole client (``handle_train``: decode the instruction, the trainer, encode the reply); the
  transformer body runs alone and the LM head is applied to the positions that predict a response token only.
- **fedpeft, equal work**: the same client with the model run whole, the LM head at every position (as TRL runs
  it), and the response positions read from those logits afterwards: TRL's LM-head work (TRL also takes the loss's
  log-softmax, and its logged entropy, at every position; fedpeft's loss stays on the response positions).
- **TRL**: ``SFTTrainer`` (TRL 1.16; ``completion_only_loss``, float32, no activation checkpointing, as
  ``benchmarks/flowertune.py`` ports the FlowerTune template) trained on the client's rows in fedpeft's step order
  (a sequential sampler); only its steps are timed (``on_step_begin`` to ``on_step_end`` of its own loop: the
  trainer's construction, and the collation of each batch, which its loop does before ``on_step_begin``, are left
  out, where fedpeft's arms count their whole client). TRL's step also computes its logged metrics (the entropy
  and token accuracy at every position), part of what a TRL user's step costs.

Rows (seconds of the first arm over the second, so > 1 is fedpeft's speed-up): TRL / fedpeft at equal work (the
like-for-like ratio), fedpeft at equal work / fedpeft (what applying the head to response positions only saves),
TRL / fedpeft (what a user gets). The trained tensors of the three must
agree (their difference relative to the update's norm and the largest difference reported: Adam's first steps
move an element by about the learning rate whatever its gradient's size, so float noise in a near-zero gradient
shows as a difference of up to twice the learning rate in that element).
"""

from __future__ import annotations

import tempfile
import time
from unittest import mock

import torch

from fedpeft.backbones.loading import Backbone
from fedpeft.comm.codec import decode
from fedpeft.methods.state import ServerState
from fedpeft.runtime.client import handle_train
from fedpeft.runtime.server import RoundDriver

from benchmarks.flowertune import completion_mask, get_model
from benchmarks.perf.common import Figure, figure, max_diff, rotate, step_rows

BATCH = 4


def sft_work(steps: int):
    from fedpeft.build import build
    from fedpeft.resolve import load_config

    cfg = load_config(None, ["method.name=fedit", "task.name=webnlg", "task.max_train=10", "task.max_test=1",
                             "task.max_length=256", "model.name=smollm2", "federation.num_clients=2",
                             "federation.clients_per_round=1", "federation.partition.scheme=iid",
                             f"method.trainer.batch_size={BATCH}", f"method.trainer.max_steps={steps}",
                             "method.trainer.local_epochs=100", "runtime.threads=1", "runtime.progress=false"])
    return build(cfg)


class StepClock:
    """A ``TrainerCallback``'s two hooks: the seconds of the trainer's own steps (forward, backward, clipping,
    optimizer), summed."""

    def __init__(self) -> None:
        self.seconds, self._t0 = 0.0, 0.0

    def callback(self):
        from transformers import TrainerCallback

        clock = self

        class _Clock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                clock._t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                clock.seconds += time.perf_counter() - clock._t0

        return _Clock()


class TRLArm:
    """TRL's ``SFTTrainer`` on a PEFT model of the same weights, reset to the start tensors before every run."""

    def __init__(self, b, start: dict[str, torch.Tensor], rows: list[dict], lr: float, clip: float) -> None:
        from datasets import Dataset

        self.model = get_model(b.exp.backbone.source, 16, 32.0)  # the template's: PEFT's all-linear = fedit's
        self.names = {k: "base_model.model." + k.replace(".weight", ".default.weight") for k in start}
        self.start, self.rows, self.lr, self.clip = start, Dataset.from_list(rows), lr, clip

    def run(self) -> tuple[float, dict[str, torch.Tensor]]:
        from torch.utils.data import SequentialSampler
        from trl import SFTConfig, SFTTrainer

        class InOrder(SFTTrainer):  # fedpeft's step order, not a shuffle
            def _get_train_sampler(self, *args, **kwargs):
                return SequentialSampler(self.train_dataset)

        with torch.no_grad():
            for k, name in self.names.items():
                self.model.get_parameter(name).copy_(self.start[k])
        clock = StepClock()
        with tempfile.TemporaryDirectory() as out:
            targs = SFTConfig(output_dir=out, learning_rate=self.lr, per_device_train_batch_size=BATCH,
                              max_steps=len(self.rows) // BATCH, lr_scheduler_type="constant", max_grad_norm=self.clip,
                              weight_decay=0.0, logging_steps=1, save_strategy="no", report_to=[], max_length=256,
                              completion_only_loss=True, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                              bf16=False, gradient_checkpointing=False)
            InOrder(model=self.model, args=targs, train_dataset=self.rows, callbacks=[clock.callback()]).train()
        return clock.seconds, {k: self.model.get_parameter(n).detach().clone() for k, n in self.names.items()}


def agreement(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> str:
    """How far two runs' trained tensors are apart: the norm of their difference relative to the update's norm, and
    the largest difference (Adam's first steps move an element by about ``lr`` whatever its gradient's size, so
    float noise in a near-zero gradient can move that element by up to twice ``lr``)."""
    diff = sum(float((x[k] - y[k]).double().pow(2).sum()) for k in x) ** 0.5
    update = sum(float((x[k] - start[k]).double().pow(2).sum()) for k in x) ** 0.5
    return f"trained tensors: difference {diff / update:.1e} of the update's norm, max abs {max_diff(x, y):.1e}"


def figure_10(args) -> list[Figure]:
    steps = 3
    b = sft_work(steps)
    s = b.method.trainer.settings
    if s.weight_decay:
        raise ValueError("figure 10 compares against TRL at weight decay 0; fedit's trainer has "
                         f"{s.weight_decay}")
    state = b.method.server_init()
    plan = RoundDriver(b.plan.federation, b.method).plan_round(state, 1)
    cid = min(plan.instructions)
    payload = plan.instructions[cid]
    enc = b.exp.client(cid).train
    rows = [{"input_ids": list(enc.input_ids[i]), "completion_mask": completion_mask(enc, i)}
            for step in step_rows(b, cid, 1) for i in step]
    start = ServerState.from_message(state).glob
    trl_arm = TRLArm(b, start, rows, s.lr, s.grad_clip)

    def fedpeft_client() -> tuple[float, dict[str, torch.Tensor]]:
        t0 = time.perf_counter()
        reply = handle_train(b.method, payload, b.exp.client(cid))
        return time.perf_counter() - t0, decode(reply).tensors

    def equal_work() -> tuple[float, dict[str, torch.Tensor]]:
        with mock.patch.object(Backbone, "body_and_head", new=property(lambda self: None)):
            assert b.exp.objective.backbone.body_and_head is None  # the model runs whole: every position's logits
            return fedpeft_client()

    (ta, a), (te, e), (tt, t) = rotate([fedpeft_client, equal_work, trl_arm.run], args.reps)
    what = (f"SFT: one fedit client's {len(rows) // BATCH} steps of {BATCH} WebNLG rows (SmolLM2, LoRA on every "
            "linear layer), ")
    speedup = lambda r: r > 1.0  # noqa: E731
    return [figure("10a", what + "TRL SFTTrainer's steps / fedpeft with the LM head at every position (equal work)",
                   ("TRL", "fedpeft equal work"), tt, te, "> 1.0×", speedup,
                   agreement(e, t, start), level_at=1.0),
            figure("10b", what + "fedpeft with the LM head at every position / fedpeft (the head on response "
                   "positions only: the saving)", ("equal work", "fedpeft"), te, ta, "> 1.0×", speedup,
                   agreement(e, a, start), level_at=1.0),
            figure("10c", what + "TRL SFTTrainer's steps / fedpeft (what a user gets)", ("TRL", "fedpeft"), tt, ta,
                   "> 1.0×", speedup, agreement(a, t, start), level_at=1.0)]
