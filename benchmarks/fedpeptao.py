"""FedPepTAO against the baselines a personalised method must beat (benchmarks/results/fedpeptao.md).

MiniLM on SST-2 and AG News, 10 clients (label-skew Dirichlet alpha = 1), 3 per round, 20 rounds, warm-up 3,
seeds 0-4 paired (every arm of a (task, seed) shares the partition and the initial prompts). Test = the task's
dev/test set split among the clients like their training data; global and personalised accuracy (each client
with its own tensors on its own shard, pooled over the union of the shards) at the final round, round 0 and
every 10 rounds; per-client mean / worst / std; the per-client majority label (no model) as a reference row.
Paired differences against FedPepTAO with 95 % t-intervals. Score validity (--validity, after the runs): each
layer's leave-one-layer-out importance (accuracy drop when that layer's prompt is reset to its initial value
in the final global model) against its score, and the rank of the score-chosen layer subset among all subsets
of that size (the others reset).

    python benchmarks/fedpeptao.py --runs-dir runs/fedpeptao --workers 2         # resumable, any order of parts
    python benchmarks/fedpeptao.py --runs-dir runs/fedpeptao --arms core --seeds 0 1 2
    python benchmarks/fedpeptao.py --runs-dir runs/fedpeptao --render-only --validity
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

from runner import mean_std, run_config, run_pool

TOKENS = 8  # h: prompt rows per layer (the preset's)
ARMS: dict[str, dict[str, list[str]]] = {  # group -> label -> overrides (method.name first)
    "core": {
        "FedPepTAO (η 1e-3)": ["method.name=fedpeptao"],
        "FedPepTAO (η 0.05 ×0.99, authors' scripts)": ["method.name=fedpeptao", "method.aggregator.server_lr=0.05",
                                                      "method.aggregator.lr_decay=0.99"],
        "fedavg-prefix (all layers)": ["method.name=fedavg-prefix"],
        f"fedavg-prefix, byte-matched (h = {TOKENS // 2})": ["method.name=fedavg-prefix",
                                                             f"method.adapter.num_tokens={TOKENS // 2}"],
        "local-only": ["method.name=local-only"],
        "FedAvg + local fine-tuning (FT)": ["method.name=fedavg-ft"],
        "FedPer (top half private)": ["method.name=fedper"],
        "LG-FedAvg (bottom half private)": ["method.name=lg-fedavg"],
    },
    "orders": {
        "FedPepTAO, score on non-pad tokens": ["method.name=fedpeptao", "method.sharing.score_tokens=nonpad"],
        "FedPepTAO, ascending layers": ["method.name=fedpeptao", "method.sharing.order=ascending"],
        "FedPepTAO, descending layers": ["method.name=fedpeptao", "method.sharing.order=descending"],
        "FedPepTAO, random layers (seeded)": ["method.name=fedpeptao", "method.sharing.order=random"],
    },
    "ablations": {name: [f"method.name={name}"] for name in ("momd", "moms", "moms-con", "adamd", "moms-adamd")},
}
ALL_ARMS = {label: o for group in ARMS.values() for label, o in group.items()}
REFERENCE = "FedPepTAO (η 1e-3)"
TASKS = {"sst2": {"max_length": 64, "max_test": None}, "agnews": {"max_length": 64, "max_test": 1000}}


def slug(label: str) -> str:
    return "-".join("".join(ch if ch.isascii() and ch.isalnum() else " " for ch in label.lower()).split())


def job_name(task: str, label: str, seed: int) -> str:
    return f"{task}__{slug(label)}__s{seed}"


def overrides(args, task: str, label: str, seed: int) -> list[str]:
    t = TASKS[task]
    return [f"task.name={task}", f"task.max_train={args.max_train}", f"task.max_length={t['max_length']}",
            *([f"task.max_test={t['max_test']}"] if t["max_test"] else []), "model.name=minilm", f"seed={seed}",
            "federation.num_clients=10", "federation.clients_per_round=3", f"federation.rounds={args.rounds}",
            "federation.partition.scheme=dirichlet", "federation.partition.alpha=1.0",
            "federation.partition.min_size=8", f"evaluation.every={args.every}", "evaluation.batch_size=100",
            "runtime.progress=false", f"runtime.threads={args.threads}", *ALL_ARMS[label],
            f"method.adapter.num_tokens={TOKENS}" if "num_tokens" not in " ".join(ALL_ARMS[label]) else "",
            *(["method.sharing.warmup_rounds=3"] if "fedpeptao" in ALL_ARMS[label][0] else [])]


def run_job(args, task: str, label: str, seed: int) -> str:
    return run_config(Path(args.runs_dir) / job_name(task, label, seed),
                      [o for o in overrides(args, task, label, seed) if o])


# ---------------------------------------------------------------- reading runs


def personal(rec: dict, test_hist: list[list[int]]) -> float | None:
    """Accuracy over the union of the clients' test shards, each client scored with its own tensors."""
    acc = {int(c): a for c, a in rec["local_accuracy"].items() if a is not None and a == a}
    n = {c: sum(test_hist[c]) for c in acc}
    return sum(acc[c] * n[c] for c in acc) / sum(n.values()) if acc and sum(n.values()) else None


