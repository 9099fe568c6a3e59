"""FedPrompt under attack and with privacy (benchmarks/results/fedprompt_security.md): MiniLM, 10 clients.

- Backdoor (Table III, Fig. 5) on SST-2, AG News and QNLI (a sentence pair), IID and the paper's Dirichlet
  quantity skew (alpha = 0.5, every client >= 10 examples; labels not skewed on purpose): clean
  runs (with the natural-error ASR), 1 of 10 clients poisoning all of its data (lambda = 1), and the same with
  boosting (gamma = 10); the malicious client's local ASR per round next to the global ASR.
- Defences against the poisoned client (SST-2, IID): coordinate median, trimmed mean, Multi-Krum, norm clipping
  and FedPrompt's outlier filter.
- Local DP (Table V, SST-2 IID): Laplace noise of two scales and Gaussian noise, with the epsilon spent.
- Variants (Table VI, SST-2 IID): soft prompt (= the clean run), P-tuning, prefix tuning: accuracy and bytes.
Every arm of a (task, partition, seed) shares the partition, the malicious client and the initial prompt;
final round only, mean ± std over seeds, each arm's budget per client-round, and paired differences by seed (95 %
t-intervals) of each arm against its reference (``references`` in the grid: an attack against the clean run, a
defence against the attack it defends from, a privacy mechanism or variant against the clean run).

    python -m benchmarks.fedprompt_security --runs-dir runs/fedprompt_security --workers 2     # resumable
    python -m benchmarks.fedprompt_security --runs-dir runs/fedprompt_security --render-only
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

GRID = load_grid("fedprompt_security")
POISON = GRID["poison"]
ATTACK_ARMS = GRID["attack_arms"]
SST2_ARMS = GRID["sst2_arms"]
TASKS = GRID["tasks"]
PARTITIONS = GRID["partitions"]
REFERENCES = GRID["references"]  # arm -> the arm it is paired with


def arms_for(task: str, part: str) -> dict[str, list[str]]:
    return ATTACK_ARMS | (SST2_ARMS if (task, part) == ("sst2", "iid") else {})


def job_name(task: str, part: str, arm: str, seed: int) -> str:
    slug = "".join(ch if ch.isalnum() else "-" for ch in arm.lower()).strip("-")
    return f"{task}__{part}__{slug}__s{seed}"


def overrides(args, task: str, part: str, arm: str, seed: int) -> list[str]:
    return [f"task.name={task}", f"task.max_train={args.max_train}", f"task.max_test={args.max_test}",
            f"task.max_length={TASKS[task]}", "model.name=minilm", f"seed={seed}", "method.name=fedprompt",
            "federation.num_clients=10", f"federation.rounds={args.rounds}", "evaluation.local=false",
            "runtime.progress=false", f"runtime.threads={args.threads}", *PARTITIONS[part],
            *arms_for(task, part)[arm]]


def plan(args) -> list[tuple[str, str, str, int]]:
    return [(t, part, arm, s) for t in args.tasks for part in args.partitions for arm in arms_for(t, part)
            for s in args.seeds]


def contrasts(args) -> list[tuple[str, str, list[str], list[str]]]:
    """(arm, reference, the arm's overrides, the reference's) of every paired contrast the results file reads (each
    arm against its reference, on SST-2 IID, which has every arm: a budget does not depend on the task), for the
    budget test over the grids."""
    one = lambda arm: overrides(args, "sst2", "iid", arm, 0)  # noqa: E731
    return [(arm, ref, one(arm), one(ref)) for arm, ref in REFERENCES.items()]


def run_job(args, task: str, part: str, arm: str, seed: int) -> str:
    return run_config(Path(args.runs_dir) / job_name(task, part, arm, seed), overrides(args, task, part, arm, seed))


def majority_accuracy(args, task: str, part: str, seed: int) -> tuple[float, int]:
    """Test accuracy of always predicting the training set's majority class (the run's own data caps), and the
    test set's size."""
    from collections import Counter

    from fedpeft.data import load_task
    from fedpeft.resolve import load_config

    cfg = load_config(None, overrides(args, task, part, "clean", seed))
    data = load_task(cfg.task, cfg.seed)
    top = Counter(e.label for e in data.train).most_common(1)[0][0]
    return sum(e.label == top for e in data.test) / len(data.test), len(data.test)


