"""Personalized gradient-free discrete prompt tuning (benchmarks/results/discrete_prompt.md) at CPU scale.

Two federations of real data: the FDU-MTL analogue (one sentiment domain per client pair: IMDB, MPQA, MR,
SST-2, Yelp; the clients of one domain group never train and are scored as non-participants, the group
rotating with the seed) and SST-2 with Dirichlet label skew (gamma = 0.4, 20 % of the clients held out).
Arms: the paper's method with Phi = 5 / 3, FullDownload, PCA-10 and Quant-3 downloads, BBT local-only, BBT(Fed),
Prompt Tuning (Fed), the manual prompt; plus majority class and per-client majority. Every arm of a (setting,
seed) shares the partition, the non-participants and the initial tensors. Reported: P and NP accuracy after
post-tuning (and before it), bytes per client-round both ways, model queries (candidate evaluations) per
client-round, each arm's budget per client-round, the mean client training loss per round, and each arm's paired
difference from Ours (Phi = 5) by seed with a 95 % t-interval; final round only.

    python -m benchmarks.discrete_prompt --runs-dir runs/discrete_prompt --workers 2      # resumable
    python -m benchmarks.discrete_prompt --runs-dir runs/discrete_prompt --render-only    # rewrite the table
    python -m benchmarks.discrete_prompt --calibration                                    # SmolLM2 zero-shot table
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.budget import budget_cell, measured, mixed_pairs
from benchmarks.grids import load_grid
from benchmarks.runner import grid_parser, parse_grid_args, run_config, run_grid, write_results
from benchmarks.stats import accuracy_se, mean_std, paired_cell

GRID = load_grid("discrete_prompt")
ARMS, SCALE = GRID["arms"], GRID["scale"]
REFERENCE = "Ours (Phi=5)"  # the arm every other is paired with
# the settings depend on the seed (its non-participant fold), so they stay code
SETTINGS = {
    "domains": lambda seed: ["task.name=sentiment-domains", "federation.partition.scheme=domains",
                             "federation.partition.clients_per_domain=2", "federation.num_clients=10",
                             "federation.non_participants.folds=5", f"federation.non_participants.fold={seed % 5}"],
    "sst2-dir0.4": lambda seed: ["task.name=sst2", "task.max_train=500", "task.max_test=800",
                                 "federation.partition.scheme=dirichlet",
                                 "federation.partition.alpha=0.4", "federation.partition.min_size=20",
                                 "federation.num_clients=10", "federation.non_participants.fraction=0.2"],
}


def job_name(setting: str, arm: str, seed: int) -> str:
    slug = "".join(ch if ch.isalnum() else "-" for ch in arm.lower()).strip("-")
    return f"{setting}__{slug}__s{seed}"


def overrides(args, setting: str, arm: str, seed: int) -> list[str]:
    from fedpeft.methods import PRESETS

    preset = PRESETS.get(ARMS[arm][0].split("=", 1)[1]).method_defaults
    parts = [preset["adapter"]["name"], preset["trainer"]["name"], preset.get("post_tuning", {}).get("name")]
    scale = [o for p in parts for o in SCALE.get(p, [])]
    return [f"task.max_train={args.max_train}", f"task.max_test={args.max_test}", f"task.max_length={args.max_length}",
            "model.name=minilm", f"seed={seed}", f"federation.rounds={args.rounds}",
            f"evaluation.every={args.rounds}", "evaluation.batch_size=64", "runtime.progress=false",
            f"runtime.threads={args.threads}", *SETTINGS[setting](seed), *scale, *ARMS[arm]]


def plan(args) -> list[tuple[str, str, int]]:
    return [(st, arm, s) for st in args.settings for arm in args.arms for s in args.seeds]


def contrasts(args) -> list[tuple[str, str, list[str], list[str]]]:
    """(arm, reference, the arm's overrides, the reference's) of every paired contrast the results file reads (each
    arm against Ours (Phi = 5), in every setting), for the budget test over the grids."""
    return [(arm, REFERENCE, overrides(args, st, arm, 0), overrides(args, st, REFERENCE, 0))
            for st in args.settings for arm in args.arms if arm != REFERENCE]


def run_job(args, setting: str, arm: str, seed: int) -> str:
    return run_config(Path(args.runs_dir) / job_name(setting, arm, seed), overrides(args, setting, arm, seed))


# ---------------------------------------------------------------- the results file


def _load(out: Path) -> dict | None:
    if not (out / "summary.json").exists():
        return None
    recs = [r for r in (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
            if r["round"] > 0]  # round 0 (the initial state) is not a training round
    last = recs[-1]
    ok = [c for r in recs for c in r["clients"] if c["status"] == "ok"]
    cands = [c["candidates"] for c in ok if "candidates" in c]
    summary = json.loads((out / "summary.json").read_text())
    return {"P": last.get("local_accuracy_P"), "NP": last.get("local_accuracy_NP"),
            "P0": last.get("local_accuracy_global_P"), "NP0": last.get("local_accuracy_global_NP"),
            "up": summary["bytes_up_per_client_round"], "down": summary["bytes_down_per_client_round"],
            "up_tensor": summary.get("upload_tensor_bytes"), "queries": statistics.fmean(cands) if cands else None,
            "loss": [r["train_loss"] for r in recs], "rounds": len(recs), "wall": summary["wall_seconds"],
            "eval_down": last["eval_bytes_down"], "budget": measured(out)}


PAIRED = {"P": "Δ P", "NP": "Δ NP", "P0": "Δ P before post-tuning", "NP0": "Δ NP before"}  # key -> column


def _paired(res: dict[int, dict], ref: dict[int, dict], key: str) -> str:
    """The paired cell of arm − reference on ``key`` in points over the seeds both have it, with the pairs that mix
    devices counted (a baseline row has no device: none mixed)."""
    both = [s for s, r in res.items() if s in ref and r.get(key) is not None and ref[s].get(key) is not None]
    devices = {s: res[s]["budget"].device for s in both if "budget" in res[s]}
    return paired_cell([(res[s][key] - ref[s][key]) * 100 for s in both],
                       mixed_pairs(devices, {s: ref[s]["budget"].device for s in both}))


def _contrast_rows(rows: dict[str, dict[int, dict]]) -> list[str]:
    """Each arm's (and the client majority's) paired differences from Ours (Phi = 5) by seed."""
    ref = rows.get(REFERENCE)
    if not ref:
        return []
    return ["", f"Paired differences by seed, final round, in points: each row − {REFERENCE}, mean [95 % CI] over the "
            "seeds both finished (n); one seed: the difference alone.", "",
            f"| row − {REFERENCE} | {' | '.join(PAIRED.values())} |", "|---|" + "---|" * len(PAIRED),
            *(f"| {arm} | {' | '.join(_paired(res, ref, key) for key in PAIRED)} |"
              for arm, res in rows.items() if arm != REFERENCE and res)]


def baselines(args, setting: str, seed: int) -> dict[str, float]:
    """Majority class (of the pooled training data) and per-client majority, over P and NP clients' test shards."""
    import numpy as np

    from fedpeft.data.participants import non_participants
    from fedpeft.experiment import split_clients
    from fedpeft.data import load_task
    from fedpeft.resolve import load_config

    cfg = load_config(None, overrides(args, setting, "Manual prompt (zero-shot)", seed))
    task = load_task(cfg.task, cfg.seed)
    train_parts, test_parts, domains = split_clients(task, cfg)
    np_ids = non_participants(cfg.federation.non_participants, cfg.federation.num_clients, cfg.seed, domains)
    ytr, yte = np.array([e.label for e in task.train]), np.array([e.label for e in task.test])
    pooled = np.bincount(ytr, minlength=task.num_classes).argmax()
    out: dict[str, list[float]] = {}
    for c, (tr, te) in enumerate(zip(train_parts, test_parts)):
        if len(te) == 0:
            continue
        role = "NP" if c in np_ids else "P"
        own = np.bincount(ytr[tr], minlength=task.num_classes).argmax()
        out.setdefault(f"majority {role}", []).append(float((yte[te] == pooled).mean()))
        out.setdefault(f"client majority {role}", []).append(float((yte[te] == own).mean()))
    sizes = [len(te) for te in test_parts]
    return {k: statistics.fmean(v) for k, v in out.items()} | {"test_per_client": statistics.fmean(sizes)}


