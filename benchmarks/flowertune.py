"""fedpeft against Flower's FlowerTune LLM template (benchmarks/results/flowertune.md): seconds per round, peak
memory and the training loss of the same federated LoRA fine-tuning, run three ways on this machine.

- **FlowerTune template**: the client and server of ``examples/flowertune-llm`` in adap/flower (fetched
  2026-03-29), run in Flower's simulation: every train message loads the model, wraps it with PEFT
  (``get_peft_model``), sets the received LoRA state, trains with TRL's ``SFTTrainer`` (``max_steps``, constant
  learning rate) and replies ``get_peft_model_state_dict``; the server is ``flwr.serverapp.strategy.FedAvg``.
  Ported to today's TRL (1.x, ``SFTConfig``; the template pins trl 0.8) without 4-bit quantization (CPU), LoRA
  dropout 0, and fed the token ids fedpeft encodes (chat template, completion-only loss), so that both sides
  train on the same tokens with the same LoRA (r 16, alpha 32, all-linear), AdamW, learning rate, batch and steps,
  in float32 without activation checkpointing (TRL 1.x turns on bf16 autocast and checkpointing by default; bf16
  autocast on a CPU without bf16 matrix units made a step about 15 times slower here).
- **fedpeft embedded** and **fedpeft on flower-sim**: the ``fedit`` preset with the same settings.

Seconds per round: the wall time of a round without evaluation (fedpeft: ``wall_seconds - eval_seconds`` of its
records; the template: between the strategy's per-round callbacks). Peak memory: the largest resident set of the
whole process tree (the driver, Ray and its actors), sampled every 0.2 s. Clients train in parallel on Flower (one
actor per client, one thread each), one after another embedded (all threads).

Repetitions (``--reps``): the arms run in order, then in reverse order, and so on, so that drifts of the shared
machine's load hit every arm alike; each repetition's speed-up is the template's seconds per round over the arm's,
both of that repetition, and the table gives their median and range (with one repetition, that one).

    python -m benchmarks.flowertune                 # CPU: 2 clients, 3 rounds of 4 steps, batch 4
    python -m benchmarks.flowertune --reps 3        # the arms three times, in alternating order
    python -m benchmarks.flowertune --render-only   # rewrite the table from the saved measurements
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


class PeakRSS:
    """The largest summed resident set of this process and all its descendants, sampled in a thread."""

    def __init__(self, interval: float = 0.2) -> None:
        import psutil

        self.root, self.interval, self.peak = psutil.Process(), interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        import psutil

        total = 0
        for p in [self.root, *self.root.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def fedpeft_overrides(args, runtime: str, extra: tuple[str, ...] = ()) -> list[str]:
    return ["task.name=webnlg", f"task.max_train={args.train_per_category}", "task.max_test=1",
            "task.max_length=256", "model.name=smollm2", "method.name=fedit", f"seed={args.seed}",
            f"federation.num_clients={args.clients}", "federation.partition.scheme=iid",
            f"federation.rounds={args.rounds}", f"method.trainer.max_steps={args.steps}",
            f"method.trainer.batch_size={args.batch}", f"method.trainer.lr={args.lr}",
            "method.trainer.local_epochs=100",
            "evaluation.round_zero=false", "evaluation.local=false", f"evaluation.every={args.rounds}",
            "evaluation.generate_every=0",  # a timing run: no decoding (its seconds are subtracted anyway)
            "runtime.progress=false", f"runtime.name={runtime}",
            f"runtime.threads={args.threads if runtime == 'embedded' else 1}", *extra]


def run_fedpeft(args, runtime: str, out: Path, extra: tuple[str, ...] = ()) -> dict:
    from fedpeft.resolve import load_config
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.runtime.flower.simulation import run_flower_sim
    from fedpeft.tracking.rundir import RunDir

    cfg = load_config(None, fedpeft_overrides(args, runtime, extra))
    with PeakRSS() as mem:
        start = time.perf_counter()
        (run_embedded if runtime == "embedded" else run_flower_sim)(cfg, out)
        total = time.perf_counter() - start
    recs = RunDir(out).read_metrics()
    return {"round_seconds": [r["wall_seconds"] - (r.get("eval_seconds") or 0.0) for r in recs],
            "train_loss": [sum(c["train_loss"] for c in r["clients"]) / len(r["clients"]) for r in recs],
            "bytes_up": [r["bytes_up"] for r in recs], "peak_rss": mem.peak, "total_seconds": total}


# ---------------------------------------------------------------- the FlowerTune template, ported


def completion_mask(enc, i: int) -> list[int]:
    """TRL's ``completion_mask`` of encoded row ``i``: 1 on the response tokens, as fedpeft scores them."""
    start = int(enc.response_start[i])
    return [0] * start + [1] * (len(enc.input_ids[i]) - start)


