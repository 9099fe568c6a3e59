"""FedBPT against its gradient-free baselines, with a search budget matched to the dimension
(benchmarks/results/fedbpt.md; the design of issue 13).

SST-2 and AG News few-shot (40 examples per class in total, drawn before partitioning, as the paper), 10 clients,
all participating, label-skew Dirichlet alpha = 1.0 and alpha = 0.1. Budget matched to d: d = 30, m = 5 prompt
rows, lambda = 5, I = 5 local iterations, T = 20 rounds, i.e. T*I*lambda = 500 candidate evaluations per client
(16.7 d; BBT and the paper use 8,000 at d = 500, 16 d). Evaluation on the full SST-2 dev set (872) and 1,000
stratified AG News test examples, at rounds 0, 5, 10, ... and the last; the table reads the final round (never
the best). Seeds 0-4, paired: within a seed every arm shares the few-shot set, the partition, the projection A
(seeded from the run seed alone, ``adapters/projected_prompt.py``) and z_0 = 0.

Arms (``--arms``): manual prompt, raw and contextually calibrated; FedAvg-BBT; FedAvg-BBT query-matched (2I
iterations: FedBPT spends two forwards per candidate, clean and perturbed); FedBPT with the clean uploaded loss
(paper) and with the perturbation ratio uploaded (authors' code); FedBPT with r_p = 0 (server CMA-ES only);
centralised BBT (upper bound: one client holding the whole few-shot set, same T, I, lambda); local-only BBT
(each client runs BBT alone for T*I iterations of lambda candidates and is scored on its own test shard).
Models (``--models``): MiniLM with the similarity readout pooled over text positions only
(``model.pooling=text``), and SmolLM2-135M with the next-token verbalizer and contextual calibration for every
arm but the raw manual prompt (slow on CPU: a separate choice).

Every run is a fedpeft run directory under --runs-dir (``runner.run_config``): finished runs are skipped,
interrupted ones resumed from their checkpoint; jobs run model by model, seeds outermost, so every finished seed
pairs all arms. After a run, a post-hoc pass (``posthoc.json`` in the run directory) scores the final global
prompt and z = 0 once more on the test set (class histogram of the predictions, for the dominant-class share)
and on the union of the clients' training data (loss), and stores the clients' label histograms.
``--render-only`` writes the results file from the run directories and says which rows are complete. A run
directory is tied to its config: use a fresh --runs-dir for another budget (a changed config is refused on resume).

Cost on this 2-core CPU (one job per core, MiniLM, 1 thread; the finished runs' wall times): SST-2 4-10 minutes
per run (FedAvg-BBT ~4.5, FedBPT and the query-matched FedAvg-BBT ~7-10), ~85 minutes per seed of all 15 jobs;
AG News ~3x per run (FedAvg-BBT 13.5 minutes), ~4 hours per seed. SmolLM2 with the paper's prefix placement is
~15-20x MiniLM per round, a GPU job; with ``--placement suffix`` a SST-2 FedAvg-BBT run takes ~25 minutes (~6x
MiniLM). ``--plan`` lists the 150 jobs.

    nice -n 10 .venv/bin/python benchmarks/fedbpt.py --runs-dir runs/fedbpt --workers 2           # CPU, resumable
    nice -n 10 .venv/bin/python benchmarks/fedbpt.py --runs-dir runs/fedbpt --models smollm2 --placement suffix \
        --tasks sst2 --alphas 1.0 --arms manual manual-cal fedavg-bbt fedbpt fedbpt-rp0 --seeds 0 1 2 \
        --results benchmarks/results/fedbpt_smollm2.md                                     # SmolLM2 subset, own file
    .venv/bin/python benchmarks/fedbpt.py --runs-dir runs/fedbpt --render-only
    .venv/bin/python benchmarks/fedbpt.py --plan                                                  # list the jobs

Paper scale on a GPU (``--paper-scale``): d = 500, m = 50, I = 8, lambda = 5, T = 200 rounds (the authors'
default), evaluation every 10 rounds, ``runtime.device=cuda``; its own runs directory and results file
(runs/fedbpt-paper, benchmarks/results/fedbpt_paper_scale.md) unless given; any of --dim, --tokens,
--iterations, --popsize, --rounds, --every, --device overrides it, e.g.

    .venv/bin/python benchmarks/fedbpt.py --paper-scale --arms fedavg-bbt fedavg-bbt-2x fedbpt fedbpt-rp0 \\
        --workers 2 --threads 4
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path

from runner import finished, mean_std, run_config, run_pool, t95

HERE = Path(__file__).resolve().parent
SCALES = {  # the defaults of the budget flags
    "cpu": {"dim": 30, "tokens": 5, "iterations": 5, "popsize": 5, "rounds": 20, "every": 5, "device": "cpu",
            "runs_dir": "runs/fedbpt", "results": HERE / "results" / "fedbpt.md"},
    "paper": {"dim": 500, "tokens": 50, "iterations": 8, "popsize": 5, "rounds": 200, "every": 10, "device": "cuda",
              "runs_dir": "runs/fedbpt-paper", "results": HERE / "results" / "fedbpt_paper_scale.md"},
}
TASKS = {  # max_test None: the whole dev/test set
    "sst2": {"max_test": None, "max_length": 64, "perturb": 0.6},    # 872 dev examples; r_p: paper's best (Table 4)
    "agnews": {"max_test": 1000, "max_length": 64, "perturb": 0.4},  # 1,000 of 7,600, stratified, seeded
}
ALPHAS = {"1.0": 2, "0.1": 1}  # alpha -> partition.min_size (alpha 0.1 cannot give every SST-2 client 2 examples)
MODELS = ("minilm", "smollm2")
ARMS = {  # key -> (label, depends on the partition)
    "manual": ("Manual prompt (raw)", False),
    "manual-cal": ("Manual prompt (contextual calibration)", False),
    "fedavg-bbt": ("FedAvg-BBT", True),
    "fedavg-bbt-2x": ("FedAvg-BBT, query-matched (2I iterations)", True),
    "fedbpt": ("FedBPT (clean loss uploaded, paper)", True),
    "fedbpt-ratio": ("FedBPT (ratio uploaded, authors' code)", True),
    "fedbpt-rp0": ("FedBPT, r_p = 0 (server CMA-ES only)", True),
    "central": ("Centralised BBT (1 client, pooled data; upper bound)", False),
    "local": ("Local-only BBT (personalised: own test shard, pooled)", True),
}
REFERENCE, MATCHED, HEADLINE = "fedavg-bbt", "fedavg-bbt-2x", "fedbpt"
BLACK_BOX = ("fedavg-bbt", "fedavg-bbt-2x", "fedbpt", "fedbpt-ratio", "fedbpt-rp0", "central")
SKEWED = 0.8  # a client is "one-class" when its largest class holds >= 80 % of its few-shot examples


# ---------------------------------------------------------------- jobs


def part_key(arm: str, alpha: str) -> str:
    return f"a{alpha}" if ARMS[arm][1] else "shared"


def job_name(model: str, task: str, part: str, arm: str, seed: int) -> str:
    return f"{model}__{task}__{part}__{arm}__s{seed}"


def arm_overrides(args, model: str, task: str, arm: str) -> list[str]:
    """The arm's method settings on top of the common ones; every trained arm has the same d, m, lambda."""
    adapter = [f"method.adapter.num_tokens={args.tokens}", f"method.adapter.intrinsic_dim={args.dim}"]
    cmaes = [*adapter, f"method.trainer.iterations={args.iterations}", f"method.trainer.popsize={args.popsize}",
             "method.trainer.evaluate_start=true"]  # clean loss of the incoming global z on each client's data
    calibrated = ["model.calibration=contextual"]
    trained_readout = calibrated if model == "smollm2" else []
    rp = TASKS[task]["perturb"]
    return {
        "manual": ["method.name=manual-prompt", "federation.rounds=1", "evaluation.round_zero=false"],
        "manual-cal": ["method.name=manual-prompt", "federation.rounds=1", "evaluation.round_zero=false",
                       *calibrated],
        "fedavg-bbt": ["method.name=fedavg-bbt", *cmaes, *trained_readout],
        "fedavg-bbt-2x": ["method.name=fedavg-bbt", *cmaes, f"method.trainer.iterations={2 * args.iterations}",
                          *trained_readout],
        "fedbpt": ["method.name=fedbpt", *cmaes, f"method.trainer.perturb_rate={rp}",
                   "method.trainer.server_fitness=clean", *trained_readout],
        "fedbpt-ratio": ["method.name=fedbpt", *cmaes, f"method.trainer.perturb_rate={rp}",
                         "method.trainer.server_fitness=ratio", *trained_readout],
        "fedbpt-rp0": ["method.name=fedbpt", *cmaes, "method.trainer.perturb_rate=0.0", *trained_readout],
        # FedAvg over one client: BBT on the pooled few-shot set, T rounds of I iterations (paths reset per round)
        "central": ["method.name=fedavg-bbt", *cmaes, "federation.num_clients=1", *trained_readout],
        # BBT on each client alone (post-tuning after one no-training round): T*I iterations of lambda candidates
        # from z = 0 with sigma = 1 on all its examples (no dev split), scored on its own test shard
        "local": ["method.name=bbt-local", *adapter, f"method.post_tuning.popsize={args.popsize}",
                  f"method.post_tuning.iterations={args.rounds * args.iterations}", "method.post_tuning.sigma=1.0",
                  "method.post_tuning.shots=100000", "method.post_tuning.select=last", "federation.rounds=1",
                  "evaluation.local=true", "evaluation.round_zero=false", *trained_readout],
    }[arm]


