"""Federate your own TRL DPOTrainer with fedpeft (docs/how-to/federate-your-trainer.md, "DPO").

Three clients, each with its own preference pairs (a prompt, the answer its users chose and the one they rejected),
build their DPOTrainers exactly as a TRL script does: one PEFT LoRA model per client, a DPOConfig, a
prompt-chosen-rejected dataset. fedpeft federates them: 3 rounds of 4 local DPO steps, FedAvg of the LoRA tensors
(`fedit`), the schedule running over all 12 steps and each client's AdamW moments over its rounds, and scores the
global adapter on the clients' eval pairs as TRL's DPOTrainer.evaluate() does (reward accuracy, DPO loss, margin).
Offline:

    .venv/bin/python examples/federate_my_dpo_trainer.py                   # a tiny random LLaMA: seconds
    .venv/bin/python examples/federate_my_dpo_trainer.py --model smollm2   # SmolLM2-135M-Instruct: minutes on CPU
"""

from __future__ import annotations

import argparse
import os
import tempfile

from federate_my_sft_trainer import base_model

CLIENTS = {  # (prompt, chosen, rejected): each client prefers short answers that end with a full stop
    "capitals": [("The capital of France is", " Paris.", " a city in Europe, I think"),
                 ("The capital of Italy is", " Rome.", " probably Milan or something"),
                 ("The capital of Spain is", " Madrid.", " hard to say"),
                 ("The capital of Japan is", " Tokyo.", " somewhere in Asia"),
                 ("The capital of Egypt is", " Cairo.", " not known to me"),
                 ("The capital of Peru is", " Lima.", " in South America")],
    "opposites": [("The opposite of hot is", " cold.", " not hot at all really"),
                  ("The opposite of up is", " down.", " sideways maybe"),
                  ("The opposite of big is", " small.", " whatever is not big"),
                  ("The opposite of fast is", " slow.", " a question of taste"),
                  ("The opposite of light is", " dark.", " heavy or dark"),
                  ("The opposite of early is", " late.", " on time, perhaps")],
    "plurals": [("The plural of mouse is", " mice.", " mouses"),
                ("The plural of child is", " children.", " childs"),
                ("The plural of foot is", " feet.", " foots"),
                ("The plural of tooth is", " teeth.", " tooths"),
                ("The plural of goose is", " geese.", " gooses"),
                ("The plural of man is", " men.", " mans")],
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["tiny-llama", "smollm2"], default="tiny-llama")
    p.add_argument("--out", default="runs/my-dpo")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--local-steps", type=int, default=4)
    args = p.parse_args(argv)

    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from trl import DPOConfig, DPOTrainer

    from fedpeft.integrations.transformers import federate

    # 1. what a TRL script does, per client: a fresh LoRA adapter on the pretrained model (TRL's reference is the
    # model with the adapter disabled, as fedpeft's is), a DPOConfig, the client's pairs
    trainers = []
    for i, (name, pairs) in enumerate(CLIENTS.items()):
        model, tokenizer, model_name = base_model(args.model)
        peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
        data = Dataset.from_dict({"prompt": [q for q, _, _ in pairs], "chosen": [c for _, c, _ in pairs],
                                  "rejected": [r for _, _, r in pairs]})
        config = DPOConfig(output_dir=os.path.join(tempfile.gettempdir(), "fedpeft-example", name),  # saves nothing
                           per_device_train_batch_size=3, learning_rate=5e-3, beta=0.1, lr_scheduler_type="cosine",
                           warmup_steps=2, bf16=False, use_cpu=True, report_to="none", save_strategy="no",
                           logging_strategy="no", disable_tqdm=True, seed=i)
        # (the eval pairs here are two of the training pairs, to keep it tiny: hold out your own)
        trainers.append(DPOTrainer(model=peft_model, args=config, train_dataset=data,
                                   eval_dataset=data.select([0, 1]), processing_class=tokenizer))

    # 2. fedpeft federates them: rounds x local steps, FedAvg (fedit), bytes counted, a resumable run directory
    fed = federate(trainers, rounds=args.rounds, local_steps=args.local_steps, method="fedit", model_name=model_name,
                   settings={"runtime.progress": False})
    summary = fed.run(args.out)

    from fedpeft.tracking.rundir import RunDir

    print(f"\n{'round':>5} {'reward acc':>10} {'DPO loss':>9} {'margin':>8} {'bytes up':>9}  per client: train loss")
    for r in RunDir(args.out).read_metrics():
        losses = " ".join(f"{c['train_loss']:.3f}" for c in r["clients"] if "train_loss" in c)
        print(f"{r['round']:>5} {r['accuracy']:>10.3f} {r['loss']:>9.4f} {r['reward_margin']:>8.4f} "
              f"{r['bytes_up']:>9}  {losses}")
    print(f"\nfinal reward accuracy {summary['final_accuracy']:.3f}; run directory {args.out} "
          f"(fedpeft export {args.out} out/ --format peft)")


if __name__ == "__main__":
    main()