def majority(hist: dict) -> tuple[float, list[float]]:
    """Per-client majority training label (no model): pooled accuracy and per-client accuracies."""
    per, hits, total = [], 0, 0
    for train, test in zip(hist["train"], hist["test"]):
        if sum(test):
            top = max(range(len(train)), key=lambda k: train[k])
            per.append(test[top] / sum(test))
            hits, total = hits + test[top], total + sum(test)
    return hits / total, per


def load(out: Path) -> dict | None:
    if not (out / "summary.json").exists():
        return None
    summary = json.loads((out / "summary.json").read_text())
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    hist = summary["label_histograms"]
    last = recs[-1]
    per_client = [a for a in last["local_accuracy"].values() if a is not None and a == a]
    scored = [r for r in recs if r["accuracy"] is not None]
    ratios = [r["server"].get("server_step_ratio") for r in recs if r["server"].get("server_step_ratio")]
    return {"global": last["accuracy"], "personal": personal(last, hist["test"]),
            "initial": recs[0]["accuracy"] if recs[0]["round"] == 0 else None,
            "curve": [(r["round"], r["accuracy"], personal(r, hist["test"])) for r in scored],
            "client_mean": statistics.fmean(per_client), "client_min": min(per_client),
            "client_std": statistics.pstdev(per_client), "majority": majority(hist)[0],
            "up": summary["bytes_up_per_client_round"], "bytes": summary["bytes_up_total"] + summary["bytes_down_total"],
            "step_ratio": statistics.fmean(ratios) if ratios else None,
            "selected": [i for i, x in enumerate(last.get("server_vectors", {}).get("selected_layers", [])) if x]}


def t95(n: int) -> float:
    return {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}.get(n - 1, 1.96)


def paired(xs: list[float], ys: list[float]) -> str:
    """Mean paired difference x − y in points with a 95 % t-interval."""
    d = [100 * (x - y) for x, y in zip(xs, ys) if x is not None and y is not None]
    if len(d) < 2:
        return "–" if not d else f"{d[0]:+.1f}"
    m, half = statistics.fmean(d), t95(len(d)) * statistics.stdev(d) / math.sqrt(len(d))
    return f"{m:+.1f} [{m - half:+.1f}, {m + half:+.1f}]"


# ---------------------------------------------------------------- score validity


def validity(run_dir: Path) -> dict:
    """Leave-one-layer-out importance of the final global prompts and the rank of the selected subset."""
    import torch

    from fedpeft.backbones.classifier import evaluate
    from fedpeft.build import build
    from fedpeft.predict import adapter_params, load_run

    torch.set_num_threads(1)
    cfg, (_, server, clients, _) = load_run(run_dir)
    built = build(cfg)
    final = adapter_params(built.method, server, clients)
    init = built.method.initial_params()
    layers = sorted(int(k.split(".")[1]) for k in final if k.startswith("prefix."))
    clf, test = built.exp.classifier, built.exp.test_encoded

    def acc(keep: set[int]) -> float:
        params = {k: (v if not k.startswith("prefix.") or int(k.split(".")[1]) in keep else init[k])
                  for k, v in final.items()}
        return evaluate(clf, params, test, cfg.evaluation.batch_size)["accuracy"]

    full = acc(set(layers))
    loo = {layer: full - acc(set(layers) - {layer}) for layer in layers}
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scores = next((r["server_vectors"]["layer_scores"] for r in recs
                   if r.get("server_vectors", {}).get("layer_scores")), None)
    chosen = next((r["server_vectors"]["selected_layers"] for r in reversed(recs)
                   if r.get("server_vectors", {}).get("selected_layers")), None)
    chosen = [i for i, s in enumerate(chosen) if s] if chosen else None
    subsets = {}
    if chosen:
        for sub in itertools.combinations(layers, len(chosen)):
            subsets[sub] = acc(set(sub))
    rank = (1 + sum(a > subsets[tuple(chosen)] for a in subsets.values())) if chosen else None
    return {"full": full, "loo": loo, "scores": scores, "chosen": chosen, "rank": rank, "of": len(subsets),
            "best_subset": max(subsets, key=subsets.get) if subsets else None}


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return num / den if den else float("nan")


# ---------------------------------------------------------------- table


