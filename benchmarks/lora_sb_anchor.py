"""LoRA-SB's initialisation (``adapters.lora_sb``, Fed-SB's adapter) against its authors' code, on MiniLM and real data
(benchmarks/results/lora_sb_anchor.md).

The authors' functions run unchanged from a checkout of ``RaghavSinghal10/lora-sb`` (``--checkout``): their
``utils.gradient_utils.estimate_and_process_grads_torch`` (the first ``num_samples`` = 2 examples' summed gradient of
every weight, −lr·sign of it) and ``utils.initialization_utils.find_and_initialize_grad`` (``svd_lowrank`` of each
adapted module's processed gradient, B, A and the latent R put into PEFT's LoRA layers) with their
``config/reconstruct_config.yaml``, on HF's ``AutoModelForSequenceClassification`` of MiniLM (as their GLUE script
builds RoBERTa) with the same token batch, the same classifier weights and dropout off (fedpeft's backbone runs in
eval mode; their gradient pass is in train mode). fedpeft's side is the ``fed-sb`` preset's initial tensors with
``model.pooling: pooler`` (HF's sequence-classification head: pooler, then a linear layer). Reported per seed: the
agreement of the two sign steps entry by entry, and the relative distance of the two initial updates B R A over all
adapted modules (theirs rounds U, S, V to bfloat16 and draws a randomised SVD; fedpeft's SVD is exact in float64).

    git -C <mirror of RaghavSinghal10/lora-sb> show HEAD:<file>   # the .py and .yaml files into runs/lora-sb-checkout
    python -m benchmarks.lora_sb_anchor --checkout runs/lora-sb-checkout
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.runner import write_results

MODULES = ("query", "key", "value")


def _fedpeft_side(task: str, rank: int, seed: int, step: float):
    """(the initial tensors, the objective, the two examples' token batch, their labels) of fedpeft's fed-sb."""
    from fedpeft.build import build
    from fedpeft.resolve import load_config
    from fedpeft.rng import SERVER, torch_rng

    cfg = load_config(None, ["method.name=fed-sb", f"method.adapter.r={rank}", f"method.adapter.init_step={step}",
                             "model.name=minilm", "model.readout=linear", "model.pooling=pooler", f"task.name={task}",
                             f"seed={seed}", "federation.num_clients=3", "runtime.progress=false"])
    b = build(cfg)
    clf, adapter = b.exp.classifier, b.exp.classifier.adapter
    init = b.method.initial_params()
    g = torch_rng(seed, 0, SERVER, "adapter-init")  # replay the draws up to the examples the adapter picked
    drawn = adapter.init(clf.backbone, g) | clf.head.init(clf, g)
    pick = torch.randperm(len(clf.task.train), generator=g)[: adapter.cfg.init_examples].tolist()
    batch = clf.batch(clf.encode([clf.task.train[i] for i in pick]), list(range(len(pick))))
    return init, drawn, clf, batch, pick


def _authors_side(checkout: Path, model_dir: str, drawn: dict, batch: dict, num_labels: int, rank: int,
                  step: float) -> dict[str, torch.Tensor]:
    """Module -> the authors' initial update B R A (their functions, unchanged), and their processed gradients."""
    import yaml
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForSequenceClassification

    sys.path.insert(0, str(checkout))
    from utils.gradient_utils import estimate_and_process_grads_torch
    from utils.initialization_utils import find_and_initialize_grad

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=num_labels,
                                                               hidden_dropout_prob=0.0,
                                                               attention_probs_dropout_prob=0.0)
    with torch.no_grad():  # fedpeft's seeded task head as their classifier
        model.classifier.weight.copy_(drawn["head.weight"])
        model.classifier.bias.copy_(drawn["head.bias"])
    rows = [{"input_ids": batch["input_ids"][i].cpu(), "attention_mask": batch["attention_mask"][i].cpu(),
             "labels": batch["labels"][i].cpu()} for i in range(batch["input_ids"].shape[0])]
    loader = torch.utils.data.DataLoader(rows, batch_size=len(rows))
    grads = estimate_and_process_grads_torch(model=model, dataloader=loader, lr=step, num_samples=len(rows))
    config = LoraConfig(task_type=TaskType.SEQ_CLS, r=rank, lora_alpha=rank, lora_dropout=0.0,
                        target_modules=list(MODULES))
    peft_model = get_peft_model(model, config)
    reconstruct = yaml.safe_load((checkout / "config" / "reconstruct_config.yaml").read_text())
    reconstruct["svd"]["rank"] = rank
    find_and_initialize_grad(model=peft_model, peft_config={"default": config}, adapter_name="default",
                             reconstr_type="svd", reconstruct_config=reconstruct, writer=None,
                             named_grads={"base_model.model." + k: v for k, v in grads.items()})
    out = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "default_lora_latent_mapping"):
            b, r, a = (module.lora_B["default"].weight.double(), module.default_lora_latent_mapping.weight.double(),
                       module.lora_A["default"].weight.double())
            out[name.removeprefix("base_model.model.bert.")] = (b @ r @ a, grads[name.removeprefix(
                "base_model.model.") + ".weight"].double())
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", default="runs/lora-sb-checkout", help="the authors' files (see the docstring)")
    p.add_argument("--task", default="rte")
    p.add_argument("--rank", type=int, default=24, help="their GLUE scripts' r")
    p.add_argument("--step", type=float, default=1e-4, help="η of the sign step (both sides)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--results", default="benchmarks/results/lora_sb_anchor.md")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from fedpeft.comm.lora_pairs import LATENT, A, B

    rows = []
    for seed in args.seeds:
        init, drawn, clf, batch, pick = _fedpeft_side(args.task, args.rank, seed, args.step)
        theirs = _authors_side(Path(args.checkout), clf.backbone.source, drawn, batch, clf.task.num_classes,
                               args.rank, args.step)
        agree = total = 0
        num = den = err_ours = err_theirs = size = 0.0
        modules = list(clf.adapter.modules(clf.backbone))
        steps = _fedpeft_steps(clf, drawn, batch, modules, args.step)
        for m in modules:
            ours = init[m + B].double() @ init[m + LATENT].double() @ init[m + A].double()
            their_update, their_step = theirs[m]
            agree += int((torch.sign(steps[m]) == torch.sign(their_step)).sum())
            total += their_step.numel()
            their_update = their_update.detach()
            num += float(((ours - their_update) ** 2).sum())
            den += float((their_update ** 2).sum())
            err_ours += float(((ours - steps[m]) ** 2).sum())  # how far each rank-r update is from the full step
            err_theirs += float(((their_update - steps[m]) ** 2).sum())
            size += float((steps[m] ** 2).sum())
        row = (seed, pick, len(modules), agree / total, (num / den) ** 0.5, (err_ours / size) ** 0.5,
               (err_theirs / size) ** 0.5)
        rows.append(row)
        print("seed {}: examples {}, {} modules, sign agreement {:.6f}, distance {:.3g}, "
              "error ours {:.4f} theirs {:.4f}".format(*row))
    lines = ["# LoRA-SB's initialisation against the authors' code", "",
             f"Rendered with: `python -m benchmarks.lora_sb_anchor {' '.join(argv or sys.argv[1:])}` (CPU).", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"MiniLM, task {args.task}, r = {args.rank}, η = {args.step}, the first 2 examples fedpeft's seeded draw "
             "picks; the authors' checkout: RaghavSinghal10/lora-sb at 37b33d4, files unchanged.", "",
             "| seed | training examples | adapted modules | sign steps equal (fraction of entries) | "
             "‖ΔW_fedpeft − ΔW_authors‖ / ‖ΔW_authors‖ | rank-r error, fedpeft | rank-r error, authors |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {s} | {', '.join(map(str, x))} | {n} | {a:.6f} | {d:.3g} | {eo:.4f} | {et:.4f} |"
              for s, x, n, a, d, eo, et in rows]
    lines += ["", "Rank-r error: ‖ΔW − S‖ / ‖S‖ of each side's initial update B R A against the full sign step S it "
              "approximates, over all adapted modules (Eckart–Young: the exact truncated SVD is the least possible). "
              f"Mean distance between the two sides {statistics.fmean(r[4] for r in rows):.3g}; mean rank-r error "
              f"{statistics.fmean(r[5] for r in rows):.4f} (fedpeft) and {statistics.fmean(r[6] for r in rows):.4f} "
              "(authors)."]
    write_results(args.results, lines)


def _fedpeft_steps(clf, drawn: dict, batch: dict, modules: list[str], step: float) -> dict[str, torch.Tensor]:
    """Module -> fedpeft's sign step −η·sign(G), G the loss gradient of its base weight on the batch (the quantity
    ``LoraSB.initialise`` factorises; ``tests/methods/test_fed_sb.py`` checks that it does)."""
    weights = [clf.backbone.model.get_submodule(m).base_layer.weight for m in modules]
    for w in weights:
        w.requires_grad_(True)
    try:
        clf.loss(clf.outputs(drawn, batch), batch).backward()
        return {m: -step * torch.sign(w.grad.detach().double()) for m, w in zip(modules, weights)}
    finally:
        for w in weights:
            w.grad = None
            w.requires_grad_(False)


if __name__ == "__main__":
    main()
