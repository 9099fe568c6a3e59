"""The federated LoRA family side by side (benchmarks/results/lora_family.md): the same data, partition, initial
adapter and byte count for FedAvg-LoRA, FFA-LoRA, FedSA-LoRA, HetLoRA, FlexLoRA, FLoRA, head-pruned LoRA and the
exact aggregations FedEx-LoRA and Fed-SB, with full fine-tuning and FedPrompt's soft prompt as reference points; head
pruning's scoring variants; the generation arms on WebNLG.

Criteria, fixed before the runs:
- classification (``family``): MiniLM with a linear task head, ``--clients`` clients (``--per-round`` a round),
  Dirichlet 0.5 label skew (IID in the full grid), ``--rounds`` rounds; the tiered arms put a third of the clients at
  each LoRA rank 4 / 8 / 16 (seeded, the same clients in every tiered arm of a seed); the homogeneous arms train
  rank 4 (the smallest tier: what every client can afford) or 16 (the upper bound). LoRA scaling alpha / r = 2
  everywhere. Reported: the final round's global test accuracy (never the best round) and the mean of the clients'
  accuracies on their own test shards (personalised: FedSA-LoRA's own B and head, each tier's own rank, local-only's
  own adapter), bytes up and down per client-round from the codec, and the upload spent until the global accuracy
  first reaches 95 % of FedAvg-LoRA r = 16's final accuracy of the same seed; each round's aggregation error (the
  broadcast update's relative distance from the exact weighted average of the clients', in one plot per task).
  Fed-SB runs at an r whose upload is >= 10x below FedAvg-LoRA r = 16's and at the r of equal upload. Baselines:
  the majority class and the per-client majority (each client predicts its training shard's majority on its test
  shard).
- head pruning (``headprune``): IID, s = 0.9, random client selection, Eq. 8 aggregation; the paper's confidence
  score against random heads, the lowest-confidence heads, [CLS] and [SEP] both discounted, a per-layer quota;
  paired by seed (same partition, adapter and client sample).
- generation (``generation``): SmolLM2-135M-Instruct on WebNLG's 10 category clients at the generation benchmark's
  budget (``benchmarks/generation.py``; its FedAvg-LoRA = fedit, zero-shot and local-only rows are read from its
  runs), LoRA r = 16 on every linear layer (FedEx-LoRA on the same adapter; Fed-SB on the same modules at an r of
  >= 10x less upload and at fedit's); BLEU on the seen / unseen test categories, final round.
- >= 3 paired seeds; each row says how many are done and on which device.

    python -m benchmarks.lora_family --runs-dir runs/lora_family --workers 2      # CPU cut, resumable
    python -m benchmarks.lora_family --runs-dir runs/lora_family --render-only    # rewrite the table
    python -m benchmarks.lora_family --full --device cuda --workers 8             # the full grid, for a GPU machine
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.budget import Budget, budget_cell, measured, mixed_pairs
from benchmarks.grids import load_grid
from benchmarks.runner import grid_parser, parse_grid_args, run_config, run_grid, write_results
from benchmarks.stats import accuracy_se, mean_std, paired_cell

GRID = load_grid("lora_family")
TIERS, FAMILY, OWN_LR, HEADPRUNE = GRID["tiers"], GRID["family"], GRID["own_lr"], GRID["headprune"]
GENERATION, FROM_GENERATION, TASKS, PARTITIONS = (GRID["generation"], GRID["from_generation"], GRID["tasks"],
                                                  GRID["partitions"])
FAMILY_TASKS = GRID["family_tasks"]  # arms run on some of the family's tasks only
FAMILY_CONTRASTS, GENERATION_CONTRASTS = GRID["family_contrasts"], GRID["generation_contrasts"]
REFERENCE = "FedAvg-LoRA r=16 (all at the largest rank)"
HEADPRUNE_REFERENCES = ("random heads", "fixed random heads", "dense LoRA (no head pruned)")  # the Δ columns
# arms scored only with each client's own adapter: local-only's global adapter is never trained; FedSA-LoRA's keeps B
# at its initial zeros and, classifying, the task head at its initialisation (each client keeps its own)
PERSONAL_ONLY = ("local-only", "FedSA")


def job_name(part: str, task: str, partition: str, arm: str, seed: int) -> str:
    slug = "".join(ch if ch.isalnum() else "-" for ch in arm.lower()).strip("-")
    return f"{part}__{task}__{partition}__{slug}__s{seed}"


def overrides(args, part: str, task: str, partition: str, arm: str, seed: int) -> list[str]:
    if part == "generation":
        from benchmarks import generation

        budget = generation.parse(["--threads", str(args.threads), "--device", args.device])  # its budget, our device
        return generation.overrides(budget, "webnlg", "fedit (LoRA all-linear, FedAvg)", seed) + GENERATION[arm] \
            + ["evaluation.round_zero=false"]  # the zero-shot row is fedit's round 0 in the generation benchmark
    arms = FAMILY if part == "family" else HEADPRUNE
    method = arms[arm] if part == "family" else ["method.name=headprune-rand-cs", *arms[arm]]
    lr = [] if arm in OWN_LR else [f"method.trainer.lr={args.lr}"]
    return [f"task.name={task}", f"task.max_train={args.max_train}", f"task.max_test={args.max_test}",
            f"task.max_length={TASKS[task]}", "model.name=minilm", "model.readout=linear", f"seed={seed}",
            f"federation.num_clients={args.clients}", f"federation.clients_per_round={args.per_round}",
            f"federation.rounds={args.rounds}", f"evaluation.every={args.eval_every}", "evaluation.batch_size=128",
            "runtime.progress=false", f"runtime.threads={args.threads}", f"runtime.device={args.device}",
            *PARTITIONS[partition], *method, *lr, f"method.trainer.batch_size={args.batch}"]


def family_arms(task: str) -> list[str]:
    """The family's arms run on ``task`` (``family_tasks`` in the grid restricts some)."""
    return [a for a in FAMILY if task in FAMILY_TASKS.get(a, [task])]


