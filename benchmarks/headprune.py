"""Head pruning for federated LoRA (benchmarks/results/headprune.md): MiniLM + LoRA r = 16 on q/k/v with a
linear task head (Eq. 5), many clients with few per round, IID and Dirichlet label skew, >= 3 paired seeds.

Arms (the paper's Table 1 plus an ablation): B1 dense FedAvg with random / loss selection; B2 random heads
pruned (s = 0.9) + FedAvg with random / loss selection; ours (importance pruning + Eq. 8) with random / loss
selection; ours at s = 0.5; importance pruning with plain FedAvg (separates pruning from Eq. 8). All arms of
a (task, partition, seed) share the partition and the initial adapter. Reported: final-round accuracy
(never the best round), per-round curves, upload bytes per client-round, analytic OPs per sequence (paper
and clean mode), rounds to a target fixed before the runs (95 % of B1-random's final accuracy of the same
seed), the majority-class and per-client majority baselines with the test set's standard error, each arm's
budget per client-round and its paired difference from B1-random with a 95 % t-interval.

    python -m benchmarks.headprune --runs-dir runs/headprune --workers 2        # CPU, resumable
    python -m benchmarks.headprune --runs-dir runs/headprune --render-only      # rewrite the table

Every run is a fedpeft run directory under --runs-dir; finished runs are skipped, interrupted ones resumed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks.budget import budget_cell, measured, mixed_pairs
from benchmarks.grids import load_grid
from benchmarks.lora_family import majorities
from benchmarks.runner import grid_parser, parse_grid_args, run_config, run_grid, write_results
from benchmarks.stats import accuracy_se, mean_std, paired_cell

GRID = load_grid("headprune")
ARMS = GRID["arms"]
TASKS = GRID["tasks"]
PARTITIONS = GRID["partitions"]
REFERENCE = "B1 FedAvg, random CS"  # the arm every other is paired with (the Δ column, the rounds-to-target target)
CONTRASTS = [(c["arm"], c["reference"]) for c in GRID["contrasts"]]  # the paper's claims, paired by seed


def job_name(task: str, part: str, arm: str, seed: int) -> str:
    slug = "".join(ch if ch.isalnum() else "-" for ch in arm.lower()).strip("-")
    return f"{task}__{part}__{slug}__s{seed}"


def overrides(args, task: str, part: str, arm: str, seed: int) -> list[str]:
    return [f"task.name={task}", f"task.max_train={args.max_train}", f"task.max_test={args.max_test}",
            f"task.max_length={TASKS[task]['max_length']}", "model.name=minilm", "model.readout=linear",
            f"seed={seed}", f"federation.num_clients={args.clients}", f"federation.clients_per_round={args.per_round}",
            f"federation.rounds={args.rounds}", "method.adapter.r=16", f"method.trainer.lr={args.lr}",
            f"method.trainer.batch_size={args.batch}", "evaluation.local=false", "evaluation.batch_size=128",
            "runtime.progress=false", f"runtime.threads={args.threads}", f"runtime.device={args.device}",
            *PARTITIONS[part], *ARMS[arm]]


def plan(args) -> list[tuple[str, str, str, int]]:
    return [(t, part, arm, s) for s in args.seeds for t in args.tasks for part in args.partitions for arm in args.arms]


def contrasts(args) -> list[tuple[str, str, list[str], list[str]]]:
    """(arm, reference, the arm's overrides, the reference's) of every paired contrast the results file reads (each
    arm against B1-random, on the first task and partition: a budget does not depend on them), for the budget test
    over the grids."""
    one = lambda arm: overrides(args, args.tasks[0], args.partitions[0], arm, 0)  # noqa: E731
    pairs = [(arm, REFERENCE) for arm in args.arms if arm != REFERENCE] + CONTRASTS
    return [(arm, ref, one(arm), one(ref)) for arm, ref in pairs if arm in args.arms and ref in args.arms]


def run_job(args, task: str, part: str, arm: str, seed: int) -> str:
    return run_config(Path(args.runs_dir) / job_name(task, part, arm, seed), overrides(args, task, part, arm, seed))


def step_time(args) -> dict:
    """Seconds per local training step of one client at s = 0.9, its pruned heads masked (computed, output
    zeroed) vs physically pruned (not computed), interleaved in one process; the same kept heads for both."""
    import torch

    from fedpeft.build import build
    from fedpeft.resolve import load_config
    from fedpeft.trainers.gradient import train_local

    torch.set_num_threads(args.threads)
    cfg = load_config(None, overrides(args, "mnli", "iid", "Ours s=0.9, loss CS", 0))
    b = build(cfg)
    method, client = b.method, b.exp.client(0)
    start = method.initial_params()
    inst = method.configure_round(method.server_init(), 1, [0])[0]
    times: dict[str, list[float]] = {"masked": [], "pruned": []}
    for rep in range(args.step_reps + 1):
        for mode in times:
            method.sharing.settings = method.sharing.settings.model_copy(update={"mode": mode})
            plan = method.sharing.plan(start, inst, client, 1)
            t0 = time.perf_counter()
            res = train_local(b.exp.objective, plan.get("params", start), client.train, "adamw",
                              method.trainer.settings, torch.Generator().manual_seed(rep), None, plan["frozen"],
                              plan["static"])
            if rep:  # the first repetition warms up
                times[mode].append((time.perf_counter() - t0) / res.steps)
    return {m: statistics.median(t) for m, t in times.items()} | {"reps": args.step_reps, "threads": args.threads,
                                                                   "device": args.device, "examples": len(client.train)}


# ---------------------------------------------------------------- the results file


def _load(out: Path) -> dict | None:
    if not (out / "summary.json").exists():
        return None
    recs = [r for r in (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
            if r["round"] > 0]  # round 0 (the initial state) is not a training round
    clients = [c for r in recs for c in r["clients"] if c["status"] == "ok"]
    mean = lambda key: statistics.fmean(c[key] for c in clients) if clients and key in clients[0] else None  # noqa
    summary = json.loads((out / "summary.json").read_text())
    return {"acc": [r["accuracy"] for r in recs], "final": recs[-1]["accuracy"],
            "up": summary["bytes_up_per_client_round"], "tensor_up": summary.get("upload_tensor_bytes"),
            "ops_paper": mean("gops_seq_paper"), "ops_clean": mean("gops_seq_clean"),
            "kept": mean("kept_heads"), "wall": summary["wall_seconds"], "budget": measured(out)}


def histograms(out: Path) -> dict[str, list[list[int]]]:
    """Per client, training and test examples per class of the run in ``out`` (its summary.json predates
    ``label_histograms``): the seeded partition of its config, rebuilt from the data without the model."""
    import numpy as np

    from fedpeft.data import label_histogram, load_task
    from fedpeft.experiment import split_clients
    from fedpeft.resolve import load_config

    cfg = load_config(out / "config.yaml")
    task = load_task(cfg.task, cfg.seed, cfg.federation.partition.column)
    train, test, _ = split_clients(task, cfg)
    labels = lambda examples: np.array([e.label for e in examples])  # noqa: E731
    return {"train": label_histogram(labels(task.train), train, task.num_classes).tolist(),
            "test": label_histogram(labels(task.test), test, task.num_classes).tolist()}


def paired(done: dict[int, dict], ref: dict[int, dict | None]) -> str:
    """The paired cell of arm − reference on the final accuracy in points over the seeds both finished, with the
    pairs that mix devices counted."""
    both = [s for s in done if ref.get(s)]
    return paired_cell([(done[s]["final"] - ref[s]["final"]) * 100 for s in both],
                       mixed_pairs({s: done[s]["budget"].device for s in both},
                                   {s: ref[s]["budget"].device for s in both}))


def _contrasts(runs: Path, task: str, part: str, args) -> list[str]:
    """The grid's contrasts (``CONTRASTS``): arm − reference on the final accuracy, paired by seed."""
    rows = []
    for arm, ref in CONTRASTS:
        if arm in args.arms and ref in args.arms:
            load = lambda a: {s: _load(runs / job_name(task, part, a, s)) for s in args.seeds}  # noqa: E731
            done = {s: r for s, r in load(arm).items() if r}
            rows.append(f"| {arm} − {ref} | {paired(done, load(ref))} |")
    return ["The paper's claims, paired by seed (final accuracy, points; mean [95 % CI], n seeds):", "",
            "| arm − reference | Δ |", "|---|---|", *rows, ""] if rows else []