def render(args) -> Path:
    runs = Path(args.runs_dir)
    lines = ["# Personalized gradient-free discrete prompt tuning: MiniLM at CPU scale", "",
             f"Rendered with: `python -m benchmarks.discrete_prompt {' '.join(args.argv)}`", "",
             f"Setup: MiniLM with the similarity readout (frozen), 10 clients, all participants train every round, "
             f"{args.rounds} rounds; per-domain / per-task caps {args.max_train} train and {args.max_test} test "
             f"examples, inputs cut at {args.max_length} tokens. "
             "Scaled from the paper (T = 50, S = 40, d = 500, popsize 20): "
             f"T = 10 prompt tokens, S = 10 search steps of K = 5 candidates on minibatches of 16, BBT subspace "
             f"d = 50 (BBT(Fed): 4 local CMA-ES iterations of 10 candidates on the whole local set); post-tuning: "
             f"CMA-ES sigma 0.1, population 8, 8 iterations, 16 shots per class with an "
             f"equal dev set (sigma 1 for BBT local-only), gradient post-tuning 10 Adam steps at 1e-2. Accuracy: "
             f"the final round's mean over clients of each client's own test shard, P (participants) and NP "
             f"(never trained), mean ± std over seeds {args.seeds}, paired (within a seed every arm shares the "
             "partition, the non-participants and the initial tensors); 'before' = the global prompt before "
             "post-tuning. Bytes are real encoded messages (framing included); queries = prompt evaluations per "
             "client-round.",
             ""]
    if args.notes and Path(args.notes).exists():
        lines += [Path(args.notes).read_text().strip(), ""]
    for setting in args.settings:
        base = [baselines(args, setting, s) for s in args.seeds]
        n = statistics.fmean(b["test_per_client"] for b in base)
        lines += [f"## {setting}", "", f"About {n:.0f} test examples per client (standard error of one client's "
                  f"accuracy ≤ {accuracy_se(n):.1f} points; of a mean over 8 P clients ≤ "
                  f"{accuracy_se(8 * n):.1f}).", "",
                  "| arm | seeds done | P acc % | NP acc % | P before post-tuning | NP before | upload B/client-round "
                  "| download B/client-round | queries/client-round | budget / client-round |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for name in ("majority", "client majority"):
            lines.append(f"| {name} | {len(base)}/{len(args.seeds)} | {mean_std([b.get(name + ' P') for b in base])} | "
                         f"{mean_std([b.get(name + ' NP') for b in base])} | | | 0 | 0 | 0 | none |")
        curves = {}
        rows = {"client majority": {s: {"P": b.get("client majority P"), "NP": b.get("client majority NP")}
                                    for s, b in zip(args.seeds, base)}}
        for arm in args.arms:
            res = {s: _load(runs / job_name(setting, arm, s)) for s in args.seeds}
            rows[arm] = {s: r for s, r in res.items() if r}
            done = list(rows[arm].values())
            if not done:
                lines.append(f"| {arm} | 0/{len(args.seeds)} |" + " – |" * 8)
                continue
            q = [r["queries"] for r in done if r["queries"] is not None]
            local = arm.startswith(("BBT (local", "Manual"))
            lines.append(f"| {arm} | {len(done)}/{len(args.seeds)} | {mean_std([r['P'] for r in done])} | "
                         f"{mean_std([r['NP'] for r in done])} | {mean_std([r['P0'] for r in done])} | "
                         f"{mean_std([r['NP0'] for r in done])} | "
                         f"{'–' if local else format(statistics.fmean(r['up'] for r in done), ',.0f')} | "
                         f"{'–' if local else format(statistics.fmean(r['down'] for r in done), ',.0f')} | "
                         f"{format(statistics.fmean(q), ',.0f') if q else '–'} | "
                         f"{budget_cell([r['budget'] for r in done], device=True)} |")
            if all(r["rounds"] == args.rounds and None not in r["loss"] for r in done) and args.rounds > 1:
                curves[arm] = [statistics.fmean(r["loss"][i] for r in done) for i in range(args.rounds)]
        lines += ["", "Mean client training loss per round (the loss the local search / training minimised):", "",
                  "| arm | " + " | ".join(str(i + 1) for i in range(args.rounds)) + " |",
                  "|---|" + "---|" * args.rounds]
        lines += [f"| {arm} | " + " | ".join(f"{x:.3f}" for x in c) + " |" for arm, c in curves.items()]
        lines += [*_contrast_rows(rows), ""]
    calib = Path(args.runs_dir) / "calibration.json"
    if calib.exists():
        c = json.loads(calib.read_text())
        lines += ["## SmolLM2-135M zero-shot (manual prompt, next-token verbalizer), with and without contextual "
                  "calibration", "", "`python -m benchmarks.discrete_prompt --calibration`: each task's test split "
                  "(capped at 1,000 examples; n below), one deterministic run; standard error of an accuracy near "
                  "50 % with n = 872: 1.7 points.", "", "| task | n | majority % | uncalibrated % | predicted "
                  "classes (uncal.) | calibrated % | predicted classes (cal.) |", "|---|---|---|---|---|---|---|"]
        for task, r in c.items():
            lines.append(f"| {task} | {r['n']} | {r['majority'] * 100:.1f} | {r['none'] * 100:.1f} | "
                         f"{r['none_classes']} | {r['contextual'] * 100:.1f} | {r['contextual_classes']} |")
        lines.append("")
    return write_results(args.results, lines)


def calibration(args) -> dict:
    """Zero-shot SmolLM2 accuracy and how many classes it predicts, uncalibrated and contextually calibrated."""
    import torch

    from fedpeft.build import build
    from fedpeft.resolve import load_config

    torch.set_num_threads(args.threads)
    out = {}
    for task in ("sst2", "agnews"):
        row = {}
        for mode in ("none", "contextual"):
            cfg = load_config(None, [f"task.name={task}", "task.max_test=1000", "model.name=smollm2",
                                     "method.name=manual-prompt", f"model.calibration={mode}", "task.max_length=64"])
            b = build(cfg)
            clf, data = b.exp.objective, b.exp.test_encoded
            preds = []
            with torch.inference_mode():
                for i in range(0, len(data), 32):
                    batch = clf.batch(data, list(range(i, min(i + 32, len(data)))))
                    preds.append(clf.logits(b.method.initial_params(), batch).argmax(-1))
            pred = torch.cat(preds)
            labels = torch.as_tensor(data.labels)
            row[mode] = float((pred == labels).float().mean())
            row[f"{mode}_classes"] = int(pred.unique().numel())
        row["n"] = len(data)
        row["majority"] = float(torch.bincount(labels).max()) / len(labels)
        out[task] = row
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = grid_parser("discrete_prompt", __doc__.splitlines()[0])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), metavar="ARM")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-train", type=int, default=100, help="per domain (domains; SST-2 takes 500 for its 10 "
                                                                "Dirichlet clients)")
    p.add_argument("--max-test", type=int, default=200)
    p.add_argument("--max-length", type=int, default=40)
    p.add_argument("--calibration", action="store_true", help="measure the SmolLM2 zero-shot table, then render")
    return parse_grid_args(p, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.calibration:
        Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.runs_dir) / "calibration.json").write_text(json.dumps(calibration(args), indent=1))
        args.render_only = True  # measured: now only render
    run_grid(args, run_job, plan(args), render)


if __name__ == "__main__":
    main()