def plan(args) -> list[tuple[str, str, str, str, int]]:
    """The jobs, arm by arm (every seed of an arm before the next arm), of the arms ``--arms`` names (all)."""
    jobs = []
    if "family" in args.parts:
        jobs += [("family", t, p, a, s) for a in FAMILY for s in args.seeds for t in args.family_tasks
                 for p in args.family_partitions if a in family_arms(t)]
    if "headprune" in args.parts:
        jobs += [("headprune", t, "iid", a, s) for a in HEADPRUNE for s in args.seeds for t in args.headprune_tasks]
    if "generation" in args.parts:
        jobs += [("generation", "webnlg", "category", a, s) for a in GENERATION for s in args.seeds]
    if args.arms is None:
        return jobs
    unknown = [a for a in args.arms if a not in {*FAMILY, *HEADPRUNE, *GENERATION}]
    if unknown:
        raise SystemExit(f"--arms: no arm {unknown} in benchmarks/grids/lora_family.yaml")
    return sorted((j for j in jobs if j[3] in args.arms), key=lambda j: args.arms.index(j[3]))


def contrasts(args) -> list[tuple[str, str, list[str], list[str]]]:
    """(arm, reference, the arm's overrides, the reference's) of every paired contrast the results file reads (on
    the first task of each part: a budget does not depend on the task), for the budget test over the grids."""
    fam = lambda t, a: overrides(args, "family", t, args.family_partitions[0], a, 0)  # noqa: E731
    hp = lambda a: overrides(args, "headprune", args.headprune_tasks[0], "iid", a, 0)  # noqa: E731
    out = []
    for task in args.family_tasks:
        pairs = [(a, REFERENCE) for a in family_arms(task) if a != REFERENCE] + list(FAMILY_CONTRASTS.items())
        out += [(a, r, fam(task, a), fam(task, r)) for a, r in pairs if a in family_arms(task)]
    out += [(a, r, hp(a), hp(r)) for r in HEADPRUNE_REFERENCES for a in HEADPRUNE if a != r]
    from benchmarks import generation

    gen = generation.parse(["--threads", str(args.threads), "--device", args.device])

    def gen_overrides(arm: str) -> list[str]:
        if arm in GENERATION:
            return overrides(args, "generation", "webnlg", "category", arm, 0)
        return generation.overrides(gen, "webnlg", FROM_GENERATION[arm], 0)

    pairs = [(a, FEDIT) for a in GENERATION] + list(GENERATION_CONTRASTS.items())
    return out + [(a, r, gen_overrides(a), gen_overrides(r)) for a, r in pairs]


