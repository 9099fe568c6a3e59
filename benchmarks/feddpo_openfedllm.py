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

With ``--matched-order`` two more, so that the two implementations train on the same pairs in the same order from
the same start and what is left between them is the implementations themselves:

6. the data order: ``get_dataset_this_round`` gives client k in round r the pairs fedpeft's client k trains on in
   round r + 1, in its step order (``benchmarks.perf.common.step_rows``: its shuffling stream), in place of the
   same ``random.seed(round)`` subset for every client, and each trainer draws them in that order (a sequential
   sampler in place of its shuffle);
7. the start: fedpeft's initial adapter (``server_init``: A drawn from the run's seed, B = 0) is set into the PEFT
   model after ``get_peft_model``, in place of PEFT's own draw of A.

    python -m benchmarks.feddpo_openfedllm CHECKOUT --out runs/openfedllm/s0 --seed 0 [--rounds 3 ...]
    python -m benchmarks.feddpo_openfedllm CHECKOUT --out runs/openfedllm_matched/s0 --seed 0 --matched-order
    python -m benchmarks.feddpo_openfedllm --render-only     # -> benchmarks/results/feddpo_openfedllm.md

The matched runs' table is ``benchmarks/results/feddpo_openfedllm.md``; the unmatched runs' table is also part of
``benchmarks/results/feddpo.md`` (``benchmarks.feddpo`` renders it beside its grid). The runs are archived with
``--exclude data`` (the comparison's pairs, written to ``<runs>/data``, are HH-RLHF's text from ``../shared/data``:
never packed): ``python -m benchmarks.archive_runs --max-unfinished-mb 1 runs/openfedllm_matched
benchmarks/results/feddpo_openfedllm_runs.tgz --exclude data``.
"""

from __future__ import annotations

import argparse
import json
import runpy
import statistics
import sys
import time
from pathlib import Path

from benchmarks.budget import budget_cell, measured, rate
from benchmarks.runner import write_results
from benchmarks.stats import paired_cell

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


def matched_rounds(b, rounds: int) -> list[list[list[int]]]:
    """[client][round] the row indices (into the client's pairs) fedpeft's client trains on in round + 1, in its
    step order (substitution 6)."""
    from benchmarks.perf.common import step_rows

    return [[[i for step in step_rows(b, c, r + 1) for i in step] for r in range(rounds)]
            for c in range(b.exp.num_clients)]


def _match(b, order: list[list[list[int]]], shards: list) -> None:
    """Substitutions 6 and 7: each client's round in fedpeft's order, and fedpeft's initial adapter."""
    import peft
    import federated_learning
    import federated_learning.split_dataset as split

    from fedpeft.adapters.lora import PEFT_PREFIX
    from fedpeft.methods.state import ServerState

    def this_round(dataset, round, fed_args, script_args):
        (client,) = [c for c, d in enumerate(shards) if d is dataset]  # the shard main_dpo.py passes, by identity
        return dataset.select(order[client][round])

    federated_learning.get_dataset_this_round = split.get_dataset_this_round = this_round
    start = {PEFT_PREFIX + k: v.clone() for k, v in ServerState.from_message(b.method.server_init()).glob.items()}
    real = peft.get_peft_model

    def get_peft_model(model, config, *a, **k):
        model = real(model, config, *a, **k)
        peft.set_peft_model_state_dict(model, start)
        now = peft.get_peft_model_state_dict(model)
        if now.keys() != start.keys() or any(not now[n].equal(v) for n, v in start.items()):
            raise ValueError("substitution 7: fedpeft's initial adapter did not load into the PEFT model whole")
        return model

    peft.get_peft_model = get_peft_model


def _patch(checkout: Path, clients: list[list[dict]], timings: list[float], b=None,
           order: list[list[list[int]]] | None = None) -> None:
    """The substitutions of the module doc, before ``main_dpo.py`` imports what it uses (6 and 7 with ``order``:
    fedpeft's data order of each client and round, from the built experiment ``b``)."""
    import trl
    from datasets import Dataset
    from torch.utils.data import SequentialSampler

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

        def _get_train_sampler(self, *a, **k):  # substitution 6: the round's pairs in fedpeft's order
            return SequentialSampler(self.train_dataset) if order else super()._get_train_sampler(*a, **k)

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
    shards = [Dataset.from_list(c) for c in clients]
    federated_learning.split_dataset = split.split_dataset = lambda fed_args, script_args, dataset: shards
    if order:
        _match(b, order, shards)


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


def adapter_gap(saved: Path, ours: Path, b, rounds: int) -> dict:
    """How far OpenFedLLM's final adapter is from fedpeft's (the run in ``ours``, at its last round): the norm of
    their difference over the norm of fedpeft's update from the common start (substitution 7), and the largest
    difference of one element (Adam's first steps move an element by about the learning rate whatever its
    gradient's size, so float noise in a near-zero gradient can show as up to twice it)."""
    from safetensors.torch import load_file

    from fedpeft.adapters.lora import PEFT_PREFIX
    from fedpeft.methods.state import ServerState
    from fedpeft.tracking.rundir import RunDir

    done, server, _, _ = RunDir(ours).load_checkpoint()
    if done != rounds:
        raise ValueError(f"{ours}: its checkpoint is of round {done}, not the last ({rounds})")
    mine = ServerState.from_message(server).glob
    start = ServerState.from_message(b.method.server_init()).glob
    theirs = {k[len(PEFT_PREFIX):]: v for k, v in load_file(saved / "adapter_model.safetensors").items()}
    norm = lambda d: sum(float(v.double().pow(2).sum()) for v in d.values()) ** 0.5  # noqa: E731
    return {"relative": norm({k: mine[k] - theirs[k] for k in mine}) / norm({k: mine[k] - start[k] for k in mine}),
            "max_abs": max(float((mine[k] - theirs[k]).abs().max()) for k in mine)}


def openfedllm_table(root: Path, seeds: list[int], matched: bool) -> list[str]:
    """fedpeft's ``feddpo`` against OpenFedLLM's ``main_dpo.py``, the runs under ``root`` (``<root>/s<seed>``):
    per seed the held-out reward accuracy of both final adapters (scored alike, by fedpeft's DPO trainer), their
    paired difference, the bytes per client-round each way and the seconds per round; ``matched``: the runs of
    ``--matched-order``, with how far the two final adapters are apart."""
    rows, diffs, ran = [], [], None
    gap_head = " final adapters apart: ‖Δ‖ / ‖fedpeft's update‖, max abs |" if matched else ""
    for s in seeds:
        theirs, ours = root / f"s{s}" / "openfedllm.json", root / f"s{s}" / "fedpeft"
        if not theirs.exists() or not (ours / "summary.json").exists():
            rows.append(f"| {s} | – | – | – | – | – |{' – |' if matched else ''} – | not run yet |")
            continue
        t = json.loads(theirs.read_text())
        recs = [json.loads(x) for x in (ours / "metrics.jsonl").read_text().splitlines() if x.strip()]
        summary = json.loads((ours / "summary.json").read_text())
        a, b = recs[-1]["accuracy"], t["scores"]["accuracy"]
        diffs.append(100 * (a - b))
        # a round's training: fedpeft's rounds without an evaluation against the sum of OpenFedLLM's trainer calls
        ours_s = statistics.fmean([r["wall_seconds"] for r in recs if r["round"] > 0 and r["accuracy"] is None]
                                  or [r["wall_seconds"] for r in recs if r["round"] > 0])
        theirs_s = sum(t["client_train_seconds"]) / t["rounds"]
        gap = t.get("vs_fedpeft")
        # OpenFedLLM's trainers: max_steps of batch pairs, constant lr, DPOConfig's weight decay 0
        run = ran = t["settings"]
        budget = (f"{budget_cell([measured(ours)], device=True)} / {run['steps']} steps · "
                  f"{run['steps'] * run['batch']} ex. · lr {rate(run['lr'])} · wd 0 · cpu")
        gap_cell = (f" {gap['relative']:.1e}, {gap['max_abs']:.1e} |" if gap else " – |") if matched else ""
        rows.append(f"| {s} | {100 * a:.1f} | {100 * b:.1f} | {100 * (a - b):+.1f} | "
                    f"{summary.get('bytes_up_per_client_round', 0):,.0f} / {t['scores']['bytes_per_direction']:,} | "
                    f"{ours_s:.0f} / {theirs_s:.0f} ({ours_s / theirs_s:.2f}×) |{gap_cell} {budget} | "
                    f"n = {t['scores']['num_examples']} |")
    flag = " --matched-order" if matched else ""
    size = (f"{ran['rounds']} rounds of {ran['steps']} steps of {ran['batch']} pairs, lr {rate(ran['lr'])}, "
            f"β {ran['beta']}, single-turn pairs that fit {ran['max_length']} tokens uncut" if ran else
            "the launcher's rounds, steps, pairs, lr and β")
    what = ("the same pairs of each client and round in the same order and the same initial adapter on both sides "
            "(substitutions 6-7)" if matched else
            "OpenFedLLM's own data order (the same `random.seed(round)` subset for every client, its trainers' "
            "shuffle) and PEFT's own initial adapter")
    return [f"## Against OpenFedLLM's FedDPO{', data order and start matched' if matched else ''}", "",
            f"`{AUTHORS_REPO}` @ `{AUTHORS_COMMIT}`, `main_dpo.py` run unchanged by `python -m "
            f"benchmarks.feddpo_openfedllm CHECKOUT --out {root}/s<seed> --seed <seed>{flag}` (its substitutions, "
            "listed in that module's docstring: the data (fedpeft's clients' pairs), TRL 1.16's API for its TRL 0.7.2 "
            "calls with the base model as reference, a constant learning rate, CPU float32, the seed) beside "
            "fedpeft's `feddpo` at its settings: LoRA r 8 / alpha 16 on q_proj and v_proj, the 4 HH-RLHF subsets "
            f"as clients, all every round, {size} (read from the runs); {what}. Both final adapters are scored by "
            "fedpeft's DPO trainer on the same "
            "held-out pairs; bytes: fedpeft's counted messages up per client-round against the LoRA state dict each "
            "way; seconds: a round of training (fedpeft: a round without evaluation, its messages and aggregation "
            "included; OpenFedLLM: its four trainers' `train()` calls), both runs one after the other on one "
            "thread of the same machine.",
            "", "| seed | fedpeft reward acc. % | OpenFedLLM reward acc. % | Δ (points) | bytes up per client-round: "
            f"fedpeft / OpenFedLLM state dict | seconds per round: fedpeft / OpenFedLLM |{gap_head} budget / "
            "client-round: fedpeft (read from its run) / OpenFedLLM (its trainers' settings) | held-out pairs |",
            "|---|---|---|---|---|---|---|---|" + ("---|" if matched else ""), *rows, "",
            f"Paired difference over the seeds both ran, fedpeft − OpenFedLLM: {paired_cell(diffs)}."]


def render(args) -> Path:
    """``benchmarks/results/feddpo_openfedllm.md``: the matched runs' table (and the unmatched runs' where they
    are), under the notes file's text."""
    notes = args.notes.read_text().strip() if args.notes.exists() else ""
    lines = ["# fedpeft's federated DPO against OpenFedLLM's, on the same clients", "",
             *([notes, ""] if notes else []),
             *openfedllm_table(args.matched_dir, args.seeds, matched=True)]
    if any((args.unmatched_dir / f"s{s}" / "openfedllm.json").exists() for s in args.seeds):
        lines += ["", *openfedllm_table(args.unmatched_dir, args.seeds, matched=False)]
    return write_results(args.results, lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkout", type=Path, nargs="?", help=f"a checkout of {AUTHORS_REPO} at {AUTHORS_COMMIT}")
    p.add_argument("--out", type=Path, help="the run's folder (<runs>/s<seed>): fedpeft/, openfedllm/, the scores")
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
    p.add_argument("--matched-order", action="store_true",
                   help="substitutions 6-7: fedpeft's pairs of each client and round in its order, its initial adapter")
    p.add_argument("--render-only", action="store_true", help="rewrite the results file from the finished runs")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the seeds the results file reads")
    p.add_argument("--matched-dir", type=Path, default=Path("runs/openfedllm_matched"))
    p.add_argument("--unmatched-dir", type=Path, default=Path("runs/openfedllm"))
    p.add_argument("--results", type=Path, default=Path("benchmarks/results/feddpo_openfedllm.md"))
    p.add_argument("--notes", type=Path, default=Path("benchmarks/results/feddpo_openfedllm_notes.md"))
    args = p.parse_args(argv)
    if args.render_only:
        print(render(args))
        return
    if args.checkout is None or args.out is None:
        p.error("CHECKOUT and --out are needed to run (or --render-only)")
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
    _patch(args.checkout, clients, timings, b, matched_rounds(b, args.rounds) if args.matched_order else None)
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
    if args.matched_order and (args.out / "fedpeft" / "summary.json").exists():
        result["vs_fedpeft"] = adapter_gap(saved, args.out / "fedpeft", b, args.rounds)
    (args.out / "openfedllm.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result["scores"], indent=1))


if __name__ == "__main__":
    main()