def majority(task: str, args) -> tuple[float, int]:
    from fedpeft.data import load_task
    from fedpeft.resolve import load_config

    cfg = load_config(None, [f"task.name={task}", f"task.max_test={args.max_test}", f"task.max_train={args.max_train}"])
    t = load_task(cfg.task, 0)
    labels = [e.label for e in t.test]
    return max(labels.count(c) for c in set(labels)) / len(labels), len(labels)


def render(args) -> Path:
    runs = Path(args.runs_dir)
    lines = ["# Head pruning for federated LoRA: MiniLM at CPU/GPU scale", "",
             f"Rendered with: `python -m benchmarks.headprune {' '.join(args.argv)}`", "",
             f"Setup: MiniLM (6 layers x 12 heads = 72 heads, d = 384) with LoRA r = 16 (alpha 32) on query/key/value "
             f"and a linear task head (trained, exchanged, Eq. 5); {args.clients} clients, {args.per_round} per round, "
             f"{args.rounds} rounds; AdamW lr {args.lr}, batch {args.batch}, one local epoch, fresh each round; "
             f"train capped at {args.max_train}, test at {args.max_test} examples (the same test set for every arm). "
             f"Accuracy is the final round's global test accuracy (never the best round), mean ± std over seeds "
             f"{args.seeds} (paired: same partition and initial adapter across arms). Upload = real codec bytes per "
             f"client-round (float32); OPs = analytic G MACs per training sequence at the local data's mean length.",
             "",
             "Δ: the arm's final accuracy minus B1-random's of the same seed, mean [95 % t-interval] over the seeds "
             "both finished (n; pairs whose runs ran on two devices counted). Budget: the mean local steps and "
             "examples a client-round trained on, the learning rates (LoRA, task head), the weight decay and the "
             "device of the finished runs.", ""]
    if args.notes and Path(args.notes).exists():
        lines += [Path(args.notes).read_text().strip(), ""]
    for task in args.tasks:
        maj, n = majority(task, args)
        lines += [f"## {task} (test n = {n}; standard error of one accuracy ≤ {accuracy_se(n):.1f} points; majority "
                  f"class {maj * 100:.1f} %)", ""]
        for part in args.partitions:
            base = {s: _load(runs / job_name(task, part, REFERENCE, s)) for s in args.seeds}
            lines += [f"### {part}", "", *_per_client_majority(runs, task, part, args.seeds),
                      "| arm | seeds done | final acc % | Δ vs B1-random, paired | rounds to target | upload "
                      "B/client-round | G OPs/seq paper | G OPs/seq clean | kept heads | budget / client-round |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            curves = {}
            for arm in ARMS:
                res = {s: _load(runs / job_name(task, part, arm, s)) for s in args.seeds}
                done = {s: r for s, r in res.items() if r}
                reach = []
                for s, r in done.items():
                    if base.get(s):
                        target = 0.95 * base[s]["final"]
                        reach.append(next((i + 1 for i, a in enumerate(r["acc"]) if a >= target), None))
                reach_txt = ", ".join("–" if x is None else str(x) for x in reach) or "–"
                first = next(iter(done.values()), None)
                delta = "0" if arm == REFERENCE else paired(done, base)
                lines.append(f"| {arm} | {len(done)}/{len(args.seeds)} | "
                             f"{mean_std([r['final'] for r in done.values()])} | {delta} | {reach_txt} | "
                             f"{statistics.fmean(r['up'] for r in done.values()):,.0f} | "
                             f"{first['ops_paper'] or 0:.3f} | {first['ops_clean'] or 0:.3f} | "
                             f"{first['kept'] or 0:.0f} | "
                             f"{budget_cell([r['budget'] for r in done.values()], device=True)} |"
                             if first else f"| {arm} | 0/{len(args.seeds)} |" + " – |" * 8)
                if done:
                    curves[arm] = [statistics.fmean(r["acc"][i] for r in done.values())
                                   for i in range(min(len(r["acc"]) for r in done.values()))]
            lines += ["", *_contrasts(runs, task, part, args), "Mean accuracy per round (%):", "",
                      "| arm | " + " | ".join(str(i + 1) for i in range(args.rounds)) + " |",
                      "|---|" + "---|" * args.rounds]
            for arm, c in curves.items():
                lines.append(f"| {arm} | " + " | ".join(f"{a * 100:.1f}" for a in c) + " |")
            lines.append("")
    timing = Path(args.runs_dir) / "step_time.json"
    if timing.exists():
        t = json.loads(timing.read_text())
        lines += ["## Local step time, masked vs physically pruned heads (s = 0.9, MNLI client 0, one run)", "",
                  f"`python -m benchmarks.headprune --step-time --device {t['device']} --threads {t['threads']}`: "
                  f"median over {t['reps']} local epochs of {t['examples']} examples (batch {args.batch}) after a "
                  f"warm-up, the two modes interleaved.", "",
                  "| masked: pruned heads computed, output zeroed | physically pruned: not computed | ratio |",
                  "|---|---|---|", f"| {t['masked'] * 1000:.1f} ms/step | {t['pruned'] * 1000:.1f} ms/step | "
                  f"{t['masked'] / t['pruned']:.2f}× |", ""]
    return write_results(args.results, lines)


def _per_client_majority(runs: Path, task: str, part: str, seeds: list[int]) -> list[str]:
    """The per-client majority baseline of a partition (each client predicts its training shard's majority label on
    its own test shard, pooled; no model), mean ± std over the seeds whose B1-random run finished."""
    outs = [out for s in seeds if ((out := runs / job_name(task, part, REFERENCE, s)) / "summary.json").exists()]
    if not outs:
        return []
    per_client = [majorities(histograms(out))[1] for out in outs]
    return [f"Per-client majority (no model; each client predicts its training shard's majority label on its own "
            f"test shard, pooled): {mean_std(per_client)} % ({len(outs)} seeds), a personalised reference: the "
            "accuracies below are the global model's on the whole test set.", ""]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = grid_parser("headprune", __doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--partitions", nargs="+", default=list(PARTITIONS), choices=list(PARTITIONS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), metavar="ARM")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--per-round", type=int, default=5)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--max-train", type=int, default=6000)
    p.add_argument("--max-test", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--step-time", action="store_true",
                   help="measure masked vs physically pruned step time, then render")
    p.add_argument("--step-reps", type=int, default=5)
    return parse_grid_args(p, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.step_time:
        Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.runs_dir) / "step_time.json").write_text(json.dumps(step_time(args), indent=1))
        args.render_only = True  # measured: now only render
    run_grid(args, run_job, plan(args), render)


if __name__ == "__main__":
    main()