def run_job(args, *job) -> str:
    return run_config(Path(args.runs_dir) / job_name(*job), overrides(args, *job))


# ---------------------------------------------------------------- the results file


def _records(out: Path) -> tuple[list[dict], dict] | None:
    if not (out / "summary.json").exists():
        return None
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in recs if r["round"] > 0], json.loads((out / "summary.json").read_text())


def _row(out: Path) -> dict | None:
    loaded = _records(out)
    if loaded is None:
        return None
    recs, summary = loaded
    up, curve = 0.0, []
    for r in recs:  # cumulative upload after each round, beside the accuracy reached then
        up += r["bytes_up"]
        if r.get("accuracy") is not None:
            curve.append((r["accuracy"], up))
    kept = [[set(c["kept_head_ids"]) for c in r.get("clients") or [] if c.get("kept_head_ids") is not None]
            for r in recs]
    heads = (statistics.fmean(len(set().union(*k)) for k in kept if k), len(set().union(*sum(kept, [])))) \
        if any(kept) else None
    errors = [(r["round"], r["server"]["aggregation_error"]) for r in recs
              if (r.get("server") or {}).get("aggregation_error") is not None]
    return {"final": recs[-1]["accuracy"], "local": recs[-1].get("local_accuracy_mean"), "curve": curve,
            "errors": errors,
            "up": summary["bytes_up_per_client_round"], "down": summary["bytes_down_per_client_round"],
            "hist": summary["label_histograms"], "device": _device(out), "budget": measured(out), "heads": heads}


def _paired(res: dict[int, dict], ref: dict[int, dict | None], key: str = "final") -> str:
    """The paired cell of arm − reference on ``key`` in points over the seeds both finished, with the pairs that
    mix devices counted."""
    both = [s for s, r in res.items() if r and ref.get(s) and r[key] is not None and ref[s][key] is not None]
    return paired_cell([(res[s][key] - ref[s][key]) * 100 for s in both],
                       mixed_pairs({s: res[s]["device"] for s in both}, {s: ref[s]["device"] for s in both}))


def _budget(done: dict[int, dict]) -> str:
    return budget_cell([r["budget"] for r in done.values()])


def _device(out: Path) -> str:
    import yaml

    return str(yaml.safe_load((out / "config.yaml").read_text())["runtime"]["device"])


def _devices(done: dict) -> str:
    return ", ".join(sorted({r["device"] for r in done.values()}))


def majorities(hist: dict) -> tuple[float, float, int]:
    """(majority class, per-client majority, test size) from a run's per-client label histograms."""
    train, test = hist["train"], hist["test"]
    n = sum(map(sum, test))
    classes = [sum(col) for col in zip(*train)]
    top = max(range(len(classes)), key=classes.__getitem__)
    per_client = sum(te[max(range(len(tr)), key=tr.__getitem__)] for tr, te in zip(train, test))
    return sum(te[top] for te in test) / n, per_client / n, n