def render(args) -> Path:
    runs = Path(args.runs_dir)
    notes = Path(args.notes)
    lines = ["# FedPepTAO against personalisation baselines (MiniLM, CPU scale)", "",
             f"Rendered with: `python benchmarks/fedpeptao.py {' '.join(args.argv)}`", ""]
    if notes.exists():
        lines += [notes.read_text().strip(), ""]
    lines += [f"Setup: MiniLM (frozen, similarity readout), deep prompt h = {TOKENS} per layer (6 layers), client AdamW "
              f"lr 4e-2 wd 0.1, 2 local epochs, batch 8; 10 clients, label-skew Dirichlet α = 1, 3 clients per "
              f"round, {args.rounds} rounds, FedPepTAO selects r = 0.5 of the layers after round 3; train capped at "
              f"{args.max_train} examples (seeded, stratified), test = the full SST-2 dev set (872) / 1,000 AG News "
              "test examples, split among the clients like their training labels. Final round (never the best "
              "round). `personalised` pools every client's own test shard scored with the client's own tensors "
              "(= global for methods without private tensors); per-client columns are over the 10 clients. Paired "
              f"differences against {REFERENCE} in points with 95 % t-intervals over the seeds done.", ""]
    for task in args.tasks:
        lines += [f"## {task}", "", "| arm | seeds done | global % | personalised % | Δ personalised vs "
                  "FedPepTAO | per-client mean / worst / std % | round 0 % | upload B/client-round | "
                  "‖η m‖/‖w̄−w‖ |", "|---|---|---|---|---|---|---|---|---|"]
        ref = {s: load(runs / job_name(task, REFERENCE, s)) for s in args.seeds}
        majority_rows = []
        for label in args.arm_labels:
            done = {s: r for s in args.seeds if (r := load(runs / job_name(task, label, s)))}
            if not done:
                lines.append(f"| {label} | 0/{len(args.seeds)} | – | – | – | – | – | – | – |")
                continue
            rs = list(done.values())
            majority_rows += [(s, r["majority"]) for s, r in done.items()]
            diff = "–" if label == REFERENCE else paired(
                [done[s]["personal"] for s in done if ref.get(s)], [ref[s]["personal"] for s in done if ref.get(s)])
            ratio = [r["step_ratio"] for r in rs if r["step_ratio"] is not None]
            lines.append(
                f"| {label} | {len(rs)}/{len(args.seeds)} | {mean_std([r['global'] for r in rs])} | "
                f"{mean_std([r['personal'] for r in rs])} | {diff} | {mean_std([r['client_mean'] for r in rs])} / "
                f"{mean_std([r['client_min'] for r in rs])} / {mean_std([r['client_std'] for r in rs])} | "
                f"{mean_std([r['initial'] for r in rs])} | {statistics.fmean(r['up'] for r in rs):,.0f} | "
                f"{f'{statistics.fmean(ratio):.2g}' if ratio else '–'} |")
        maj = dict(majority_rows)
        if maj:
            lines.append(f"| per-client majority label (no model; reference) | {len(maj)} seeds | – | "
                         f"{mean_std(list(maj.values()))} | – | – | – | 0 | – |")
        sel = {s: r["selected"] for s, r in ref.items() if r and r.get("selected") is not None}
        if sel:
            lines += ["", f"Layers FedPepTAO shares after selection, per seed: {sel}."]
        lines.append("")
        if args.validity:
            lines += validity_section(runs, task, args)
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out


def validity_section(runs: Path, task: str, args) -> list[str]:
    lines = [f"### What the layer score measures ({task}, {REFERENCE}, seeds {args.validity_seeds})", "",
             "| seed | score per layer | leave-one-layer-out drop per layer (points) | Spearman(score, drop) | "
             "chosen layers | rank of the chosen subset (accuracy with only it trained) | best subset |",
             "|---|---|---|---|---|---|---|"]
    for s in args.validity_seeds:
        run = runs / job_name(task, REFERENCE, s)
        if not (run / "summary.json").exists():
            lines.append(f"| {s} | (run not finished) | | | | | |")
            continue
        cache = run / "validity.json"
        if not cache.exists():
            v = validity(run)
            v["loo"] = {str(k): x for k, x in v["loo"].items()}
            cache.write_text(json.dumps(v))
        v = json.loads(cache.read_text())
        drops = [v["loo"][k] for k in sorted(v["loo"], key=int)]
        rho = spearman(v["scores"], drops) if v["scores"] else float("nan")
        lines.append(f"| {s} | {[round(x, 3) for x in v['scores'] or []]} | {[round(100 * d, 1) for d in drops]} | "
                     f"{rho:.2f} | {v['chosen']} | {v['rank']} of {v['of']} | {v['best_subset']} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs-dir", default="runs/fedpeptao")
    p.add_argument("--results", default=str(Path(__file__).parent / "results" / "fedpeptao.md"))
    p.add_argument("--notes", default=str(Path(__file__).parent / "results" / "fedpeptao_notes.md"))
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="groups of arms to run")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--validity-seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--max-train", type=int, default=600)
    p.add_argument("--every", type=int, default=10, help="evaluate every k rounds (and round 0, the last)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--validity", action="store_true", help="compute the score-validity table (after the runs)")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.arm_labels = [label for group in args.arms for label in ARMS[group]]
    if REFERENCE not in args.arm_labels:
        args.arm_labels.insert(0, REFERENCE)
    if not args.render_only:  # seeds outermost: every finished seed pairs all arms
        jobs = [(args, t, label, s) for s in args.seeds for t in args.tasks for label in args.arm_labels]
        run_pool(run_job, jobs, args.workers)
    print(f"wrote {render(args)}")


if __name__ == "__main__":
    main()