def write_client_data(args, folder: Path) -> None:
    """Each client's training rows exactly as fedpeft encodes them: input ids and the completion (response) mask."""
    from fedpeft.experiment import build_experiment
    from fedpeft.resolve import load_config

    exp = build_experiment(load_config(None, fedpeft_overrides(args, "embedded")))
    for k in range(exp.num_clients):
        enc = exp.client(k).train
        rows = [{"input_ids": list(enc.input_ids[i]), "completion_mask": completion_mask(enc, i)}
                for i in range(len(enc))]
        (folder / f"client_{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def get_model(model_dir: str, r: int, alpha: float):
    """The template's ``models.get_model``: the base model, then PEFT's LoRA (no bitsandbytes on CPU)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def cosine_annealing(current_round: int, total_round: int, lrate_max: float, lrate_min: float) -> float:
    """The template's learning rate per round (constant here: max = min = the fedit learning rate)."""
    return lrate_min + 0.5 * (lrate_max - lrate_min) * (1 + math.cos(math.pi * current_round / total_round))


def peer_apps(args, data_dir: Path, model_dir: str, stamps: list, losses: list):
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:  # the template's client_app.train
        import torch
        from datasets import Dataset
        from peft import get_peft_model_state_dict, set_peft_model_state_dict
        from trl import SFTConfig, SFTTrainer

        torch.set_num_threads(1)
        cfg = msg.content["config"]
        pid = context.node_config["partition-id"]
        rows = [json.loads(line) for line in (Path(cfg["data_dir"]) / f"client_{pid}.jsonl").read_text().splitlines()]
        trainset = Dataset.from_list(rows)
        model = get_model(cfg["model_dir"], int(cfg["r"]), float(cfg["alpha"]))
        set_peft_model_state_dict(model, msg.content["arrays"].to_torch_state_dict())
        lr = cosine_annealing(int(cfg["server-round"]), int(cfg["rounds"]), float(cfg["lr"]), float(cfg["lr"]))
        targs = SFTConfig(output_dir=str(Path(cfg["data_dir"]) / f"out_{pid}"), learning_rate=lr,
                          per_device_train_batch_size=int(cfg["batch"]), max_steps=int(cfg["steps"]),
                          lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[],
                          max_length=256, completion_only_loss=True, seed=int(cfg["seed"]) + pid,
                          use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                          bf16=False, gradient_checkpointing=False)  # fedpeft's precision and activations
        trainer = SFTTrainer(model=model, args=targs, train_dataset=trainset)
        results = trainer.train()
        content = RecordDict({"arrays": ArrayRecord(get_peft_model_state_dict(model)),
                              "metrics": MetricRecord({"train_loss": results.training_loss,
                                                       "num-examples": len(trainset)})})
        return Message(content=content, reply_to=msg)

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:  # the template's server_app.main
        from peft import get_peft_model_state_dict

        init = get_model(model_dir, args.r, args.alpha)
        arrays = ArrayRecord(get_peft_model_state_dict(init))
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=args.clients,
                          min_available_nodes=args.clients)

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            stamps.append(time.perf_counter())
            return MetricRecord()

        result = strategy.start(
            grid=grid, initial_arrays=arrays, num_rounds=args.rounds, evaluate_fn=evaluate,
            train_config=ConfigRecord({"data_dir": str(data_dir), "model_dir": model_dir, "r": args.r,
                                       "alpha": args.alpha, "lr": args.lr, "rounds": args.rounds,
                                       "batch": args.batch, "steps": args.steps, "seed": args.seed}))
        for r in range(1, args.rounds + 1):
            losses.append(result.train_metrics_clientapp[r]["train_loss"])

    return server, client


def run_peer(args) -> dict:
    from flwr.simulation import run_simulation

    from fedpeft.backbones.loading import user_cache_dir

    model_dir = str(user_cache_dir() / "smollm2-135m-instruct")  # the safetensors copy fedpeft makes once
    stamps: list[float] = []
    losses: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        write_client_data(args, Path(tmp))
        server, client = peer_apps(args, Path(tmp), model_dir, stamps, losses)
        backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                   "init_args": {"num_cpus": args.clients, "include_dashboard": False}}
        with PeakRSS() as mem:
            start = time.perf_counter()
            run_simulation(server_app=server, client_app=client, num_supernodes=args.clients,
                           backend_config=backend)
            total = time.perf_counter() - start
    return {"round_seconds": [b - a for a, b in zip(stamps, stamps[1:])], "train_loss": losses,
            "peak_rss": mem.peak, "total_seconds": total}


