"""The FedBPT benchmark's results file (``benchmarks/fedbpt.py``): each finished run's numbers and budget, the
per-client majority baseline, the paired criteria with their verdicts, accuracy curves, diagnostics, costs, the
budget differences the grid declares between paired arms, and which rows are complete."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from benchmarks.budget import budget_cell, measured, mixed_pairs
from benchmarks.fedbpt_arms import (ALPHAS, ARMS, BLACK_BOX, HEADLINE, MATCHED, REFERENCE, TASKS, job_name, overrides,
                                     part_key, plan)
from benchmarks.runner import finished
from benchmarks.stats import mean_std, paired_cell, paired_ci

SKEWED = 0.8  # a client is "one-class" when its largest class holds >= 80 % of its few-shot examples


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
           "lost": sum(r.get("num_failed", 0) + r.get("num_rejected", 0) for r in train_recs), "budget": measured(out)}
    test_hist = hist.get("test")
    if test_hist:  # the best constant prediction: the most frequent label of the whole test set
        pooled = [sum(col) for col in zip(*test_hist)]
        row["majority_class"] = max(pooled) / sum(pooled)
    if test_hist and train_hist:  # each client's majority training label on its own test shard, pooled
        row["majority"] = sum(h[max(range(len(tr)), key=tr.__getitem__)] for h, tr in zip(test_hist, train_hist)) \
            / sum(sum(h) for h in test_hist)
    if arm == "local":  # personalised: each client's post-tuned prompt on its own test shard, pooled
        per = {int(c): a for c, a in last["local_accuracy"].items() if a is not None and a == a}
        if test_hist and train_hist:
            row["acc"] = _weighted([(a, sum(test_hist[c])) for c, a in per.items()])
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


def paired(xs: dict, ys: dict, scale: float = 100.0, mixed: int = 0) -> tuple[str, list[float]]:
    """Mean paired difference x - y (seeds present in both) in points with a 95 % t-interval, and the list;
    ``mixed``: how many of the pairs put runs of two devices against each other (said in the cell)."""
    d = [scale * (xs[s] - ys[s]) for s in sorted(xs) if s in ys and xs[s] is not None and ys[s] is not None]
    return paired_cell(d, mixed), d


def cpu_gpu_pairs(rows: dict[int, dict], ref: dict[int, dict]) -> int:
    """How many seeds the runs of two arms finished on two different devices."""
    return mixed_pairs({s: r["budget"].device for s, r in rows.items()},
                       {s: r["budget"].device for s, r in ref.items()})


def verdict(d: list[float], n_seeds: int, sign: int = 1) -> str:
    """The criterion 'sign * mean difference > 0' over the paired seeds."""
    if len(d) < n_seeds:
        return f"pending ({len(d)}/{n_seeds} seeds)"
    ci = paired_ci(d)
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


def declared_text(args, declared: dict[str, dict[str, str]]) -> list[str]:
    """The budget differences the grid declares between the shown arms and those they are paired with
    (``benchmarks/grids/fedbpt.yaml``), the keys of one reason together; the budget test fails on any other."""
    lines = []
    for arm, keys in declared.items():
        if arm in args.arms:
            why: dict[str, list[str]] = {}
            for key, reason in keys.items():
                why.setdefault(reason, []).append(key)
            lines.append(f"- {ARMS[arm][0]}: " + "; ".join(f"{', '.join(k)} ({r})" for r, k in why.items()) + ".")
    if not lines:
        return []
    return ["Budget differences between paired arms (declared in `benchmarks/grids/fedbpt.yaml` and checked by "
            "`tests/unit/test_grid_budgets.py`, which fails on any other):", "", *lines, ""]


def render(args, declared: dict[str, dict[str, str]] | None = None) -> Path:
    """The results file; ``declared``: the grid's budget differences between paired arms (arm -> {key: why})."""
    runs = Path(args.runs_dir)
    scale = "paper scale" if args.paper_scale else "CPU scale"
    lines = [f"# FedBPT with a search budget matched to the dimension ({scale})",
             "", f"Rendered with: `python -m benchmarks.fedbpt {' '.join(args.argv)}`", ""]
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
        "Budget: the mean local steps and examples a client-round trained on, where the replies report them (the "
        "black-box searches report candidate evaluations instead: see the costs table), and the device.",
        "",
        *declared_text(args, declared or {}),
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
             "Δ vs query-matched FedAvg-BBT | Δ final − round 0 | budget / client-round |",
             "|---|---|---|---|---|---|---|---|"]
    for arm in args.arms:
        rows = done[arm]
        status = f"{len(rows)}/{n} " + ("complete" if len(rows) == n else "**incomplete**")
        if not rows:
            lines.append(f"| {ARMS[arm][0]} | {status} | – | – | – | – | – | – |")
            continue
        acc = {s: r["acc"] for s, r in rows.items()}
        vs_ref = paired(acc, {s: r["acc"] for s, r in ref.items()}, mixed=cpu_gpu_pairs(rows, ref))[0] \
            if arm not in (REFERENCE, "local") and ref else "–"  # local-only is personalised: not comparable
        vs_m = paired(acc, {s: r["acc"] for s, r in matched.items()}, mixed=cpu_gpu_pairs(rows, matched))[0] \
            if arm.startswith("fedbpt") and matched else "–"
        init = {s: r["initial"] for s, r in rows.items() if r.get("initial") is not None}
        vs_0 = paired({s: acc[s] for s in init}, init)[0] if init else "–"
        lines.append(f"| {ARMS[arm][0]} | {status} | {_ms(acc.values())} | {_ms(init.values()) if init else '–'} | "
                     f"{vs_ref} | {vs_m} | {vs_0} | {budget_cell([r['budget'] for r in rows.values()], device=True)} |")
    majority = {s: r["majority_class"] for rows in done.values() for s, r in rows.items() if "majority_class" in r}
    if majority:
        lines.append(f"| majority class (most frequent test label; no model) | {len(majority)}/{n} | "
                     f"{_ms(majority.values())} | – | – | – | – | none |")
    # the partition's: any partitioned run of a seed has its clients' label histograms
    per_client = {s: r["majority"] for arm, rows in done.items() if ARMS[arm][1] for s, r in rows.items()
                  if r.get("majority") is not None}
    if per_client:
        lines.append(f"| per-client majority label on its own test shard (no model; reference for local-only) | "
                     f"{len(per_client)}/{n} | {_ms(per_client.values())} | – | – | – | – | none |")
    if done.get("local") and per_client:
        gain = paired({s: r["acc"] for s, r in done["local"].items()}, per_client)[0]
        lines += ["", f"Local-only BBT − the per-client majority label, paired (personalised accuracy): {gain}."]
    lines += pairing_check(done)
    # criteria
    bpt = done.get(HEADLINE, {})
    c1 = paired({s: r["acc"] for s, r in bpt.items()}, {s: r["acc"] for s, r in ref.items()},
                mixed=cpu_gpu_pairs(bpt, ref))
    c1m = paired({s: r["acc"] for s, r in bpt.items()}, {s: r["acc"] for s, r in matched.items()},
                 mixed=cpu_gpu_pairs(bpt, matched))
    c2 = paired({s: r["acc"] for s, r in bpt.items() if r.get("initial") is not None},
                {s: r["initial"] for s, r in bpt.items() if r.get("initial") is not None})
    rp0 = done.get("fedbpt-rp0", {})
    c3 = paired({s: r.get("pred_share") for s, r in bpt.items()}, {s: r.get("pred_share") for s, r in rp0.items()},
                mixed=cpu_gpu_pairs(bpt, rp0))
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
