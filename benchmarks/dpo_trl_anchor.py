"""fedpeft's DPO against TRL's ``DPOTrainer`` on SmolLM2-135M-Instruct (benchmarks/results/dpo_trl_anchor.md): the
same HH-RLHF pairs, LoRA tensors (all-linear, r 16, B moved off zero so the policy differs from the reference) and
β; TRL tokenizes the pairs in its conversational format (the chat template) and fedpeft lays them out as its
preference encoding does. Reported: whether the two give the same token ids, and on TRL's batch the loss and the
LoRA gradients of both (``tests/unit/test_dpo.py`` checks the same on a tiny model in CI).

    python -m benchmarks.dpo_trl_anchor [--pairs 4] [--loss-type sigmoid ipo robust]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"


def trl_example(ex) -> dict:
    """An fedpeft preference example in TRL's conversational format (prompt = the dialogue, then one turn each)."""
    prompt = [{"role": r, "content": t} for r, t in ex.history] + [{"role": "user", "content": ex.text_a}]
    return {"prompt": prompt, "chosen": [{"role": "assistant", "content": ex.target}],
            "rejected": [{"role": "assistant", "content": ex.rejected}]}


def compare(pairs: int, loss_type: str, beta: float, eps: float) -> dict:
    import torch
    from datasets import Dataset
    from peft import set_peft_model_state_dict
    from trl import DPOConfig, DPOTrainer

    from fedpeft.adapters.lora import PEFT_PREFIX, Lora, LoraSettings
    from fedpeft.adapters.base import AdapterContext
    from fedpeft.backbones.loading import _smollm2, load_backbone
    from fedpeft.backbones.preference_encoding import PairEncoded
    from fedpeft.config import TaskConfig
    from fedpeft.data.tasks.preference import load_hh_rlhf
    from fedpeft.model.preference import PreferenceModel
    from fedpeft.trainers.dpo import dpo_losses

    task = load_hh_rlhf(TaskConfig(name="hh-rlhf"), 0)
    examples = [e for e in task.train if len(e.history) == 2][:pairs]  # short dialogues: none is cut
    backbone = load_backbone("smollm2")
    lora = Lora(LoraSettings(r=16, lora_alpha=32.0, target_modules=["all-linear"]))
    lora.bind(AdapterContext(0, task, "lm", backbone))
    pm = PreferenceModel(backbone, lora, task, max_length=2048, max_response_length=2048)
    g = torch.Generator().manual_seed(0)
    params = {k: (v + 0.02 * torch.randn(v.shape, generator=g)).requires_grad_(True)
              for k, v in pm.init_params(g).items()}
    ours = pm.encode(examples)

    peft_config, state = lora.to_peft(backbone, {k: v.detach() for k, v in params.items()}, "CAUSAL_LM")
    with tempfile.TemporaryDirectory() as tmp:
        args = DPOConfig(output_dir=tmp, beta=beta, loss_type=[loss_type], label_smoothing=eps,
                         per_device_train_batch_size=pairs, report_to="none", use_cpu=True, max_length=None)
        trainer = DPOTrainer(model=_smollm2().model, args=args, processing_class=copy.deepcopy(backbone.tokenizer),
                             train_dataset=Dataset.from_list([trl_example(e) for e in examples]),
                             peft_config=peft_config)
        set_peft_model_state_dict(trainer.model, state)
        rows = [trainer.train_dataset[i] for i in range(pairs)]
        batch = trainer.data_collator(rows)
        trl_loss = trainer.compute_loss(trainer.model, batch)
        trl_loss.backward()
        theirs = {n.replace(".default", ""): p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
    same_ids = [ours.input_ids[i] == r["prompt_ids"] + r["chosen_ids"]
                and ours.rejected_ids[i] == r["prompt_ids"] + r["rejected_ids"] for i, r in enumerate(rows)]
    # TRL scores the chat template's text after the end-of-turn token too (SmolLM2's: a line break)
    tail = [backbone.tokenizer.decode(r["chosen_ids"][len(ours.input_ids[i]) - len(r["prompt_ids"]):])
            for i, r in enumerate(rows)]
    but_tail = [ours.input_ids[i] == (r["prompt_ids"] + r["chosen_ids"])[:len(ours.input_ids[i])]
                and ours.rejected_ids[i] == (r["prompt_ids"] + r["rejected_ids"])[:len(ours.rejected_ids[i])]
                for i, r in enumerate(rows)]
    enc = PairEncoded([r["prompt_ids"] + r["chosen_ids"] for r in rows], np.zeros(pairs, dtype=np.int64),
                      np.full(pairs, -1, dtype=np.int64), 0, np.array([len(r["prompt_ids"]) for r in rows]),
                      rejected_ids=[r["prompt_ids"] + r["rejected_ids"] for r in rows])
    b = pm.batch(enc, list(range(pairs)))
    loss = dpo_losses(pm.outputs(params, b), pm.reference_logps(b), beta, loss_type, eps).mean()
    loss.backward()
    diffs = [(params[k].grad - theirs[PEFT_PREFIX + k]).abs().max().item() for k in params]
    scale = max(g.abs().max().item() for g in theirs.values())
    return {"loss_type": loss_type, "pairs": pairs, "same_ids": sum(same_ids), "but_tail": sum(but_tail),
            "tail": sorted(set(tail)), "trl_loss": trl_loss.item(),
            "loss": loss.item(), "loss_diff": abs(loss.item() - trl_loss.item()), "grad_max_diff": max(diffs),
            "grad_max": scale, "tensors": len(params), "tokens": int(b["attention_mask"].sum())}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--loss-type", nargs="+", default=["sigmoid", "ipo", "robust"])
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--out", default=str(RESULTS / "dpo_trl_anchor.md"))
    args = p.parse_args(argv)
    rows = [compare(args.pairs, lt, args.beta, 0.2 if lt == "robust" else 0.0) for lt in args.loss_type]
    lines = ["# fedpeft's DPO against TRL's DPOTrainer on SmolLM2-135M-Instruct", "",
             f"Generated by `python -m benchmarks.dpo_trl_anchor --pairs {args.pairs}` (CPU, float32): HH-RLHF "
             "training pairs with one earlier exchange (harmless-base first), LoRA r 16 / alpha 32 on every linear "
             f"layer with B drawn off zero (N(0, 0.02²)), β {args.beta} (robust: ε 0.2). TRL 1.16 tokenizes the "
             "pairs in its conversational format; both losses and gradients are computed on TRL's batch.", "",
             "| loss type | pairs | token ids equal to fedpeft's encoding | equal but for TRL's tokens after the "
             "end of turn | those tokens | TRL loss | fedpeft loss | |Δ loss| | max |Δ grad| | max |grad| | "
             "LoRA tensors | tokens |", "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r['loss_type']} | {r['pairs']} | {r['same_ids']}/{r['pairs']} | {r['but_tail']}/{r['pairs']} "
                     f"| {', '.join(repr(t) for t in r['tail'])} | {r['trl_loss']:.6f} | "
                     f"{r['loss']:.6f} | {r['loss_diff']:.1e} | {r['grad_max_diff']:.1e} | {r['grad_max']:.1e} | "
                     f"{r['tensors']} | {r['tokens']} |")
    notes = Path(args.out).with_name(Path(args.out).stem + "_notes.md")
    if notes.exists():
        lines += ["", notes.read_text().strip()]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