def _upload_to(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((up for acc, up in curve if acc >= target), None)


def _mb(x: float | None) -> str:
    return "–" if x is None else f"{x / 1e6:.2f}"


def render(args) -> Path:
    runs = Path(args.runs_dir)
    lines = ["# The federated LoRA family on the same data", "",
             f"Rendered with: `python -m benchmarks.lora_family {' '.join(args.argv)}`", "",
             f"Classification: MiniLM (d = 384, 6 layers) with LoRA on query/key/value and a linear task head; "
             f"{args.clients} clients, {args.per_round} a round, {args.rounds} rounds; AdamW lr {args.lr} (full fine-"
             f"tuning and the soft prompt: their presets' 2e-5 and 0.03), batch {args.batch}, one local epoch; "
             f"train capped at {args.max_train}, test at {args.max_test}. Tiers: a third of the clients at each LoRA "
             "rank 4 / 8 / 16 under a global r = 16. Accuracy: the final round, mean ± std over the finished seeds; "
             "personalised: the mean of the clients' accuracies on their own test shards with what each client runs "
             "(local-only and FedSA-LoRA have no global column: local-only's global adapter is never trained, "
             "FedSA-LoRA's keeps B at zero and the task head at its initialisation, since each client keeps its own). "
             "Bytes: real codec payloads per client-round. 'Upload to target': cumulative upload until the global "
             "accuracy first reaches 95 % of FedAvg-LoRA r = 16's final accuracy of the same seed (evaluated every "
             f"{args.eval_every} rounds).", ""]
    if args.notes and Path(args.notes).exists():
        lines += [Path(args.notes).read_text().strip(), ""]
    for task in args.family_tasks:
        for part in args.family_partitions:
            rows = {a: {s: _row(runs / job_name("family", task, part, a, s)) for s in args.seeds}
                    for a in family_arms(task)}
            any_run = next((r for a in rows.values() for r in a.values() if r), None)
            lines += [f"## {task}, {part}", ""]
            if any_run:
                maj, per_client, n = majorities(any_run["hist"])
                lines += [f"Test n = {n} (standard error of one accuracy ≤ {accuracy_se(n):.1f} points); "
                          f"majority class {maj * 100:.1f} %, per-client majority {per_client * 100:.1f} % "
                          "(personalised).", ""]
            lines += ["| arm | seeds done | global acc % | Δ vs FedAvg-LoRA r=16, paired | personalised acc % | "
                      "MB up / client-round | MB down / client-round | MB uploaded to target | "
                      "aggregation error, final round | budget / client-round | device |",
                      "|---|---|---|---|---|---|---|---|---|---|---|"]
            ref = rows[REFERENCE]
            for arm, res in rows.items():
                done = {s: r for s, r in res.items() if r}
                if not done:
                    lines.append(f"| {arm} | 0/{len(args.seeds)} |" + " – |" * 9)
                    continue
                to = [_upload_to(r["curve"], 0.95 * ref[s]["final"]) for s, r in done.items() if ref.get(s)]
                reached = [x for x in to if x is not None]
                glob = (f"{mean_std([r['final'] for r in done.values()])} | "
                        f"{_paired(done, ref) if arm != REFERENCE else '0'}")
                to_target = f"{_mb(statistics.fmean(reached)) if reached else '–'} ({len(reached)}/{len(to)} reached)"
                if arm.startswith(PERSONAL_ONLY):  # no global model worth scoring: no global column
                    glob, to_target = "– | –", "–"
                lines.append(
                    f"| {arm} | {len(done)}/{len(args.seeds)} | {glob} | "
                    f"{mean_std([r['local'] for r in done.values()])} | "
                    f"{_mb(statistics.fmean(r['up'] for r in done.values()))} | "
                    f"{_mb(statistics.fmean(r['down'] for r in done.values()))} | {to_target} | "
                    f"{_final_error(done)} | {_budget(done)} | {_devices(done)} |")
            lines += ["", *_family_contrasts(rows), "", *_error_plot(args, task, part, rows), ""]
    for task in args.headprune_tasks:
        rows = {a: {s: _row(runs / job_name("headprune", task, "iid", a, s)) for s in args.seeds} for a in HEADPRUNE}
        lines += [f"## Head pruning's scoring, {task}, iid (s = 0.9)", ""]
        any_run = next((r for a in rows.values() for r in a.values() if r), None)
        if any_run:
            maj, _, n = majorities(any_run["hist"])
            lines += [f"Test n = {n} (standard error of one accuracy ≤ {accuracy_se(n):.1f} points); "
                      f"majority class {maj * 100:.1f} %. Heads trained: the distinct heads the round's clients "
                      "kept (mean over the rounds) and over the whole run, of 72.", ""]
        refs = [r for r in HEADPRUNE_REFERENCES if r in rows]
        lines += [f"| scoring | seeds done | global acc % | {' | '.join(f'Δ vs {r}, paired' for r in refs)} | "
                  "heads trained: a round / the run | budget / client-round | device |",
                  "|---|---|---|" + "---|" * len(refs) + "---|---|---|"]
        for arm, res in rows.items():
            done = {s: r for s, r in res.items() if r}
            deltas = " | ".join("0" if arm == r else _paired(done, rows[r]) for r in refs)
            heads = [r["heads"] for r in done.values() if r["heads"]]
            trained = (f"{statistics.fmean(h[0] for h in heads):.1f} / {statistics.fmean(h[1] for h in heads):.1f}"
                       if heads else "–")
            lines.append(f"| {arm} | {len(done)}/{len(args.seeds)} | {mean_std([r['final'] for r in done.values()])} "
                         f"| {deltas} | {trained} | {_budget(done)} | {_devices(done) or '–'} |")
        lines.append("")
    if "generation" in args.parts:
        lines += _generation_rows(args)
    return write_results(args.results, lines)


def _final_error(done: dict[int, dict]) -> str:
    """The relative aggregation error of the final round (``exchange.aggregation_error``), mean over the seeds that
    recorded it ('–': the runs predate the measure, or the arm exchanges no LoRA factors)."""
    last = [r["errors"][-1][1] for r in done.values() if r["errors"]]
    return f"{statistics.fmean(last):.2g}" if last else "–"


def _error_plot(args, task: str, part: str, rows: dict[str, dict[int, dict | None]]) -> list[str]:
    """One plot of every arm's aggregation error per round (mean over its seeds), next to the results file."""
    from benchmarks.svg_plot import line_plot

    series = {}
    for arm, res in rows.items():
        curves = [dict(r["errors"]) for r in res.values() if r and r["errors"]]
        if curves:
            rounds = sorted(set.intersection(*(set(c) for c in curves)))
            series[arm] = [(t, statistics.fmean(c[t] for c in curves)) for t in rounds]
    if not series:
        return []
    name = f"{Path(args.results).stem}_aggregation_error_{task}_{part}.svg"
    line_plot(Path(args.results).parent / name, series, f"Aggregation error per round, {task}, {part}", "round",
              "‖broadcast − exact average‖ / ‖exact average‖", log_y=True)
    missing = [a for a, res in rows.items() if a not in series and any(res.values())]
    return [f"![aggregation error per round, {task}, {part}]({name})", "",
            "The relative distance of the broadcast LoRA update from the exact weighted average of the clients' "
            "updates, every round (mean over the seeds; log scale; values of 0 cannot be drawn on it)."
            + (f" Not drawn: {', '.join(missing)} (runs that predate the measure, or no LoRA factors exchanged)."
               if missing else "")]


def _family_contrasts(rows: dict[str, dict[int, dict | None]]) -> list[str]:
    """The grid's contrasts (arm − reference, paired by seed, in points) on global and personalised accuracy; the
    global one only where both arms have a global model."""
    lines = ["The grid's contrasts, paired by seed, final round, in points: mean [95 % CI] over the seeds both "
             "finished (n); one seed: the difference alone.", "",
             "| arm − reference | global acc Δ | personalised acc Δ |", "|---|---|---|"]
    for arm, ref in FAMILY_CONTRASTS.items():
        if arm not in rows or ref not in rows:
            continue
        done = {s: r for s, r in rows[arm].items() if r}
        glob = "–" if arm.startswith(PERSONAL_ONLY) or ref.startswith(PERSONAL_ONLY) else _paired(done, rows[ref])
        lines.append(f"| {arm} − {ref} | {glob} | {_paired(done, rows[ref], 'local')} |")
    return lines


GEN_PAIRED = ("own-category BLEU", "seen BLEU", "unseen BLEU")  # arm − reference, paired by seed
FEDIT = "FedAvg-LoRA (fedit)"  # the row every generation arm is compared with


def _generation_finals(args) -> dict[str, dict[int, tuple[dict, dict, str, Budget]]]:
    """Label -> seed -> (final record with the client names, summary, device, budget): this benchmark's generation arms
    and the generation benchmark's zero-shot (fedit's round 0), fedit and local-only runs."""
    from benchmarks import generation

    if not Path(args.generation_runs).is_dir():  # its rows would render empty, as if those runs had never been done
        raise SystemExit(f"--generation-runs {args.generation_runs}: no such folder; extract "
                         "benchmarks/results/generation_runs.tgz (tar xzf) or pass the generation benchmark's "
                         "runs folder")
    sources = {a: (Path(args.generation_runs), g) for a, g in FROM_GENERATION.items()}
    sources |= {a: (Path(args.runs_dir), None) for a in GENERATION}
    finals: dict[str, dict[int, tuple[dict, dict, str, Budget]]] = {}
    for arm, (root, gen_arm) in sources.items():
        finals[arm] = {}
        for s in args.seeds:
            out = root / (generation.job_name("webnlg", gen_arm, s) if gen_arm else
                          job_name("generation", "webnlg", "category", arm, s))
            loaded = _records(out) if out.exists() else None
            if not loaded:
                continue
            recs, summary = loaded
            if arm.startswith("zero-shot"):  # fedit's round 0, when it was evaluated
                recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][:1]
                recs = [r for r in recs if r["round"] == 0]
                if not recs:
                    continue
            finals[arm][s] = (recs[-1] | {"client_names": summary.get("client_names", {})}, summary, _device(out),
                              measured(out))
    return finals


