"""FedPepTAO against the baselines a personalised method must beat (benchmarks/results/fedpeptao.md).

MiniLM on SST-2 and AG News, 10 clients (label-skew Dirichlet alpha = 1), 3 per round, 20 rounds, warm-up 3,
seeds 0-4 paired (every arm of a (task, seed) shares the partition and the initial prompts). Test = the task's
dev/test set split among the clients like their training data; global and personalised accuracy (each client
with its own tensors on its own shard, pooled over the union of the shards) at the final round, round 0 and
every 10 rounds; per-client mean / worst / std; the per-client majority label (no model) as a reference row.
Paired differences against FedPepTAO (global and personalised, and the majority reference) with 95 % t-intervals;
each arm's budget per client-round.
Arms (``--arms``): core (FedPepTAO at the paper's η and the authors' scripts' schedule, fedavg-prefix and its
byte-matched half-length variant, local-only, FedAvg + FT, FedPer, LG-FedAvg), orders (score on non-pad tokens,
ascending, descending, three seeded random draws) and ablations (momd, moms, moms-con, moms-adamd at both η,
FedPepTAO without control variates; adamd is fedavg-prefix's exact config and is not run twice).
Score validity (computed as each --validity-seeds fedavg-prefix run finishes, rendered with --validity): on that
seed's fedavg-prefix final global model, where every layer trained equally, each layer's leave-one-layer-out drop
(its prompt reset to the initial value) against FedPepTAO's round-3 scores, and the rank of each order's subset
among all 20 three-layer subsets (the others reset).

    python -m benchmarks.fedpeptao --runs-dir runs/fedpeptao --workers 2         # resumable, any order of parts
    python -m benchmarks.fedpeptao --runs-dir runs/fedpeptao --arms core --seeds 0 1 2
    python -m benchmarks.fedpeptao --runs-dir runs/fedpeptao --render-only --validity
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from pathlib import Path

from benchmarks.budget import budget_cell, measured, mixed_pairs
from benchmarks.grids import load_grid
from benchmarks.runner import finished, grid_parser, parse_grid_args, run_config, run_grid, write_results
from benchmarks.stats import accuracy_se, mean_std, paired_cell

GRID = load_grid("fedpeptao")
TOKENS, SCRIPT_LR, ARMS = GRID["tokens"], GRID["script_lr"], GRID["arms"]  # ARMS: group -> label -> overrides
ALL_ARMS = {label: o for group in ARMS.values() for label, o in group.items()}
REFERENCE = "FedPepTAO (η 1e-3)"
TASKS = GRID["tasks"]


def slug(label: str) -> str:
    return "-".join("".join(ch if ch.isascii() and ch.isalnum() else " " for ch in label.lower()).split())


def job_name(task: str, label: str, seed: int) -> str:
    return f"{task}__{slug(label)}__s{seed}"


def overrides(args, task: str, label: str, seed: int) -> list[str]:
    t = TASKS[task]
    max_test = args.max_test or t["max_test"]
    return [o for o in [f"task.name={task}", f"task.max_train={args.max_train}", f"task.max_length={t['max_length']}",
            *([f"task.max_test={max_test}"] if max_test else []), "model.name=minilm", f"seed={seed}",
            "federation.num_clients=10", "federation.clients_per_round=3", f"federation.rounds={args.rounds}",
            "federation.partition.scheme=dirichlet", "federation.partition.alpha=1.0",
            "federation.partition.min_size=8", f"evaluation.every={args.every}", "evaluation.batch_size=100",
            "evaluation.report=false",
            "runtime.progress=false", f"runtime.threads={args.threads}", *ALL_ARMS[label],
            f"method.adapter.num_tokens={TOKENS}" if "num_tokens" not in " ".join(ALL_ARMS[label]) else "",
            *(["method.sharing.warmup_rounds=3"] if "fedpeptao" in ALL_ARMS[label][0] else [])] if o]


def plan(args) -> list[tuple[str, str, int]]:
    """Seeds outermost: every finished seed pairs all arms."""
    return [(t, label, s) for s in args.seeds for t in args.tasks for label in args.arm_labels]


def contrasts(args) -> list[tuple[str, str, list[str], list[str]]]:
    """(arm, reference, the arm's overrides, the reference's) of every paired contrast the results file reads (each
    arm against FedPepTAO (η 1e-3), on the first task: a budget does not depend on it), for the budget test over the
    grids."""
    one = lambda label: overrides(args, args.tasks[0], label, 0)  # noqa: E731
    return [(label, REFERENCE, one(label), one(REFERENCE)) for label in args.arm_labels if label != REFERENCE]


def run_job(args, task: str, label: str, seed: int) -> str:
    out = Path(args.runs_dir) / job_name(task, label, seed)
    line = run_config(out, overrides(args, task, label, seed))
    if label == VALIDITY_MODEL and seed in args.validity_seeds and (out / "summary.json").exists():
        validity_cached(out)  # now, while the checkpoint it reads is here (the run archive keeps only the result)
    return line


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
    ratios = [r["server"].get("server_step_ratio") for r in recs if r["server"].get("server_step_ratio")]
    vectors = [r.get("server_vectors", {}) for r in recs]
    return {"global": last["accuracy"], "personal": personal(last, hist["test"]),
            "initial": recs[0]["accuracy"] if recs[0]["round"] == 0 else None,
            "client_mean": statistics.fmean(per_client), "client_min": min(per_client),
            "client_std": statistics.pstdev(per_client), "majority": majority(hist)[0],
            "majority_class": max(map(sum, zip(*hist["test"]))) / sum(map(sum, hist["test"])),
            "test_n": sum(map(sum, hist["test"])), "budget": measured(out), "up": summary["bytes_up_per_client_round"],
            "step_ratio": statistics.fmean(ratios) if ratios else None,
            "selected": [i for i, x in enumerate(last.get("server_vectors", {}).get("selected_layers", [])) if x],
            "scores": next((v["layer_scores"] for v in vectors if v.get("layer_scores")), None)}


def load_job(args, task: str, label: str, seed: int) -> dict | None:
    """A finished run of exactly this benchmark's config (another config is an error, never mixed in)."""
    out = Path(args.runs_dir) / job_name(task, label, seed)
    return load(out) if finished(out, overrides(args, task, label, seed)) else None


