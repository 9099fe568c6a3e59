"""Federate your own TRL SFTTrainer with fedpeft (docs/how-to/federate-your-trainer.md).

Three clients, each with a handful of its own instruction examples (one skill each: capitals, opposites, plurals),
build their SFTTrainers exactly as a TRL script does: one PEFT LoRA model, an SFTConfig, a prompt-completion
dataset. fedpeft federates them: 3 rounds of 4 local steps, FedAvg of the LoRA tensors (the `fedit` preset), the
learning-rate schedule running over all 12 steps and each client's AdamW moments over its rounds. Offline:

    .venv/bin/python examples/federate_my_sft_trainer.py                   # a tiny random LLaMA: seconds
    .venv/bin/python examples/federate_my_sft_trainer.py --model smollm2   # SmolLM2-135M-Instruct: minutes on CPU

then, like any fedpeft run: `fedpeft report runs/my-sft`, `fedpeft export runs/my-sft out/ --format peft`.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile

CLIENTS = {
    "capitals": [("The capital of France is", " Paris."), ("The capital of Italy is", " Rome."),
                 ("The capital of Spain is", " Madrid."), ("The capital of Japan is", " Tokyo."),
                 ("The capital of Egypt is", " Cairo."), ("The capital of Peru is", " Lima.")],
    "opposites": [("The opposite of hot is", " cold."), ("The opposite of up is", " down."),
                  ("The opposite of big is", " small."), ("The opposite of fast is", " slow."),
                  ("The opposite of light is", " dark."), ("The opposite of early is", " late.")],
    "plurals": [("The plural of mouse is", " mice."), ("The plural of child is", " children."),
                ("The plural of foot is", " feet."), ("The plural of tooth is", " teeth."),
                ("The plural of goose is", " geese."), ("The plural of man is", " men.")],
}


def base_model(name: str):
    """The pretrained model and tokenizer, from what this machine has offline. With a network you would write
    ``AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")`` here."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fedpeft.backbones.loading import load_backbone

    if name == "tiny-llama":  # fedpeft's tiny random LLaMA (its tokenizer: MiniLM's WordPiece, no end token set)
        packaged = load_backbone("tiny-llama")
        tokenizer = copy.deepcopy(packaged.tokenizer)
        tokenizer.eos_token = "[SEP]"
        return copy.deepcopy(packaged.model), tokenizer, "tiny-llama"
    folder = load_backbone("smollm2").source  # the packaged SmolLM2-135M-Instruct, dequantized once into a folder
    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder), folder


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["tiny-llama", "smollm2"], default="tiny-llama")
    p.add_argument("--out", default="runs/my-sft")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--local-steps", type=int, default=4)
    args = p.parse_args(argv)

    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from trl import SFTConfig, SFTTrainer

    from fedpeft.integrations.transformers import federate

    # 1. what a TRL script does: a LoRA adapter on the pretrained model ...
    model, tokenizer, model_name = base_model(args.model)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    # ... and one SFTTrainer per client, on that client's data. The trainers share the one PEFT model (a single copy
    # of the weights in this process): fedpeft writes the global adapter into it before each client's round.
    trainers = []
    for i, (name, pairs) in enumerate(CLIENTS.items()):
        data = Dataset.from_dict({"prompt": [q for q, _ in pairs], "completion": [a for _, a in pairs]})
        config = SFTConfig(output_dir=os.path.join(tempfile.gettempdir(), "fedpeft-example", name),  # saves nothing
                           per_device_train_batch_size=4, learning_rate=2e-3, lr_scheduler_type="cosine",
                           warmup_steps=2, bf16=False, use_cpu=True, report_to="none", save_strategy="no",
                           logging_strategy="no", disable_tqdm=True, seed=i)
        # (the eval rows here are two of the training rows, to keep it tiny: hold out your own)
        trainers.append(SFTTrainer(model=peft_model, args=config, train_dataset=data, eval_dataset=data.select([0, 1]),
                                   processing_class=tokenizer))

    # 2. fedpeft federates them: rounds x local steps, FedAvg (fedit), bytes counted, a resumable run directory
    fed = federate(trainers, rounds=args.rounds, local_steps=args.local_steps, method="fedit", model_name=model_name,
                   settings={"runtime.progress": False})
    summary = fed.run(args.out)

    from fedpeft.tracking.rundir import RunDir

    print(f"\n{'round':>5} {'eval loss':>10} {'bytes up':>9} {'bytes down':>10}  per client: train loss")
    for r in RunDir(args.out).read_metrics():
        losses = " ".join(f"{c['train_loss']:.3f}" for c in r["clients"] if "train_loss" in c)
        print(f"{r['round']:>5} {r['loss']:>10.4f} {r['bytes_up']:>9} {r['bytes_down']:>10}  {losses}")
    print(f"\nfinal eval loss {summary['final_loss']:.4f}; run directory {args.out} "
          f"(fedpeft export {args.out} out/ --format peft)")


if __name__ == "__main__":
    main()