def initial_metrics(args, task: str, part: str, seed: int) -> dict[str, float]:
    """ACC and ASR of the untrained initial prompt (the clean arm's config and seed), computed once and kept in
    ``<runs-dir>/baselines.json`` (runs from before round 0 was recorded lack it)."""
    from fedpeft.build import build
    from fedpeft.resolve import load_config

    cache = Path(args.runs_dir) / "baselines.json"
    known = json.loads(cache.read_text()) if cache.exists() else {}
    key = job_name(task, part, "untrained", seed)
    if key not in known:
        b = build(load_config(None, overrides(args, task, part, "clean", seed)))
        m = b.method.evaluate_global(b.method.server_init())
        known[key] = {"acc": m["accuracy"], "asr": m.get("asr")}
        cache.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
    return known[key]


def _load(out: Path) -> dict | None:
    if not (out / "summary.json").exists():
        return None
    recs = [r for r in (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
            if r["round"] > 0]  # round 0 (the initial state) is not a training round
    summary = json.loads((out / "summary.json").read_text())
    mal = [next((c.get("local_asr") for c in r["clients"] if c["client"] == 0), None) for r in recs]
    benign = [statistics.fmean(c["local_asr"] for c in r["clients"] if c["client"] != 0 and "local_asr" in c)
              if any("local_asr" in c for c in r["clients"]) else None for r in recs]
    return {"acc": recs[-1]["accuracy"], "asr": recs[-1].get("asr"), "asr_curve": [r.get("asr") for r in recs],
            "mal_curve": mal, "benign_curve": benign, "up": summary["bytes_up_per_client_round"],
            "params": summary["trainable_params"], "eps": recs[-1]["server"].get("epsilon"),
            "filtered": sum(r["server"].get("filtered", 0) for r in recs), "budget": measured(out)}


def _paired(done: dict[int, dict], ref: dict[int, dict], key: str) -> str:
    """The paired cell of arm − reference on ``key`` (ACC or ASR) in points over the seeds both have it, with the
    pairs that mix devices counted."""
    both = [s for s, r in done.items() if s in ref and r[key] is not None and ref[s][key] is not None]
    return paired_cell([(done[s][key] - ref[s][key]) * 100 for s in both],
                       mixed_pairs({s: done[s]["budget"].device for s in both},
                                   {s: ref[s]["budget"].device for s in both}))


def _contrast_rows(done_by_arm: dict[str, dict[int, dict]]) -> list[str]:
    """The paired differences of each arm of a section from its reference (``references`` in the grid)."""
    pairs = [(arm, ref) for arm, ref in REFERENCES.items() if done_by_arm.get(arm) and done_by_arm.get(ref)]
    if not pairs:
        return []
    return ["", "Paired differences by seed, final round, in points: each arm − its reference, mean [95 % CI] over "
            "the seeds both finished (n); one seed: the difference alone.", "",
            "| arm − reference | Δ ACC | Δ ASR |", "|---|---|---|",
            *(f"| {arm} − {ref} | {_paired(done_by_arm[arm], done_by_arm[ref], 'acc')} | "
              f"{_paired(done_by_arm[arm], done_by_arm[ref], 'asr')} |" for arm, ref in pairs)]


def render(args) -> Path:
    runs = Path(args.runs_dir)
    lines = ["# FedPrompt: backdoor, defences, local DP and prompt variants (MiniLM, CPU scale)", "",
             f"Rendered with: `python -m benchmarks.fedprompt_security {' '.join(args.argv)}`", "",
             "Setup: MiniLM (similarity readout), FedPrompt (20 soft tokens, Adam lr 0.03, batch 16, one local "
             f"epoch), 10 clients all every round, {args.rounds} rounds, train capped at {args.max_train} and test at "
             f"{args.max_test} examples; client 0 malicious in poisoned runs (trigger 'cf', target class 1, "
             f"lambda = 1, honest weight). ACC = global test accuracy, ASR = share of triggered non-target test "
             f"inputs classified as the target; final round, mean ± std over seeds {args.seeds}, paired (within a seed "
             "every arm shares the partition, the malicious client and the initial prompt).", ""]
    notes = Path(args.notes)
    if notes.exists():
        lines += [notes.read_text().strip(), ""]
    for task in args.tasks:
        for part in args.partitions:
            arms = arms_for(task, part)
            lines += [f"## {task}, {part}", ""]
            seeds = [s for s in args.seeds if (runs / job_name(task, part, "clean", s) / "summary.json").exists()]
            majority = [majority_accuracy(args, task, part, s) for s in seeds]
            if majority:
                n = majority[0][1]
                lines += [f"Test n = {n} (standard error of one ACC ≤ {accuracy_se(n):.1f} points).", ""]
            lines += ["| arm | seeds done | ACC % | ASR % | upload B/client-round | trainable params | "
                      "ε after the last round | clients filtered (all rounds) | budget / client-round |",
                      "|---|---|---|---|---|---|---|---|---|"]
            if seeds:  # the trivial baselines, on the seeds whose clean run is done
                lines.append(f"| majority class (of the training data) | {len(seeds)}/{len(args.seeds)} | "
                             f"{mean_std([acc for acc, _ in majority])} | – | 0 | 0 | – | – | none |")
                start = [initial_metrics(args, task, part, s) for s in seeds]
                lines.append(f"| untrained prompt (the initial prompt, no training) | {len(seeds)}/{len(args.seeds)} | "
                             f"{mean_std([r['acc'] for r in start])} | {mean_std([r['asr'] for r in start])} | "
                             "– | – | – | – | none |")
            done_by_arm = {}
            for arm in arms:
                by_seed = {s: r for s in args.seeds if (r := _load(runs / job_name(task, part, arm, s)))}
                done_by_arm[arm] = by_seed
                done = list(by_seed.values())
                if not done:
                    lines.append(f"| {arm} | 0/{len(args.seeds)} |" + " – |" * 7)
                    continue
                eps = [r["eps"] for r in done if r["eps"] is not None]
                lines.append(f"| {arm} | {len(done)}/{len(args.seeds)} | {mean_std([r['acc'] for r in done])} | "
                             f"{mean_std([r['asr'] for r in done])} | {statistics.fmean(r['up'] for r in done):,.0f} | "
                             f"{done[0]['params']:,} | {statistics.fmean(eps):.3g} |" if eps else
                             f"| {arm} | {len(done)}/{len(args.seeds)} | {mean_std([r['acc'] for r in done])} | "
                             f"{mean_std([r['asr'] for r in done])} | {statistics.fmean(r['up'] for r in done):,.0f} | "
                             f"{done[0]['params']:,} | – |")
                lines[-1] += f" {sum(r['filtered'] for r in done)} |" if arm.startswith("defence") else " – |"
                lines[-1] += f" {budget_cell([r['budget'] for r in done], device=True)} |"
            lines += _contrast_rows(done_by_arm)
            for arm in ("poisoned (1/10, lambda=1)", "poisoned + boosting (gamma=10)"):
                done = list((done_by_arm.get(arm) or {}).values())
                if done and all(None not in r["mal_curve"] for r in done):
                    n = min(len(r["asr_curve"]) for r in done)
                    lines += ["", f"ASR per round, {arm} (%, mean over seeds): the malicious client's local model "
                              f"after its training, the benign clients' local models, the global model", "",
                              "| round | " + " | ".join(str(i + 1) for i in range(n)) + " |", "|---|" + "---|" * n]
                    for label, key in (("malicious local", "mal_curve"), ("benign local (mean)", "benign_curve"),
                                       ("global", "asr_curve")):
                        lines.append(f"| {label} | " + " | ".join(
                            f"{statistics.fmean(r[key][i] for r in done) * 100:.1f}" for i in range(n)) + " |")
            lines.append("")
    return write_results(args.results, lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = grid_parser("fedprompt_security", __doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--partitions", nargs="+", default=list(PARTITIONS), choices=list(PARTITIONS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-train", type=int, default=1000)
    p.add_argument("--max-test", type=int, default=500)
    return parse_grid_args(p, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    run_grid(args, run_job, plan(args), render)


if __name__ == "__main__":
    main()