def overrides(args, model: str, task: str, part: str, arm: str, seed: int) -> list[str]:
    t = TASKS[task]
    max_test = args.max_test if args.max_test is not None else t["max_test"]
    common = [f"seed={seed}", f"task.name={task}", "task.few_shot=40", f"task.max_length={t['max_length']}",
              *([f"task.max_test={max_test}"] if max_test else []), f"model.name={model}",
              *([f"model.pooling={args.pooling}"] if model == "minilm" and args.pooling != "none" else []),
              "federation.num_clients=10", f"federation.rounds={args.rounds}", f"evaluation.every={args.every}",
              "evaluation.local=false", f"evaluation.batch_size={args.eval_batch}", "evaluation.report=false",
              "runtime.progress=false", f"runtime.threads={args.threads}", f"runtime.device={args.device}"]
    if part.startswith("a"):
        alpha = part[1:]
        common += ["federation.partition.scheme=dirichlet", f"federation.partition.alpha={alpha}",
                   f"federation.partition.min_size={ALPHAS[alpha]}"]
    else:
        common.append("federation.partition.scheme=iid")
    placement = [f"method.adapter.placement={args.placement}"] \
        if model == "smollm2" and args.placement != "prefix" and not arm.startswith("manual") else []
    return common + arm_overrides(args, model, task, arm) + placement  # later overrides win


