"""OpenFedLLM's federated DPO (``rui-ye/OpenFedLLM`` @ ``AUTHORS_COMMIT``, ``main_dpo.py``) run offline on
SmolLM2-135M-Instruct with fedpeft's HH-RLHF clients, its files unchanged: this launcher makes the substitutions
below at import time, then runs the script as ``__main__``; afterwards fedpeft scores the adapter it saved on the
held-out pairs (``score``), as it scores its own runs.

The substitutions (each listed in ``benchmarks/results/feddpo.md``):

1. data: ``get_dataset``/``process_dpo_dataset`` give the pairs fedpeft's clients train on, as TRL's plain-text
   format (``prompt``: the prompt as fedpeft's chat-template layout writes it; ``chosen``/``rejected``: the
   responses, to which TRL appends the end token), and ``split_dataset`` gives client k the pairs of fedpeft's
   client k (its HH-RLHF subset) in place of an iid shard of one pool;
2. TRL 1.16's API: ``DPOTrainer(model, ref_model, args, beta, train_dataset, tokenizer)`` (TRL 0.7.2's signature)
   becomes ``DPOTrainer(..., args=DPOConfig(the same settings, beta, max_length), processing_class=tokenizer)``;
   TRL 1.16 copies a PEFT model's adapter into a "ref" adapter, which the launcher deletes, so that the reference
   is the base model with the adapter disabled, as in TRL 0.7.2; ``DataCollatorForCompletionOnlyLM`` (gone in TRL
   1.x, imported but unused by ``main_dpo.py``) is a stub;
3. the learning rate: ``cosine_learning_rate(round, R, lr, 1e-5)`` across rounds becomes the constant ``lr``
   (fedpeft's trainers have no schedule across rounds);
4. CPU: float32, no gradient checkpointing (``--gradient_checkpointing False``, an option), ``report_to`` none;
5. the seed: the script seeds only its iid shuffle (replaced by 1.); here ``--seed`` also seeds torch before the
   model is built (the LoRA tensors' initialisation) and the trainers (``DPOConfig.seed``: the data order), so that
   seeds differ as fedpeft's do (without it every seed would repeat the same run).

    python -m benchmarks.feddpo_openfedllm CHECKOUT --out runs/openfedllm/s0 --seed 0 [--rounds 3 ...]
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from pathlib import Path

AUTHORS_REPO = "rui-ye/OpenFedLLM"
AUTHORS_COMMIT = "14c6af2"
SUBSETS = ("harmless-base", "helpful-base", "helpful-online", "helpful-rejection-sampled")


def write_pairs(args) -> Path:
    """The comparison's pairs, written once to ``<out>/../data`` (train.jsonl, test.jsonl): HH-RLHF's single-turn
    pairs whose prompt and both responses fit ``--max-length`` uncut (TRL 1.16 cuts a sequence only at its end and
    drops a pair whose prompt fills it; fedpeft cuts prompt fields: on these pairs both see the same tokens), the
    first ``--train-per-client`` / ``--test-per-client`` of each subset's split; one JSON object per pair with
    ``instruction``, ``chosen``, ``rejected`` and ``subset``."""
    from fedpeft.backbones.instruction_encoding import PromptFormat
    from fedpeft.backbones.loading import load_backbone
    from fedpeft.backbones.preference_encoding import encode_pairs
    from fedpeft.config import TaskConfig
    from fedpeft.data.tasks.preference import load_hh_rlhf

    folder = args.out.parent / "data"
    if (folder / "test.jsonl").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    task, backbone = load_hh_rlhf(TaskConfig(name="hh-rlhf"), 0), load_backbone("smollm2")
    end = backbone.tokenizer.eos_token_id
    for split, cap in (("train", args.train_per_client), ("test", args.test_per_client)):
        pairs = [e for e in getattr(task, split) if not e.history]
        enc = encode_pairs(backbone, PromptFormat.of(backbone, None), pairs, args.max_length, args.max_response)
        whole = [e for i, e in enumerate(pairs) if not enc.prompt_cut[i] and enc.input_ids[i][-1] == end
                 and enc.rejected_ids[i][-1] == end]
        rows = [e for g in SUBSETS for e in [x for x in whole if x.group == g][:cap]]
        (folder / f"{split}.jsonl").write_text("".join(
            json.dumps({"instruction": e.text_a, "chosen": e.target, "rejected": e.rejected, "subset": e.group}) + "\n"
            for e in rows), encoding="utf-8")
    return folder


def fedpeft_config(args, data: Path) -> list[str]:
    """fedpeft's side of the comparison at OpenFedLLM's settings (LoRA r 8 / alpha 16 on q_proj and v_proj, every
    client every round, ``steps`` local steps of ``batch`` pairs, constant lr, β) on the comparison's pairs."""
    return ["task.name=jsonl", f"task.path={data}", "task.instruction_column=instruction",
            "task.response_column=chosen", "task.rejected_column=rejected", f"task.max_length={args.max_length}",
            f"task.max_response_length={args.max_response}", "federation.partition.column=subset",
            "model.name=smollm2", f"seed={args.seed}", "federation.num_clients=4", "federation.clients_per_round=4",
            "federation.partition.scheme=by_column", f"federation.rounds={args.rounds}", "method.name=feddpo",
            "method.adapter.r=8", "method.adapter.lora_alpha=16", "method.adapter.target_modules=[q_proj, v_proj]",
            f"method.trainer.max_steps={args.steps}", f"method.trainer.batch_size={args.batch}",
            f"method.trainer.lr={args.lr}", f"method.trainer.beta={args.beta}", "method.trainer.local_epochs=100",
            "method.trainer.grad_clip=1.0", f"evaluation.every={args.rounds}", "evaluation.batch_size=16",
            "evaluation.local=false", "runtime.progress=false", f"runtime.threads={args.threads}"]