def paired(xs: dict[int, float | None], ys: dict[int, float | None], mixed: int = 0) -> str:
    """Mean paired difference x − y in points over the seeds both have, with a 95 % t-interval and the number of
    pairs (``mixed`` of them put runs of two devices against each other)."""
    return paired_cell([100 * (x - ys[s]) for s, x in xs.items() if x is not None and ys.get(s) is not None], mixed)


# ---------------------------------------------------------------- score validity

VALIDITY_MODEL = "fedavg-prefix (all layers)"  # every layer trained for all rounds: no arm's choice favoured
SCORED = {"score (all tokens)": REFERENCE, "score (non-pad tokens)": "FedPepTAO, score on non-pad tokens"}


def validity(run_dir: Path) -> dict:
    """On one fedavg-prefix final global model: each layer's leave-one-layer-out drop (its prompt reset to the
    initial value) and the accuracy of every subset of |SL| = L/2 layers kept (the others reset)."""
    import torch

    from fedpeft.model.classifier import evaluate
    from fedpeft.build import build
    from fedpeft.predict import adapter_params, load_run

    torch.set_num_threads(1)
    cfg, (_, server, clients, _) = load_run(run_dir)
    built = build(cfg)
    final = adapter_params(built.method, server, clients)
    init = built.method.initial_params()
    layers = sorted(int(k.split(".")[1]) for k in final if k.startswith("prefix."))
    clf, test = built.exp.objective, built.exp.test_encoded

    def acc(keep: set[int]) -> float:
        params = {k: (v if not k.startswith("prefix.") or int(k.split(".")[1]) in keep else init[k])
                  for k, v in final.items()}
        return evaluate(clf, params, test, cfg.evaluation.batch_size)["accuracy"]

    full = acc(set(layers))
    return {"full": full, "loo": {str(layer): full - acc(set(layers) - {layer}) for layer in layers},
            "subsets": {",".join(map(str, sub)): acc(set(sub))
                        for sub in itertools.combinations(layers, math.ceil(len(layers) / 2))}}


def validity_cached(run_dir: Path) -> dict:
    """``validity`` of a finished run, computed once into ``validity.json`` beside it."""
    cache = run_dir / "validity.json"
    if not cache.exists():
        cache.write_text(json.dumps(validity(run_dir)))
    return json.loads(cache.read_text())


def subset_rank(subsets: dict[str, float], chosen: list[int]) -> str:
    """'r of N (t tied)': 1 + the subsets strictly better than the chosen one, and how many score the same."""
    a = subsets[",".join(map(str, chosen))]
    better = sum(x > a + 1e-12 for x in subsets.values())
    tied = sum(abs(x - a) <= 1e-12 for x in subsets.values()) - 1
    return f"{1 + better} of {len(subsets)}" + (f" ({tied} tied)" if tied else "")