def plan(args) -> list[tuple[str, str, str, str, int]]:
    """(model, task, part, arm, seed): model by model, seeds outermost, partition-free arms once per seed."""
    jobs = []
    for model in args.models:
        for seed in args.seeds:
            for task in args.tasks:
                for arm in args.arms:
                    if not ARMS[arm][1]:
                        jobs.append((model, task, "shared", arm, seed))
                for alpha in args.alphas:
                    jobs += [(model, task, f"a{alpha}", arm, seed) for arm in args.arms if ARMS[arm][1]]
    return jobs


def run_job(args, model: str, task: str, part: str, arm: str, seed: int) -> str:
    out = Path(args.runs_dir) / job_name(model, task, part, arm, seed)
    line = run_config(out, overrides(args, model, task, part, arm, seed))
    if args.post_hoc and (out / "summary.json").exists():
        post_hoc(out, arm, args.threads)
    return line


# ---------------------------------------------------------------- post-hoc scores of a finished run


def _scores(clf, params, enc, batch_size: int) -> dict:
    """Accuracy, mean CE and the class histogram of the predictions of ``params`` on ``enc``."""
    import torch
    import torch.nn.functional as F

    hist, correct, loss = [0] * clf.task.num_classes, 0, 0.0
    with torch.no_grad():
        for start in range(0, len(enc), batch_size):
            b = clf.batch(enc, list(range(start, min(start + batch_size, len(enc)))))
            logits = clf.logits(params, b).float()
            pred = logits.argmax(-1)
            loss += F.cross_entropy(logits, b["labels"], reduction="sum").item()
            correct += (pred == b["labels"]).sum().item()
            for c in pred.tolist():
                hist[c] += 1
    return {"accuracy": correct / len(enc), "loss": loss / len(enc), "pred_hist": hist}


def post_hoc(out: Path, arm: str, threads: int) -> dict:
    """``posthoc.json``: the clients' label histograms and, for arms with a global prompt, the final global state
    and z = 0 (round 0; FedBPT and manual arms only) scored on the test set and on the union of the clients'
    training data. Costs one test pass (two with round 0) and a pass over the few-shot set."""
    cache = out / "posthoc.json"
    if cache.exists():
        return json.loads(cache.read_text())
    import torch

    from fedpeft.build import build
    from fedpeft.predict import adapter_params, load_run

    torch.set_num_threads(threads)
    cfg, (_, server, client_states, _) = load_run(out)
    built = build(cfg)
    exp, clf = built.exp, built.exp.classifier
    res: dict = {"label_histograms": exp.label_histograms()}
    if arm != "local":  # local-only's post-tuned prompts are not stored anywhere
        train = clf.encode(exp.task.train)  # the union of the clients' shards (every few-shot example is dealt)
        bs = cfg.evaluation.batch_size
        states = {"final": adapter_params(built.method, server, client_states)}
        if arm == HEADLINE:
            states["round0"] = built.method.initial_params()
        for key, params in states.items():
            res[key] = {"test": _scores(clf, params, exp.test_encoded, bs), "train": _scores(clf, params, train, bs)}
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    tmp.replace(cache)
    return res


# ---------------------------------------------------------------- reading runs


def _label_hist_from_log(out: Path) -> list[list[int]] | None:
    found = re.search(r"label histogram per client \(train\): (\[.*\])", (out / "run.log").read_text())
    return json.loads(found.group(1)) if found else None


def _weighted(values: list[tuple[float, float]]) -> float | None:
    tot = sum(w for _, w in values)
    return sum(v * w for v, w in values) / tot if tot else None