def client_pairs(args, data: Path) -> tuple[list[list[dict]], object]:
    """Each fedpeft client's training pairs in TRL's plain-text format, and the built fedpeft experiment."""
    from fedpeft.build import build
    from fedpeft.resolve import load_config

    b = build(load_config(None, fedpeft_config(args, data)))
    exp, fmt = b.exp, b.exp.objective.format
    out = []
    for c in range(exp.num_clients):
        rows = [exp.task.train[int(i)] for i in exp.train_parts[c]]
        out.append([{"prompt": fmt.prompt_text(e), "chosen": e.target, "rejected": e.rejected} for e in rows])
    return out, b


def _patch(checkout: Path, clients: list[list[dict]], timings: list[float]) -> None:
    """The substitutions of the module doc, before ``main_dpo.py`` imports what it uses."""
    import trl
    from datasets import Dataset

    sys.path.insert(0, str(checkout))
    trl.DataCollatorForCompletionOnlyLM = type("DataCollatorForCompletionOnlyLM", (), {})  # unused by main_dpo
    real = trl.DPOTrainer

    class DPOTrainer(real):  # TRL 0.7.2's signature on TRL 1.16
        def __init__(self, model, ref_model, args, beta, train_dataset, tokenizer, **kwargs):
            cfg = trl.DPOConfig(output_dir=args.output_dir,
                                per_device_train_batch_size=args.per_device_train_batch_size,
                                gradient_accumulation_steps=args.gradient_accumulation_steps,
                                learning_rate=args.learning_rate, max_steps=args.max_steps,
                                lr_scheduler_type="constant", logging_steps=args.logging_steps, report_to="none",
                                save_strategy="no", beta=beta, max_length=MAX_LENGTH[0], bf16=False, use_cpu=True,
                                gradient_checkpointing=args.gradient_checkpointing, seed=SEED[0])
            super().__init__(model=model, ref_model=ref_model, args=cfg, train_dataset=train_dataset,
                             processing_class=tokenizer, **kwargs)
            if "ref" in model.peft_config:  # TRL 0.7.2's reference: the base model, the adapter disabled
                model.delete_adapter("ref")
                model.set_adapter("default")

        def train(self, *a, **k):
            t0 = time.perf_counter()
            out = super().train(*a, **k)
            timings.append(time.perf_counter() - t0)
            return out

    trl.DPOTrainer = DPOTrainer
    import utils
    import federated_learning
    import federated_learning.split_dataset as split

    utils.get_dataset = lambda name, local_dir=None: Dataset.from_list([r for c in clients for r in c])
    utils.process_dpo_dataset = lambda name, dataset, template, sample: dataset
    utils.cosine_learning_rate = lambda round, total, lr, min_lr: lr
    federated_learning.split_dataset = lambda fed_args, script_args, dataset: [Dataset.from_list(c) for c in clients]
    split.split_dataset = federated_learning.split_dataset