def validity_section(args, task: str) -> list[str]:
    lines = [f"### What the layer score measures ({task}, seeds {args.validity_seeds})", "",
             f"On the same seed's {VALIDITY_MODEL} final global model (every layer trained for all {args.rounds} "
             "rounds, so no selection is favoured): each layer's leave-one-layer-out drop (accuracy lost when that "
             "layer's prompt is reset to its initial value), its Spearman correlation with the round-3 layer scores "
             "FedPepTAO computed (all tokens, and non-pad tokens only), and the rank of each order's layer subset "
             "among all subsets of half the layers, scored by the accuracy with only those layers' prompts kept "
             "(rank 1 = best).", "",
             "| seed | drop per layer, bottom to top (points) | best subset (acc %) | "
             "scores (all) → ρ, chosen, rank | "
             "scores (non-pad) → ρ, chosen, rank | ascending rank | descending rank |",
             "|---|---|---|---|---|---|---|"]
    from scipy.stats import spearmanr

    for s in args.validity_seeds:
        run = Path(args.runs_dir) / job_name(task, VALIDITY_MODEL, s)
        scorers = {k: load_job(args, task, label, s) for k, label in SCORED.items()}
        if not load_job(args, task, VALIDITY_MODEL, s):
            lines.append(f"| {s} | ({VALIDITY_MODEL} run not finished) | | | | | |")
            continue
        try:
            v = validity_cached(run)
        except Exception as e:  # noqa: BLE001 - one failure must not lose the rest of the file
            lines.append(f"| {s} | validity failed: {type(e).__name__}: {e} | | | | | |")
            continue
        drops = [v["loo"][k] for k in sorted(v["loo"], key=int)]
        half = math.ceil(len(drops) / 2)
        best = max(v["subsets"], key=v["subsets"].get)
        cells = []
        for r in scorers.values():
            if not r or not r["scores"]:
                cells.append("–")
                continue
            rho = spearmanr(r["scores"], drops).statistic
            cells.append(f"{[round(x, 2) for x in r['scores']]} → ρ = {rho:.2f}, {r['selected']}, "
                         f"{subset_rank(v['subsets'], r['selected'])}")
        lines.append(f"| {s} | {[round(100 * d, 1) for d in drops]} | [{best}] ({100 * v['subsets'][best]:.1f}) | "
                     f"{cells[0]} | {cells[1]} | {subset_rank(v['subsets'], list(range(half)))} | "
                     f"{subset_rank(v['subsets'], list(range(len(drops) - half, len(drops))))} |")
    return lines + [""]


# ---------------------------------------------------------------- table


