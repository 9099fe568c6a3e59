"""Figure 9: a DPO client's local work (issue 73) against a bare PEFT + PyTorch loop on the same batches.

SmolLM2-135M-Instruct with LoRA (r 16, alpha 32, every linear projection of the attention and MLP blocks), one
client of ``feddpo`` on HH-RLHF (pairs of at most 128 tokens, batch 4 pairs). The bare loop: its own copy of the
model with PEFT's LoRA layers injected, the batches fedpeft's client trains on pre-collated (chosen rows, then
rejected rows), per step the policy's full-vocabulary logits at every position, the reference's with the LoRA
layers switched off (no gradient), the DPO loss (Rafailov et al. 2023, Eq. 7), backward, clipping, AdamW. fedpeft's
arm is the whole client (``handle_train``: decode the instruction, the DPO trainer, encode the reply). Both start
from the same tensors; the trained tensors must agree (max |difference| reported). Goal <= 1.05x.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedpeft.comm.codec import decode
from fedpeft.methods.state import ServerState
from fedpeft.runtime.client import handle_train
from fedpeft.runtime.server import RoundDriver

from benchmarks.perf.common import Figure, alternate, figure, max_diff, step_rows

LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def dpo_work(args, steps: int):
    from fedpeft.build import build
    from fedpeft.resolve import load_config

    cfg = load_config(None, ["method.name=feddpo", "task.name=hh-rlhf", "task.max_train=16", "task.max_test=2",
                             "task.max_length=128", "task.max_response_length=32", "model.name=smollm2",
                             "federation.num_clients=4", "federation.clients_per_round=1",
                             "federation.partition.scheme=by_column", f"method.adapter.target_modules={LINEAR}",
                             "method.trainer.batch_size=4", f"method.trainer.max_steps={steps}",
                             "method.trainer.local_epochs=100", "runtime.threads=1", "runtime.progress=false"])
    return build(cfg)


def dpo_batches(b, cid: int, round: int) -> list[dict[str, torch.Tensor]]:
    """The batches fedpeft's client ``cid`` trains on in ``round`` (its shuffling stream), pre-collated."""
    data, pm, out = b.exp.client(cid).train, b.exp.objective, []
    for rows in step_rows(b, cid, round):
        batch = pm.batch(data, rows)
        j = torch.arange(batch["input_ids"].shape[1]).unsqueeze(0)
        scored = (j >= batch["response_start"].unsqueeze(1)) & batch["attention_mask"].bool()
        out.append({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "scored": scored})
    return out


class BareDPO:
    """The bare loop: its own SmolLM2 with PEFT's LoRA layers, reset to the global tensors before every run."""

    def __init__(self, b, start: dict[str, torch.Tensor]) -> None:
        from peft import LoraConfig, inject_adapter_in_model

        from fedpeft.backbones.loading import _smollm2

        self.b, self.start = b, start
        self.model = _smollm2().model.eval().requires_grad_(False)
        inject_adapter_in_model(LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none",
                                           target_modules=LINEAR), self.model)
        self.params = {k: self.model.get_parameter(k.replace(".weight", ".default.weight")) for k in start}
        from peft.tuners.lora import LoraLayer

        self.layers = [m for m in self.model.modules() if isinstance(m, LoraLayer)]

    def logps(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        logits = self.model(input_ids=ids, attention_mask=batch["attention_mask"]).logits[:, :-1].float()
        token = torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:].unsqueeze(2)).squeeze(2)
        return (token * batch["scored"][:, 1:]).sum(1)

    def run(self, batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        s = self.b.method.trainer.settings
        with torch.no_grad():
            for k, p in self.params.items():
                p.copy_(self.start[k])
                p.requires_grad_(True)
        leaves = list(self.params.values())
        opt = torch.optim.AdamW(leaves, lr=s.lr, weight_decay=s.weight_decay)
        for batch in batches:
            policy = self.logps(batch)
            with torch.no_grad():
                for m in self.layers:
                    m.enable_adapters(False)
                ref = self.logps(batch)
                for m in self.layers:
                    m.enable_adapters(True)
            n = policy.shape[0] // 2
            margin = (policy[:n] - ref[:n]) - (policy[n:] - ref[n:])
            loss = -F.logsigmoid(s.beta * margin).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(leaves, s.grad_clip)
            opt.step()
        return {k: v.detach().clone() for k, v in self.params.items()}


def figure_9(args) -> list[Figure]:
    steps = 3
    b = dpo_work(args, steps)
    state = b.method.server_init()
    plan = RoundDriver(b.plan.federation, b.method).plan_round(state, 1)
    cid = min(plan.instructions)
    payload = plan.instructions[cid]
    bare = BareDPO(b, ServerState.from_message(state).glob)
    batches = dpo_batches(b, cid, 1)

    def fedpeft_client():
        return handle_train(b.method, payload, b.exp.client(cid))

    ta, tb = alternate(fedpeft_client, lambda: bare.run(batches), args.reps)
    diff = max_diff(bare.run(batches), decode(fedpeft_client()).tensors)
    return [figure("9", f"DPO: one client's {len(batches)} steps of 4 pairs (SmolLM2, LoRA on every linear layer), "
                   "fedpeft client / bare PEFT loop", ("fedpeft", "bare"), ta, tb, "≤ 1.05×", lambda r: r <= 1.05,
                   f"trained tensors max abs diff {diff:.1e}")]