MAX_LENGTH, SEED = [None], [0]


def score(saved: Path, b) -> dict:
    """fedpeft's DPO metrics of the LoRA adapter OpenFedLLM saved, on fedpeft's held-out pairs."""
    import numpy as np
    from safetensors.torch import load_file

    from fedpeft.adapters.lora import PEFT_PREFIX

    from fedpeft.methods.state import ServerState

    state = load_file(saved / "adapter_model.safetensors")
    params = {k[len(PEFT_PREFIX):]: v for k, v in state.items()}
    mine = ServerState.from_message(b.method.server_init()).glob
    if {k: tuple(v.shape) for k, v in mine.items()} != {k: tuple(v.shape) for k, v in params.items()}:
        raise ValueError(f"{saved}: its tensors are not fedpeft's LoRA of the same settings")
    whole = b.method.trainer.evaluate(params, b.exp.test_encoded, predictions=True)
    stats = whole.pop("predictions")
    groups = np.array([e.group for e in b.exp.task.test])
    return whole | {"by_group": {g: b.exp.objective.summarise(stats, np.flatnonzero(groups == g)) for g in SUBSETS},
                    "bytes_per_direction": sum(v.numel() * v.element_size() for v in state.values())}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkout", type=Path, help=f"a checkout of {AUTHORS_REPO} at {AUTHORS_COMMIT}")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--train-per-client", type=int, default=100)
    p.add_argument("--test-per-client", type=int, default=50)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--max-response", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--side", choices=["openfedllm", "fedpeft", "both"], default="both")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    data = write_pairs(args)
    if args.side in ("fedpeft", "both"):
        from benchmarks.runner import run_config

        print(run_config(args.out / "fedpeft", fedpeft_config(args, data)), flush=True)
    if args.side == "fedpeft":
        return
    clients, b = client_pairs(args, data)
    MAX_LENGTH[0], SEED[0] = args.max_length, args.seed
    torch.manual_seed(args.seed)
    timings: list[float] = []
    _patch(args.checkout, clients, timings)
    (args.out / "openfedllm").mkdir(parents=True, exist_ok=True)
    sys.argv = ["main_dpo.py", "--model_name_or_path", str(b.exp.backbone.source), "--dataset_name", "fedpeft",
                "--use_peft", "--peft_lora_r", "8", "--peft_lora_alpha", "16", "--learning_rate", str(args.lr),
                "--batch_size", str(args.batch), "--max_steps", str(args.steps), "--num_rounds", str(args.rounds),
                "--num_clients", "4", "--sample_clients", "4", "--dpo_beta", str(args.beta), "--seed",
                str(args.seed), "--save_model_freq", str(args.rounds), "--gradient_checkpointing", "False",
                "--output_dir", str(args.out / "openfedllm")]
    t0 = time.perf_counter()
    runpy.run_path(str(args.checkout / "main_dpo.py"), run_name="__main__")
    wall = time.perf_counter() - t0
    (saved,) = sorted((args.out / "openfedllm").glob(f"*/checkpoint-{args.rounds}"))[-1:]
    result = {"scores": score(saved, b), "seconds": wall, "client_train_seconds": timings,
              "rounds": args.rounds, "settings": vars(args) | {"checkout": str(args.checkout), "out": str(args.out)}}
    (args.out / "openfedllm.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result["scores"], indent=1))


if __name__ == "__main__":
    main()