def render(args) -> Path:
    notes = Path(args.notes)
    lines = ["# FedPepTAO against personalisation baselines (MiniLM, CPU scale)", "",
             f"Rendered with: `python -m benchmarks.fedpeptao {' '.join(args.argv)}`", ""]
    if notes.exists():
        lines += [notes.read_text().strip(), ""]
    lines += [f"Setup: MiniLM (frozen, similarity readout), deep prompt h = {TOKENS} per layer (6 layers), client "
              f"AdamW lr 4e-2 wd 0.1, 2 local epochs, batch 8; 10 clients, label-skew Dirichlet α = 1, 3 clients per "
              f"round, {args.rounds} rounds, FedPepTAO selects r = 0.5 of the layers after round 3; train capped at "
              f"{args.max_train} examples (seeded, stratified), test = the full SST-2 dev set (872) / 1,000 of the "
              "7,600 AG News test examples (seeded, stratified), split among the clients like their training labels. "
              "Final round (never the best round); cells are mean ± standard deviation over the seeds done. "
              "`personalised` pools every client's own test shard scored with the client's own tensors "
              "(= global for methods without private tensors); per-client columns are over the 10 clients. `global` "
              "scores the server's tensors; where layers never leave the clients (local-only, FedPer, LG-FedAvg) the "
              "server holds their initial prompts, and FedPepTAO's unshared layers are the server's round-3 copy. "
              f"Paired differences against {REFERENCE} in points with 95 % t-intervals over the seeds both arms have "
              "(n pairs); the intervals are per comparison, not corrected for multiple comparisons. Upload: mean "
              "encoded bytes per client-round over the whole run (warm-up included).", "",
              "Budget: the mean local steps and examples a client-round trained on, the learning rate, the weight "
              "decay and the device of the finished runs; CPU–GPU pairs are counted in the paired cells.", ""]
    for task in args.tasks:
        ref = {s: load_job(args, task, REFERENCE, s) for s in args.seeds}
        lines += [f"## {task}", ""]
        any_run = next((r for r in ref.values() if r), None)
        if any_run:
            n = any_run["test_n"]
            lines += [f"Test n = {n} (standard error of one accuracy ≤ {accuracy_se(n):.1f} points).", ""]
        lines += ["| arm | seeds done | global % | Δ global vs FedPepTAO | personalised % | "
                  "Δ personalised vs FedPepTAO | per-client mean / worst / std % | round 0 % | "
                  "upload B/client-round | ‖η m‖/‖w̄−w‖ | budget / client-round |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        majority_rows, majority_class, order_layers = {}, {}, []
        for label in args.arm_labels:
            done = {s: r for s in args.seeds if (r := load_job(args, task, label, s))}
            if not done:
                lines.append(f"| {label} | 0/{len(args.seeds)} |" + " – |" * 9)
                continue
            rs = list(done.values())
            majority_rows |= {s: r["majority"] for s, r in done.items()}
            majority_class |= {s: r["majority_class"] for s, r in done.items()}
            pairs = [s for s in done if ref.get(s)]
            mixed = mixed_pairs({s: done[s]["budget"].device for s in pairs},
                                {s: ref[s]["budget"].device for s in pairs})

            def diff(key: str) -> str:
                if label == REFERENCE:
                    return "–"
                return paired({s: done[s][key] for s in pairs}, {s: ref[s][key] for s in pairs}, mixed)
            ratio = [r["step_ratio"] for r in rs if r["step_ratio"] is not None]
            lines.append(
                f"| {label} | {len(rs)}/{len(args.seeds)} | {mean_std([r['global'] for r in rs])} | {diff('global')} | "
                f"{mean_std([r['personal'] for r in rs])} | {diff('personal')} | "
                f"{mean_std([r['client_mean'] for r in rs])} / {mean_std([r['client_min'] for r in rs])} / "
                f"{mean_std([r['client_std'] for r in rs])} | {mean_std([r['initial'] for r in rs])} | "
                f"{statistics.fmean(r['up'] for r in rs):,.0f} | "
                f"{f'{statistics.fmean(ratio):.2g}' if ratio else '–'} | "
                f"{budget_cell([r['budget'] for r in rs], device=True)} |")
            if label.startswith("FedPepTAO") and any(r["selected"] for r in rs):
                order_layers.append(f"{label}: {[(s, r['selected']) for s, r in done.items()]}")
        if majority_class:
            lines.append("| majority class (most frequent test label; no model) | "
                         f"{len(majority_class)}/{len(args.seeds)} | "
                         f"{mean_std(list(majority_class.values()))} | – | – | – | – | – | 0 | – | none |")
        if majority_rows:
            maj_diff = paired(majority_rows, {s: r["personal"] for s, r in ref.items() if r})
            lines.append("| per-client majority label (no model; reference) | "
                         f"{len(majority_rows)}/{len(args.seeds)} | – | – | "
                         f"{mean_std(list(majority_rows.values()))} | {maj_diff} | – | – | 0 | – | none |")
        if "ablations" in args.arms:
            lines.append("| adamd (AdamD: client AdamW, FedAvg server) | – | same config as fedavg-prefix (all "
                         "layers): not run twice | | | | | | | | |")
        if order_layers:
            lines += ["", "Layers shared after selection, per arm as (seed, layers): " + "; ".join(order_layers) + "."]
        lines.append("")
        if args.validity:
            lines += validity_section(args, task)
    return write_results(args.results, lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = grid_parser("fedpeptao", __doc__.splitlines()[0], seeds=(0, 1, 2, 3, 4))
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="groups of arms to run")
    p.add_argument("--validity-seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--max-train", type=int, default=600)
    p.add_argument("--every", type=int, default=10, help="evaluate every k rounds (and round 0, the last)")
    p.add_argument("--max-test", type=int, default=None, help="cap the test sets (smoke tests; default: SST-2's "
                   "whole dev set, 1,000 AG News)")
    p.add_argument("--validity", action="store_true", help="compute the score-validity table (after the runs)")
    args = parse_grid_args(p, argv)
    args.arm_labels = [label for group in args.arms for label in ARMS[group]]
    if REFERENCE not in args.arm_labels:
        args.arm_labels.insert(0, REFERENCE)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    run_grid(args, run_job, plan(args), render)


if __name__ == "__main__":
    main()