def load(out: Path, arm: str) -> dict | None:
    """The numbers of one finished run (None while it is not finished)."""
    if not (out / "summary.json").exists():
        return None
    summary = json.loads((out / "summary.json").read_text())
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_recs = [r for r in recs if r["round"] > 0]
    post = json.loads((out / "posthoc.json").read_text()) if (out / "posthoc.json").exists() else {}
    hist = post.get("label_histograms") or summary.get("label_histograms") or {}
    train_hist = hist.get("train") or _label_hist_from_log(out)
    last = recs[-1]
    row = {"acc": last["accuracy"], "initial": summary.get("initial_accuracy"),
           "curve": {r["round"]: r["accuracy"] for r in recs if r["accuracy"] is not None},
           "up": summary["bytes_up_per_client_round"], "down": summary["bytes_down_per_client_round"],
           "up_tensor": summary.get("upload_tensor_bytes"), "trainable": summary["trainable_params"],
           "wall": summary["wall_seconds"], "backbone_unchanged": summary.get("backbone_unchanged"),
           "lost": sum(r.get("num_failed", 0) + r.get("num_rejected", 0) for r in train_recs)}
    if hist.get("test"):  # the best constant prediction: the most frequent label of the whole test set
        pooled = [sum(col) for col in zip(*hist["test"])]
        row["majority_class"] = max(pooled) / sum(pooled)
    if arm == "local":  # personalised: each client's post-tuned prompt on its own test shard, pooled
        per = {int(c): a for c, a in last["local_accuracy"].items() if a is not None and a == a}
        test_hist = hist.get("test")
        if test_hist and train_hist:
            row["acc"] = _weighted([(a, sum(test_hist[c])) for c, a in per.items()])
            row["majority"] = sum(h[max(range(len(tr)), key=tr.__getitem__)] for h, tr in zip(test_hist, train_hist)) \
                / sum(sum(h) for h in test_hist)  # each client's majority training label on its own test shard
        else:  # no histograms: unweighted mean over the clients
            row["acc"] = statistics.fmean(per.values()) if per else None
        row["queries"] = None
        return row
    ok = [c for r in train_recs for c in r["clients"] if c["status"] == "ok"]
    if ok and "candidates" in ok[0]:
        start = 1 if "start_loss" in ok[0] else 0  # the diagnostic clean loss of the incoming z: not the method's
        row["candidates"] = statistics.fmean(c["candidates"] for c in ok) - start
        row["queries"] = statistics.fmean(c["queries"] for c in ok) - start
        row["rows"] = statistics.fmean(c["examples"] - start * c.get("num_examples", 0) for c in ok)
    else:
        row["queries"] = None
    # training loss of the global state on the union of the client data: the clients' clean loss of the incoming
    # z_{r-1} at round r, weighted by their sizes (= the state after round r-1), then the final state post hoc
    union = {}
    for r in train_recs:
        vals = [(c["start_loss"], c.get("num_examples", 1)) for c in r["clients"]
                if c["status"] == "ok" and "start_loss" in c]
        if vals:
            union[r["round"] - 1] = _weighted(vals)
    if "final" in post:
        union[train_recs[-1]["round"] if train_recs else 0] = post["final"]["train"]["loss"]
        row["pred_share"] = max(post["final"]["test"]["pred_hist"]) / sum(post["final"]["test"]["pred_hist"])
    if "round0" in post:
        row["pred_share0"] = max(post["round0"]["test"]["pred_hist"]) / sum(post["round0"]["test"]["pred_hist"])
        union.setdefault(0, post["round0"]["train"]["loss"])
    row["union_loss"] = union
    row["client_loss"] = [r.get("train_loss") for r in train_recs]
    servers = [r.get("server", {}) for r in train_recs]
    row["sigma"] = servers[-1].get("sigma") if servers else None
    sp = [s["sigma_prime"] for s in servers if "sigma_prime" in s]
    row["sigma_prime"] = (sp[0], sp[-1]) if sp else None
    row["client_sigma"] = statistics.fmean(c["final_sigma"] for c in ok if "final_sigma" in c) \
        if any("final_sigma" in c for c in ok) else None
    if arm.startswith("fedbpt") and train_hist:  # server parents: best floor(|S|/2) by the uploaded loss
        skewed = {k for k, h in enumerate(train_hist) if sum(h) and max(h) / sum(h) >= SKEWED}
        key = "ratio_loss" if arm == "fedbpt-ratio" else "train_loss"
        parents = [c["client"] for r in train_recs
                   for c in sorted((c for c in r["clients"] if c["status"] == "ok"), key=lambda c: c[key])
                   [: r["num_ok"] // 2]]
        row["parents_skewed"] = sum(c in skewed for c in parents) / max(1, len(parents))
        row["clients_skewed"] = len(skewed) / len(train_hist)
    return row


# ---------------------------------------------------------------- statistics


def diff_ci(d: list[float]) -> tuple[float, float, float] | None:
    """(mean, low, high) of paired differences with a 95 % t-interval (None below 2 pairs)."""
    if len(d) < 2:
        return None
    m = statistics.fmean(d)
    half = t95(len(d)) * statistics.stdev(d) / math.sqrt(len(d))
    return m, m - half, m + half


def paired(xs: dict, ys: dict, scale: float = 100.0) -> tuple[str, list[float]]:
    """Mean paired difference x - y (seeds present in both) in points with a 95 % t-interval, and the list."""
    d = [scale * (xs[s] - ys[s]) for s in sorted(xs) if s in ys and xs[s] is not None and ys[s] is not None]
    ci = diff_ci(d)
    if ci is None:
        return ("–" if not d else f"{d[0]:+.1f} (n=1)"), d
    return f"{ci[0]:+.1f} [{ci[1]:+.1f}, {ci[2]:+.1f}] (n={len(d)})", d


def verdict(d: list[float], n_seeds: int, sign: int = 1) -> str:
    """The criterion 'sign * mean difference > 0' over the paired seeds."""
    if len(d) < n_seeds:
        return f"pending ({len(d)}/{n_seeds} seeds)"
    ci = diff_ci(d)
    if ci is None:
        return "undecided (one seed)"
    lo, hi = (ci[1], ci[2]) if sign > 0 else (-ci[2], -ci[1])
    return "**holds**" if lo > 0 else ("**reversed**" if hi < 0 else "not shown (the interval includes 0)")


# ---------------------------------------------------------------- the results file


def _ms(xs, digits: int = 1, scale: float = 100.0) -> str:
    return mean_std([x for x in xs if x is not None], scale=scale, digits=digits)


def _num(x, fmt: str = ".3g") -> str:
    return "–" if x is None else format(x, fmt)


def criteria_text(args) -> list[str]:
    return [
        "## Criteria (fixed before the runs)",
        "",
        "Each is read per model, task and α from the final round (never the best round), over the paired seeds "
        f"{args.seeds}; 'holds' means the 95 % t-interval of the paired difference lies above 0, 'reversed' below 0, "
        "'not shown' that it contains 0; a criterion with missing seeds is 'pending'. Each interval is per "
        "comparison (3 criteria × tasks × α, not corrected for multiple comparisons): read a single 'holds' at the "
        "edge with that in mind.",
        "",
        "1. **FedBPT > FedAvg-BBT**: accuracy of FedBPT (clean loss uploaded, the paper's algorithm) minus FedAvg-BBT "
        "of the same seed > 0 (the paper: +2.3 points SST-2, +4.6 AG News, RoBERTa-large, α = 1.0). Also shown "
        "against the query-matched FedAvg-BBT (2I iterations), since FedBPT spends two forwards per candidate.",
        "2. **FedBPT > its own round 0**: FedBPT's final accuracy minus its round-0 accuracy (z = 0, the prompt "
        "p₀ before any search) > 0.",
        "3. **With r_p > 0 the dominant-class share of the predictions falls**: the largest share of one class "
        "among FedBPT's test predictions minus that of FedBPT with r_p = 0 (same seed) < 0. Predictions are not "
        "in `metrics.jsonl`; the post-hoc pass scores the final global prompt once more (`posthoc.json`).",
        "",
    ]


def render(args) -> Path:
    runs = Path(args.runs_dir)
    scale = "paper scale" if args.paper_scale else "CPU scale"
    lines = [f"# FedBPT with a search budget matched to the dimension ({scale})",
             "", f"Rendered with: `python benchmarks/fedbpt.py {' '.join(args.argv)}`", ""]
    notes = Path(args.notes) if args.notes else None
    if notes and notes.exists():
        lines += [notes.read_text().strip(), ""]
    evals = args.rounds * args.iterations * args.popsize
    lines += [
        f"Setup: few-shot 40 examples per class in total (SST-2 80, AG News 160) drawn before partitioning, 10 clients "
        f"all participating every round, label-skew Dirichlet α ∈ {{{', '.join(args.alphas)}}} (min size "
        f"{', '.join(f'{ALPHAS[a]} at α = {a}' for a in args.alphas)}). Budget: d = {args.dim}, m = {args.tokens} "
        f"prompt rows, λ = {args.popsize}, I = {args.iterations}, T = {args.rounds}, i.e. {evals} candidate "
        f"evaluations per client ({evals / args.dim:.1f}·d; paper 8,000 at d = 500, 16·d); σ₁ = 1, z₀ = 0, "
        f"A ~ N(0, (σ_emb/√d)²) from the run seed; r_p = {TASKS['sst2']['perturb']} (SST-2) / "
        f"{TASKS['agnews']['perturb']} (AG News), the paper's best; server σ′ by Eq. 16 on the best half with equal "
        "weights, ratio σ transfer, full covariance. Test: the full SST-2 dev set (872) and 1,000 stratified AG News "
        f"test examples (inputs truncated to {TASKS['sst2']['max_length']} tokens), evaluated at round 0 and every "
        f"{args.every} rounds; **final round only**; cells are mean ± standard deviation over the seeds done. One "
        "run's test accuracy has a binomial standard error of at most 1.7 points (SST-2, 872) / 1.6 (AG News, "
        "1,000). MiniLM: similarity readout pooled over "
        f"{'text positions only (`model.pooling=text`)' if args.pooling == 'text' else f'pooling `{args.pooling}`'}; "
        "SmolLM2-135M: next-token verbalizer with contextual calibration on every arm but the raw manual prompt. "
        f"Seeds {args.seeds}, paired: every arm of a seed shares the few-shot set, the partition, A and z₀, and "
        "the black-box arms draw the same CMA-ES sampling noise per (round, client) (perturbations have their own "
        "stream). "
        f"Device {args.device}, {args.threads} torch thread(s) per job, {args.workers} job(s) at once.",
        "",
        "Arms: FedAvg-BBT averages the clients' (z, σ, C) weighted by n_k; its query-matched variant runs 2I local "
        "iterations (as many candidate forwards as FedBPT's clean + perturbed pair). Centralised BBT = FedAvg over a "
        "single client holding the whole few-shot set (same T, I, λ; evolution paths restart each round). Local-only "
        f"BBT = each client alone, {args.rounds * args.iterations} CMA-ES iterations of λ = {args.popsize} from z = 0 "
        "with σ = 1 on all its examples (pycma-style log weights), scored on its own test shard (the test set split "
        "like its training labels) and pooled: a personalised number, not the global test accuracy of the other rows; "
        "the per-client majority label (no model) is its reference. Manual prompts and centralised BBT do not "
        "depend on the partition: the same runs appear under both α.",
        "",
    ]
    verdicts, body = [], []
    for model in args.models:
        for task in args.tasks:
            for alpha in args.alphas:
                body += section(args, runs, model, task, alpha, verdicts)
    lines += criteria_text(args)
    if verdicts:
        lines += ["Where they stand (paired differences in points, shares in points of the test set):", "",
                  "| model | task | α | 1. FedBPT − FedAvg-BBT | 1'. FedBPT − FedAvg-BBT (query-matched) | "
                  "2. FedBPT final − round 0 | 3. dominant-class share, r_p > 0 − r_p = 0 |",
                  "|---|---|---|---|---|---|---|", *verdicts, ""]
    lines += body + costs(args, runs)
    unchanged = [r["backbone_unchanged"] for r in _all_rows(args, runs) if r.get("backbone_unchanged") is not None]
    lines += [f"All {len(unchanged)} finished runs left the backbone checksum unchanged: "
              f"{all(unchanged) if unchanged else 'n/a'}.", ""]
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out


def _load(args, runs: Path, model: str, task: str, part: str, arm: str, seed: int) -> dict | None:
    """A finished run of exactly this benchmark's config (another config is an error, never mixed in)."""
    out = runs / job_name(model, task, part, arm, seed)
    return load(out, arm) if finished(out, overrides(args, model, task, part, arm, seed)) else None


def _all_rows(args, runs: Path) -> list[dict]:
    return [r for j in plan(args) if (r := _load(args, runs, *j))]


def _done(args, runs: Path, model: str, task: str, alpha: str, arm: str) -> dict[int, dict]:
    part = part_key(arm, alpha)
    return {s: r for s in args.seeds if (r := _load(args, runs, model, task, part, arm, s))}


def section(args, runs: Path, model: str, task: str, alpha: str, verdicts: list[str]) -> list[str]:
    n = len(args.seeds)
    done = {arm: _done(args, runs, model, task, alpha, arm) for arm in args.arms}
    ref = done.get(REFERENCE, {})
    matched = done.get(MATCHED, {})
    lines = [f"## {model}, {task}, α = {alpha}", "",
             "| arm | seeds done | final acc % | round 0 % | Δ vs FedAvg-BBT, points [95 % CI] | "
             "Δ vs query-matched FedAvg-BBT | Δ final − round 0 |", "|---|---|---|---|---|---|---|"]
    for arm in args.arms:
        rows = done[arm]
        status = f"{len(rows)}/{n} " + ("complete" if len(rows) == n else "**incomplete**")
        if not rows:
            lines.append(f"| {ARMS[arm][0]} | {status} | – | – | – | – | – |")
            continue
        acc = {s: r["acc"] for s, r in rows.items()}
        vs_ref = paired(acc, {s: r["acc"] for s, r in ref.items()})[0] \
            if arm not in (REFERENCE, "local") and ref else "–"  # local-only is personalised: not comparable
        vs_m = paired(acc, {s: r["acc"] for s, r in matched.items()})[0] \
            if arm.startswith("fedbpt") and matched else "–"
        init = {s: r["initial"] for s, r in rows.items() if r.get("initial") is not None}
        vs_0 = paired({s: acc[s] for s in init}, init)[0] if init else "–"
        lines.append(f"| {ARMS[arm][0]} | {status} | {_ms(acc.values())} | {_ms(init.values()) if init else '–'} | "
                     f"{vs_ref} | {vs_m} | {vs_0} |")
    majority = {s: r["majority_class"] for rows in done.values() for s, r in rows.items() if "majority_class" in r}
    if majority:
        lines.append(f"| majority class (most frequent test label; no model) | {len(majority)}/{n} | "
                     f"{_ms(majority.values())} | – | – | – | – |")
    if done.get("local"):
        maj = [r.get("majority") for r in done["local"].values()]
        if any(m is not None for m in maj):
            lines.append(f"| per-client majority label on its own test shard (no model; reference for local-only) | "
                         f"{len(maj)}/{n} | {_ms(maj)} | – | – | – | – |")
            local = {s: r["acc"] for s, r in done["local"].items()}
            gain = paired(local, {s: r.get("majority") for s, r in done["local"].items()})[0]
            lines += ["", f"Local-only BBT − the per-client majority label, paired (personalised accuracy): {gain}."]
    lines += pairing_check(done)
    # criteria
    bpt = done.get(HEADLINE, {})
    c1 = paired({s: r["acc"] for s, r in bpt.items()}, {s: r["acc"] for s, r in ref.items()})
    c1m = paired({s: r["acc"] for s, r in bpt.items()}, {s: r["acc"] for s, r in matched.items()})
    c2 = paired({s: r["acc"] for s, r in bpt.items() if r.get("initial") is not None},
                {s: r["initial"] for s, r in bpt.items() if r.get("initial") is not None})
    rp0 = done.get("fedbpt-rp0", {})
    c3 = paired({s: r.get("pred_share") for s, r in bpt.items()}, {s: r.get("pred_share") for s, r in rp0.items()})
    if HEADLINE in args.arms:
        verdicts.append(f"| {model} | {task} | {alpha} | {c1[0]}: {verdict(c1[1], n)} | {c1m[0]}: "
                        f"{verdict(c1m[1], n)} | {c2[0]}: {verdict(c2[1], n)} | {c3[0]}: {verdict(c3[1], n, -1)} |")
    # curves
    rounds = sorted({k for rows in done.values() for r in rows.values() for k in r["curve"]
                     if len(r["curve"]) > 2})
    if rounds:
        lines += ["", "Mean test accuracy per evaluated round (%; local-only and manual prompts are single numbers):",
                  "", "| arm | " + " | ".join(str(k) for k in rounds) + " |", "|---|" + "---|" * len(rounds)]
        for arm, rows in done.items():
            if rows and len(next(iter(rows.values()))["curve"]) > 2:
                cells = [_ms([r["curve"].get(k) for r in rows.values()]) if all(k in r["curve"] for r in rows.values())
                         else "–" for k in rounds]
                lines.append(f"| {ARMS[arm][0]} | " + " | ".join(cells) + " |")
    # diagnostics of the black-box arms
    diag = [(arm, rows) for arm, rows in done.items() if arm in BLACK_BOX and rows]
    if diag:
        lines += ["", "Diagnostics (mean ± std over the seeds done): training loss of the global prompt on the union "
                  "of the client data at round 0 and after the last round; mean client loss at its own final local "
                  "z in the last round; dominant-class share of the test predictions at round 0 (z = 0) and after "
                  "the last round; final server σ (FedBPT: on the client scale) and σ′ (Eq. 16) in the first and "
                  "last round; each client's σ at the end of its local search, averaged over all clients and rounds; "
                  "share of one-class clients (≥ 80 % one label) among the server's parents over all rounds vs "
                  "among all clients (no information where every client is one-class, as in some α = 0.1 seeds).",
                  "",
                  "| arm | union train loss r0 → final | client loss, last round | "
                  "dominant pred. share r0 → final | σ final | σ′ first → last | local σ (all rounds) | "
                  "one-class share: parents / clients |",
                  "|---|---|---|---|---|---|---|---|"]
        for arm, rows in diag:
            rs = list(rows.values())
            u0 = [r["union_loss"].get(0) for r in rs]
            uf = [r["union_loss"][max(r["union_loss"])] if r["union_loss"] else None for r in rs]
            cl = [r["client_loss"][-1] if r["client_loss"] else None for r in rs]
            sh0 = [r.get("pred_share0") for r in rs]
            sh = [r.get("pred_share") for r in rs]
            sp = [r["sigma_prime"] for r in rs if r.get("sigma_prime")]
            skew = [r.get("parents_skewed") for r in rs]
            skew_cell = (_ms(skew, 2, 1) + " / " + _ms([r.get("clients_skewed") for r in rs], 2, 1)) \
                if any(x is not None for x in skew) else "–"
            lines.append(
                f"| {ARMS[arm][0]} | {_ms(u0, 3, 1)} → {_ms(uf, 3, 1)} | {_ms(cl, 3, 1)} | "
                f"{_ms(sh0, 2, 1) if any(x is not None for x in sh0) else '–'} → {_ms(sh, 2, 1)} | "
                f"{_ms([r.get('sigma') for r in rs], 3, 1)} | "
                f"{(_ms([a for a, _ in sp], 3, 1) + ' → ' + _ms([b for _, b in sp], 3, 1)) if sp else '–'} | "
                f"{_ms([r.get('client_sigma') for r in rs], 3, 1)} | "
                f"{skew_cell} |")
    return lines + [""]


def pairing_check(done: dict[str, dict[int, dict]]) -> list[str]:
    """Every black-box run of a seed starts from the same z₀ = 0 through the same A on the same test set and few-shot
    data: their round-0 test accuracy and round-0 union training loss must agree (a broken pairing shows here)."""
    bad, checked = [], 0
    for seed in sorted({s for arm in BLACK_BOX for s in done.get(arm, {})}):
        rows = {arm: done[arm][seed] for arm in BLACK_BOX if seed in done.get(arm, {})}
        acc0 = {arm: r["initial"] for arm, r in rows.items() if r.get("initial") is not None}
        loss0 = {arm: r["union_loss"].get(0) for arm, r in rows.items() if r["union_loss"].get(0) is not None}
        checked += len(acc0) > 1
        if max(acc0.values(), default=0) - min(acc0.values(), default=0) > 1e-9:
            bad.append(f"seed {seed} round-0 accuracy {acc0}")
        if max(loss0.values(), default=0) - min(loss0.values(), default=0) > 1e-5:
            bad.append(f"seed {seed} round-0 union loss {loss0}")
    if not checked:
        return []
    return ["", "Pairing check (the black-box runs of a seed share z₀, A, the few-shot set and the test set): "
            + ("round-0 test accuracy and union training loss agree across arms in every seed." if not bad
               else "**mismatch**: " + "; ".join(bad))]


def costs(args, runs: Path) -> list[str]:
    lines = ["## Communication and forward passes per client-round", "",
             "Bytes are the real encoded messages (float32 wire) per client and round, uplink with its tensor part; "
             "candidate evaluations = prompts scored on the client's whole local set (FedBPT: clean and perturbed "
             "count separately, plus the final mean's clean and perturbed losses); forward calls = stacked batches "
             "(all λ candidates in one forward); both without the diagnostic loss of the incoming z.", "",
             "| model | task | arm | uplink B (tensors) | downlink B | candidate evaluations | forward calls | "
             "rows scored | trainable | wall s per run | failed or rejected client-rounds |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in args.models:
        for task in args.tasks:
            for arm in args.arms:
                parts = {part_key(arm, alpha): alpha for alpha in args.alphas}  # a shared run once
                rows = [r for alpha in parts.values() for r in _done(args, runs, model, task, alpha, arm).values()]
                if not rows:
                    continue

                def avg(key: str, fmt: str) -> str:
                    vals = [r[key] for r in rows if r.get(key) is not None]
                    return _num(statistics.fmean(vals) if vals else None, fmt)
                cand = avg("candidates", ".1f")
                if arm == "local":  # post-tuning's queries are not in metrics.jsonl; its budget by construction
                    cand = f"{args.rounds * args.iterations * args.popsize} in total (T·I·λ)"
                lines.append(
                    f"| {model} | {task} | {ARMS[arm][0]} | {avg('up', ',.0f')} ({_num(rows[0]['up_tensor'], ',')}) | "
                    f"{avg('down', ',.0f')} | {cand} | {avg('queries', '.1f')} | {avg('rows', '.0f')} | "
                    f"{rows[0]['trainable']:,} | {avg('wall', ',.0f')} | {sum(r['lost'] for r in rows)} |")
    return lines + [""]


def completeness(args) -> str:
    runs = Path(args.runs_dir)
    jobs = plan(args)
    done = sum((runs / job_name(*j) / "summary.json").exists() for j in jobs)
    started = sum((runs / job_name(*j) / "config.yaml").exists() and not (runs / job_name(*j) / "summary.json").exists()
                  for j in jobs)
    lines = [f"{done}/{len(jobs)} runs finished, {started} started and unfinished (resumed by the next invocation)"]
    for model in args.models:
        for task in args.tasks:
            for alpha in args.alphas:
                for arm in args.arms:
                    k = sum((runs / job_name(model, task, part_key(arm, alpha), arm, s) / "summary.json").exists()
                            for s in args.seeds)
                    if k < len(args.seeds):
                        lines.append(f"  incomplete: {model} {task} α={alpha} {arm}: {k}/{len(args.seeds)} seeds")
    return "\n".join(lines)


# ---------------------------------------------------------------- command line


def parse(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs-dir", default=None, help="run directories (default runs/fedbpt, paper scale "
                                                    "runs/fedbpt-paper)")
    p.add_argument("--results", default=None, help="results file (default benchmarks/results/fedbpt.md, paper "
                                                    "scale fedbpt_paper_scale.md)")
    p.add_argument("--notes", default=None, help="text put under the header (default results/fedbpt_notes.md, "
                                                 "paper scale fedbpt_paper_scale_notes.md)")
    p.add_argument("--models", nargs="+", default=["minilm"], choices=MODELS)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--alphas", nargs="+", default=list(ALPHAS), choices=list(ALPHAS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), metavar="ARM",
                   help=f"arms to run and show (default all: {' '.join(ARMS)})")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--paper-scale", action="store_true", help="d = 500, m = 50, I = 8, lambda = 5, T = 200, "
                   "every 10, device cuda (each overridable by its flag)")
    for name, kind in (("dim", int), ("tokens", int), ("iterations", int), ("popsize", int), ("rounds", int),
                       ("every", int), ("device", str)):
        p.add_argument(f"--{name}", type=kind, default=None,
                       help=f"default {SCALES['cpu'][name]} ({SCALES['paper'][name]} with --paper-scale)")
    p.add_argument("--max-test", type=int, default=None, help="cap both test sets (smoke tests; default: SST-2 "
                                                               "all 872, AG News 1000)")
    p.add_argument("--pooling", default="text", choices=["text", "all", "none"],
                   help="MiniLM model.pooling (none: leave the library default, for a library without the key)")
    p.add_argument("--placement", default="prefix", choices=["prefix", "suffix"],
                   help="SmolLM2 projected prompt: prefix (paper; no override) or suffix (method.adapter.placement="
                        "suffix: the text's key/value cache shared by the candidates; not the paper's placement)")
    p.add_argument("--eval-batch", type=int, default=100)
    p.add_argument("--threads", type=int, default=1, help="torch threads per job")
    p.add_argument("--workers", type=int, default=2, help="jobs at once, one process each")
    p.add_argument("--no-post-hoc", dest="post_hoc", action="store_false",
                   help="skip the post-hoc scoring after each run (dominant-class share, final union loss)")
    p.add_argument("--post-hoc-missing", action="store_true",
                   help="with --render-only: compute posthoc.json for finished runs that lack it")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--plan", action="store_true", help="print the jobs and exit")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    scale = SCALES["paper" if args.paper_scale else "cpu"]
    for key in ("dim", "tokens", "iterations", "popsize", "rounds", "every", "device", "runs_dir", "results"):
        if getattr(args, key) is None:
            setattr(args, key, str(scale[key]) if key == "results" else scale[key])
    if args.notes is None:
        args.notes = str(Path(args.results).with_name(Path(args.results).stem + "_notes.md"))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    jobs = plan(args)
    if args.plan:
        for j in jobs:
            print(job_name(*j), " ".join(overrides(args, *j)))
        print(f"{len(jobs)} jobs")
        return
    if args.render_only and args.post_hoc_missing:
        for j in jobs:
            out = Path(args.runs_dir) / job_name(*j)
            if (out / "summary.json").exists() and not (out / "posthoc.json").exists():
                post_hoc(out, j[3], args.threads)
    if not args.render_only:
        run_pool(run_job, [(args, *j) for j in jobs], args.workers)
    print(f"wrote {render(args)}")
    print(completeness(args))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