# ---------------------------------------------------------------- table


ARMS = {"fedpeft embedded": ("embedded", ()), "fedpeft on flower-sim": ("flower-sim", ()),
        "fedpeft embedded, padding-free": ("embedded", ("runtime.padding_free=true",)),
        "FlowerTune template (TRL SFTTrainer) on flower-sim": ("peer", ())}


PEER = "FlowerTune template (TRL SFTTrainer) on flower-sim"


def later_mean(run: dict) -> float:
    """Seconds per round of one run, the first round (the simulation's actors starting) left out."""
    xs = run["round_seconds"][1:] or run["round_seconds"]
    return sum(xs) / len(xs)


def repetitions(results: dict) -> dict[str, list[dict]]:
    """Each arm's runs, one per repetition (a file of one run per arm, as written before ``--reps``, is one)."""
    return {arm: runs if isinstance(runs, list) else [runs] for arm, runs in results.items()}


def render(args, results: dict) -> Path:
    reps = repetitions(results)
    peer = reps.get(PEER)
    lines = ["# fedpeft against Flower's FlowerTune LLM template", "",
             (Path(args.notes).read_text() if Path(args.notes).exists() else ""), "",
             f"Command: `python -m benchmarks.flowertune --clients {args.clients} --rounds {args.rounds} --steps "
             f"{args.steps} --batch {args.batch} --train-per-category {args.train_per_category}` on this machine's CPU "
             f"({os.cpu_count()} cores). "
             f"SmolLM2-135M-Instruct, WebNLG training entries ({args.train_per_category} per category, split IID over "
             f"{args.clients} clients), LoRA r {args.r} / alpha {args.alpha} on all linear layers, AdamW lr {args.lr}, "
             f"{args.rounds} rounds of {args.steps} steps of batch {args.batch}, every client every round; "
             f"{max(map(len, reps.values()), default=0)} repetition(s), the arms in alternating order.", "",
             "| arm | s / round (median over repetitions of the mean of rounds 2+; each repetition's rounds) | "
             "speed-up vs template (median, range over repetitions) | peak RSS (GB) | train loss per round |",
             "|---|---|---|---|---|"]
    for arm in ARMS:
        runs = reps.get(arm)
        if not runs:
            lines.append(f"| {arm} | not run | | | |")
            continue
        per_rep = [later_mean(r) for r in runs]
        if peer:
            speed = [later_mean(p) / later_mean(r) for p, r in zip(peer, runs)]
            spread = f" ({min(speed):.2f}–{max(speed):.2f})" if len(speed) > 1 else ""
            cell = f"{statistics.median(speed):.2f}×{spread}"
        else:
            cell = "–"
        rounds = "; ".join(", ".join(f"{x:.0f}" for x in r["round_seconds"]) for r in runs)
        lines.append(f"| {arm} | {statistics.median(per_rep):.1f} ({rounds}) | {cell} | "
                     f"{max(r['peak_rss'] for r in runs) / 1e9:.2f} | "
                     f"{', '.join(f'{x:.3f}' for x in runs[-1]['train_loss'])} |")
    out = Path(args.results)
    out.write_text("\n".join(lines) + "\n")
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--train-per-category", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the embedded run")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), metavar="ARM")
    p.add_argument("--reps", type=int, default=1, help="repetitions of the arms, in alternating order")
    p.add_argument("--runs-dir", default="runs/flowertune")
    p.add_argument("--results", default=str(RESULTS / "flowertune.md"))
    p.add_argument("--notes", default=str(RESULTS / "flowertune_notes.md"))
    p.add_argument("--render-only", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    saved = Path(args.runs_dir) / "measurements.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    if not args.render_only:
        Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
        fresh: dict[str, list[dict]] = {arm: [] for arm in args.arms}
        for rep in range(args.reps):
            for arm in args.arms if rep % 2 == 0 else args.arms[::-1]:
                kind, extra = ARMS[arm]
                if kind == "peer":
                    run = run_peer(args)
                else:
                    out = Path(args.runs_dir) / "".join(ch if ch.isalnum() else "-" for ch in arm.lower())
                    shutil.rmtree(out, ignore_errors=True)  # a timing run starts afresh
                    run = run_fedpeft(args, kind, out, extra)
                fresh[arm].append(run)
                results[arm] = fresh[arm]
                saved.write_text(json.dumps(results, indent=1))
                print(arm, rep, json.dumps(run), flush=True)
    print(f"wrote {render(args, results)}")


if __name__ == "__main__":
    main()