def _generation_rows(args) -> list[str]:
    """WebNLG: this benchmark's arms beside the generation benchmark's zero-shot, fedit and local-only runs, the
    bootstrap standard error of one run's score, each arm's paired difference from fedit and the grid's contrasts."""
    from benchmarks import generation

    finals = _generation_finals(args)
    personal = {a: a.startswith(PERSONAL_ONLY) for a in finals}  # own-category: each client's own adapter

    def metric(arm: str, rec: dict, name: str) -> float | None:
        if name == "own-category BLEU":
            return generation._own(rec, "bleu", personal[arm])
        return generation._part(arm, rec, name.split()[0], "bleu")

    lines = ["## Generation: WebNLG, SmolLM2-135M-Instruct, 10 category clients", "",
             "Own category: the mean over the clients of the score on their own category's test entries (the "
             "global adapter's; local-only's: each client's own adapter, whose unseen scores are in "
             "`generation.md`, so its global columns are empty; FedSA-LoRA's: the shared A with each client's own "
             "B, while its global adapter keeps B at its initial zeros, the instruct model, so its global columns are "
             "empty too). Seen / unseen: the global adapter on the test entries of the 10 training categories / of "
             "the 5 categories no client holds. The runs are scored at their final round only (3 rounds), so there "
             "is no upload-to-target column: a run uploads 3 × its bytes per client-round.", "",
             "| arm | seeds done | own BLEU | own chrF | seen BLEU | seen chrF | seen ROUGE-L | unseen BLEU | "
             "unseen chrF | unseen ROUGE-L | test loss | MB up / client-round | MB down / client-round | "
             "budget / client-round | device |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, runs in finals.items():
        if not runs:
            lines.append(f"| {arm} | 0/{len(args.seeds)} |" + " – |" * 13)
            continue
        recs, summaries = [r for r, *_ in runs.values()], [s for _, s, *_ in runs.values()]
        glob = [] if personal[arm] else recs
        zero = arm.startswith("zero-shot")
        cells = [mean_std([generation._own(r, k, personal[arm]) for r in recs], 1) for k in ("bleu", "chrf")]
        cells += [mean_std([generation._gen(r, p, k) for r in glob], 1) for p, k in generation.WEBNLG_PARTS]
        cells.append(mean_std([r.get("loss") for r in glob], 1, 3))
        cells += ["0" if zero else _mb(statistics.fmean(s[f"bytes_{d}_per_client_round"] for s in summaries))
                  for d in ("up", "down")]
        cells.append("none (round 0)" if zero else budget_cell([b for *_, b in runs.values()]))
        devices = ", ".join(sorted({d for _, _, d, _ in runs.values()}))
        lines.append(f"| {arm} | {len(runs)}/{len(args.seeds)} | {' | '.join(cells)} | {devices} |")
    scored = [r for a, runs in finals.items() if not a.startswith((*PERSONAL_ONLY, "zero-shot"))
              for r, *_ in runs.values()]
    lines += ["", generation._standard_errors("webnlg", scored), "",
              "Paired differences by seed, final round, in points: each arm − FedAvg-LoRA (fedit), then the grid's "
              "contrasts; mean [95 % CI] over the seeds both finished (n); one seed: the difference alone.", "",
              "| arm − reference | metric | Δ |", "|---|---|---|"]
    for arm, ref in [(a, FEDIT) for a in GENERATION] + list(GENERATION_CONTRASTS.items()):
        for name in GEN_PAIRED[:1] if personal[arm] or personal[ref] else GEN_PAIRED:
            d = [x - y for s in finals[arm] if s in finals[ref]
                 for x, y in [(metric(arm, finals[arm][s][0], name), metric(ref, finals[ref][s][0], name))]
                 if x is not None and y is not None]
            lines.append(f"| {arm} − {'fedit' if ref == FEDIT else ref} | {name} | {paired_cell(d)} |")
    return lines + [""]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = grid_parser("lora_family", __doc__.split("\n\n")[0])
    p.add_argument("--generation-runs", default="runs/generation", help="the generation benchmark's runs (fedit, "
                                                                        "zero-shot and local-only rows)")
    p.add_argument("--parts", nargs="+", default=["family", "headprune", "generation"],
                   choices=["family", "headprune", "generation"])
    p.add_argument("--arms", nargs="+", default=None, help="run only these arms (labels of the grid), in this order "
                                                            "of priority: every seed of one before the next")
    p.add_argument("--family-tasks", nargs="+", default=["agnews", "20ng"], choices=list(TASKS))
    p.add_argument("--family-partitions", nargs="+", default=["dir0.5"], choices=list(PARTITIONS))
    p.add_argument("--headprune-tasks", nargs="+", default=["mnli", "20ng"], choices=list(TASKS))
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--max-train", type=int, default=3000)
    p.add_argument("--max-test", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--full", action="store_true", help="the full grid: the family on MNLI, AG News and 20 "
                                                       "Newsgroups, IID and Dirichlet 0.5, 40 rounds, 6000 "
                                                       "training examples (a GPU machine)")
    args = parse_grid_args(p, argv)
    if args.full:
        args.family_tasks, args.family_partitions, args.rounds, args.max_train = list(TASKS), list(PARTITIONS), 40, 6000
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    run_grid(args, run_job, plan(args), render)


if __name__ == "__main__":
    main()
