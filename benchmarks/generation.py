"""Federated instruction tuning on real data (benchmarks/results/generation.md): SmolLM2-135M-Instruct, WebNLG 2017
(10 DBpedia categories as natural clients, test categories seen and unseen) and databricks-dolly-15k (8 categories).

Criteria, fixed before the runs: the final round (never a best round); WebNLG test = a seeded sample of
``--test-per-category`` entries of each of the 15 test categories (10 seen, 5 unseen), all decoded greedily and
scored by multi-reference BLEU, chrF, ROUGE-L and exact match, with bootstrap standard errors; teacher-forced loss
and perplexity per response token; Dolly: per-category loss/perplexity and ROUGE-L. >= 3 paired seeds (the seed
fixes the training sample, the adapter's initial tensors and the data order of every arm alike). The zero-shot
baseline is every LoRA arm's round 0 (B = 0: exactly the instruct model with the same prompt). Local-only is scored
by each client on its own category's test entries (``local_generation``) and, post hoc from the final checkpoint,
with each client's adapter on the unseen categories' entries (``score_local_unseen``); centralised training is one
client holding all the data with the steps of all clients together.

    python -m benchmarks.generation --runs-dir runs/generation --workers 1     # CPU, resumable
    python -m benchmarks.generation --runs-dir runs/generation --render-only   # rewrite the table
    python -m benchmarks.generation --paper-scale --device cuda                 # the full grid, for a GPU machine

Every run is a fedpeft run directory under --runs-dir; finished runs are skipped, interrupted ones resumed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from benchmarks.budget import budget_cell, measured
from benchmarks.grids import load_grid
from benchmarks.runner import grid_parser, parse_grid_args, run_config, run_grid, write_results
from benchmarks.stats import mean_std, paired_cell

GRID = load_grid("generation")
ARMS = GRID["arms"]
DOLLY_ARMS = GRID["dolly_arms"]
TASKS = GRID["tasks"]


def job_name(task: str, arm: str, seed: int) -> str:
    slug = "".join(ch if ch.isalnum() else "-" for ch in arm.lower()).strip("-")
    return f"{task}__{slug}__s{seed}"


def overrides(args, task: str, arm: str, seed: int) -> list[str]:
    t = TASKS[task]
    central = "federation.num_clients=1" in ARMS[arm]
    steps = args.steps * (t["clients"] if central else 1)  # the same total steps as the federation's clients
    return [f"task.name={task}", f"task.max_train={args.train_per_category}",
            f"task.max_test={args.test_per_category}", f"task.max_length={t['max_length']}",
            f"task.max_response_length={args.max_response}", "model.name=smollm2", f"seed={seed}",
            # the grid's first runs cut long prompts at their start: new runs pair with them
            "task.truncation=keep_end",
            f"federation.num_clients={t['clients']}", "federation.partition.scheme=by_column",
            f"federation.rounds={args.rounds}", f"method.trainer.max_steps={steps}",
            f"method.trainer.batch_size={args.batch}",
            "method.trainer.local_epochs=100", f"evaluation.generate_every={args.rounds}",
            f"evaluation.max_new_tokens={args.max_response}", "evaluation.generate_examples=100000",
            f"evaluation.bootstrap={args.bootstrap}", "evaluation.batch_size=16", f"evaluation.every={args.rounds}",
            f"evaluation.round_zero={arm.startswith('fedit')}",  # the zero-shot row: round 0 of fedit
            "runtime.progress=false", f"runtime.threads={args.threads}", f"runtime.device={args.device}",
            *ARMS[arm]]


def contrasts(args) -> list[tuple[str, str, list[str], list[str]]]:
    """(arm, reference, the arm's overrides, the reference's) of every paired contrast of the results file
    (``PAIRED``; zero-shot is fedit's own round 0, no training to compare), for the budget test over the grids."""
    return [(arm, ref, overrides(args, task, arm, 0), overrides(args, task, ref, 0))
            for task in args.tasks for start, against, _ in PAIRED[task] if ZERO_SHOT not in (start, against)
            for arm, ref in [(_label(start), _label(against))]]


def run_job(args, task: str, arm: str, seed: int) -> str:
    """One run (skipped when finished); a finished WebNLG local-only run then gets its unseen scores, once."""
    out = Path(args.runs_dir) / job_name(task, arm, seed)
    done = run_config(out, overrides(args, task, arm, seed))
    if (task == "webnlg" and arm.startswith("local-only") and (out / "summary.json").exists()
            and not (out / UNSEEN_FILE).exists()):
        done += f"; wrote {score_local_unseen(out)}"
    return done


def plan(args) -> list[tuple[str, str, int]]:
    return [(t, a, s) for s in args.seeds for t in args.tasks for a in args.arms
            if t == "webnlg" or a in DOLLY_ARMS]


def _load(out: Path, categories: dict[str, str] | None = None) -> list[dict] | None:
    """The run's records when it finished, else None (an unfinished row is reported as such); every record gets
    the clients' category names from summary.json (``client_names``; a centralised run's one client: the
    federation's training ``categories``), the last one the run's upload per client-round (summary.json) and the
    clients' own adapters' scores on the unseen categories when they were measured (``local_unseen``, see
    ``score_local_unseen``)."""
    if not (out / "summary.json").exists():
        return None
    summary = json.loads((out / "summary.json").read_text())
    names = summary.get("client_names") or categories or {}
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    recs = [r | {"client_names": names} for r in recs]
    recs[-1]["bytes_up_per_client_round"] = summary.get("bytes_up_per_client_round")
    if (out / UNSEEN_FILE).exists():
        recs[-1]["local_unseen"] = json.loads((out / UNSEEN_FILE).read_text())
    return recs


def _categories(args, task: str) -> dict[str, str]:
    """The training categories by client (the by-column partition gives every federated arm and seed the same),
    which a centralised run's "own category" columns average over."""
    for arm in args.arms:
        for seed in args.seeds:
            summary = Path(args.runs_dir) / job_name(task, arm, seed) / "summary.json"
            names = json.loads(summary.read_text()).get("client_names") if summary.exists() else None
            if names:
                return names
    return {}


UNSEEN_FILE = "local_unseen.json"


def score_local_unseen(out: Path) -> Path:
    """Post hoc, from a finished local-only run's checkpoint: each client's own adapter decodes the run's fixed
    test sample of the categories no client trained on (WebNLG's unseen ones), scored like the global adapter is;
    written to ``local_unseen.json`` in the run directory ({client: scores})."""
    import numpy as np

    from fedpeft.build import build
    from fedpeft.generation_eval import generation_metrics, sample_rows
    from fedpeft.predict import adapter_params
    from fedpeft.resolve import load_config
    from fedpeft.tracking.rundir import RunDir
    from fedpeft.formats.base import floats

    cfg = load_config(out / "config.yaml")
    b = build(cfg)
    _, server, client_states, _ = RunDir(out).load_checkpoint()
    test, ev = b.exp.task.test, cfg.evaluation
    seen = {e.group for e in b.exp.task.train}
    rows = np.array([r for r in sample_rows(test, ev.generate_examples, cfg.seed) if test[r].group not in seen])
    scores = {}
    for c in range(b.exp.num_clients):
        params = floats(adapter_params(b.method, server, client_states, c))
        scores[str(c)] = generation_metrics(b.exp.objective, params, test, rows, set(), ev.max_new_tokens,
                                            ev.batch_size, 0)
    (out / UNSEEN_FILE).write_text(json.dumps(scores, indent=1))
    return out / UNSEEN_FILE


def _device(out: Path) -> str:
    """The device a finished run used (its config.yaml), for the table's device column."""
    import yaml

    return str(yaml.safe_load((out / "config.yaml").read_text())["runtime"]["device"])


def _cell(xs: list[float | None], digits: int = 1) -> str:
    """'m ± s' of the scores (already in their unit: BLEU points, nats, bytes)."""
    return mean_std(xs, scale=1.0, digits=digits)


def _gen(rec: dict, part: str | None, key: str):
    g = rec.get("generation") or {}
    g = g.get(part, {}) if part else g
    return g.get(key)


def _local(rec: dict, key: str) -> float | None:
    vals = [v.get(key) for v in (rec.get("local_generation") or {}).values() if v.get(key) is not None]
    return statistics.fmean(vals) if vals else None


GROUNDED = ("closed_qa", "information_extraction", "summarization", "classification")  # Dolly: a reference answers


WEBNLG_PARTS = [(p, k) for p in ("seen", "unseen") for k in ("bleu", "chrf", "rouge_l")]


def _own(rec: dict, key: str, personal: bool) -> float | None:
    """Mean over the clients of the score on their own category's test entries: each client's own adapter
    (``personal``: ``local_generation``), or the global adapter's per-category scores (``generation.by_group``)."""
    if personal:
        return _local(rec, key)
    by = (rec.get("generation") or {}).get("by_group") or {}
    vals = [by[n][key] for n in rec.get("client_names", {}).values() if n in by and by[n].get(key) is not None]
    return statistics.fmean(vals) if vals else None


def _part(arm: str, rec: dict, part: str, key: str) -> float | None:
    """A WebNLG arm's score on the seen or unseen test entries; local-only: the mean over the clients of each own
    adapter's score on the unseen ones (decoded post hoc), none on the seen ones (each client has its own)."""
    if arm.startswith("local-only"):
        return _mean_over_clients(rec.get("local_unseen"), key) if part == "unseen" else None
    return _gen(rec, part, key)


def _webnlg_rows(arm: str, done: list[list[dict]]) -> list[str]:
    last = [r[-1] for r in done]
    own = [_cell([_own(r, k, arm.startswith("local-only")) for r in last]) for k in ("bleu", "chrf")]
    return own + [_cell([_part(arm, r, p, k) for r in last]) for p, k in WEBNLG_PARTS]


def _mean_over_clients(scores: dict | None, key: str) -> float | None:
    vals = [v.get(key) for v in (scores or {}).values() if v.get(key) is not None]
    return statistics.fmean(vals) if vals else None


def _category(arm: str, rec: dict, category: str, key: str = "rouge_l") -> float | None:
    """A score on one category's test entries (``key``: a generation metric, or ``loss`` per response token): the
    global adapter's, or (local-only) that category's client's own adapter's."""
    if arm.startswith("local-only"):
        ids = [c for c, name in rec.get("client_names", {}).items() if name == category]
        if not ids:
            return None
        if key == "loss":
            return (rec.get("local_loss") or {}).get(ids[0])
        return (rec.get("local_generation") or {}).get(ids[0], {}).get(key)
    by = (rec.get("by_group") or {}) if key == "loss" else ((rec.get("generation") or {}).get("by_group") or {})
    return by.get(category, {}).get(key)


def _own_loss(arm: str, rec: dict) -> float | None:
    """The mean over the clients' categories of the test loss on that category's entries (``_category``)."""
    vals = [v for v in (_category(arm, rec, c, "loss") for c in rec.get("client_names", {}).values())
            if v is not None]
    return statistics.fmean(vals) if vals else None


def _loss_table(args, categories: dict[str, str]) -> list[str]:
    """Dolly's test loss per response token on each category's test entries, with its perplexity e^loss: the global
    adapter's (zero-shot: fedit's round 0), local-only each category's client's own adapter's."""
    names = list(categories.values())
    if not names:
        return []
    lines = ["Test loss per response token on each category's test entries (mean ± std over the finished seeds; "
             "perplexity e^loss of the mean in brackets); local-only: each category's client's own adapter.", "",
             f"| arm | {' | '.join(names)} | mean of {len(names)} |", "|" + "---|" * (len(names) + 2)]

    def cell(xs: list[float | None]) -> str:
        xs = [x for x in xs if x is not None]
        return f"{_cell(xs, 2)} ({math.exp(statistics.fmean(xs)):.1f})" if xs else "–"

    fedit = _label("fedit")
    for arm in [a for a in args.arms if a in DOLLY_ARMS] + [ZERO_SHOT]:
        recs = [_load(Path(args.runs_dir) / job_name("dolly", fedit if arm == ZERO_SHOT else arm, s), categories)
                for s in args.seeds]
        if arm == ZERO_SHOT:
            recs = [r[0] for r in recs if r and r[0]["round"] == 0]
        else:
            recs = [r[-1] for r in recs if r]
        label = "zero-shot (round 0 of fedit)" if arm == ZERO_SHOT else arm
        lines.append(f"| {label} | {' | '.join(cell([_category(arm, r, c, 'loss') for r in recs]) for c in names)}"
                     f" | {cell([_own_loss(arm, r) for r in recs])} |")
    return lines + [""]


def _grounded(arm: str, rec: dict) -> float | None:
    """The mean ROUGE-L over the grounded categories (``_category``)."""
    vals = [v for v in (_category(arm, rec, g) for g in GROUNDED) if v is not None]
    return statistics.fmean(vals) if vals else None


def _dolly_rows(arm: str, done: list[list[dict]]) -> list[str]:
    last = [r[-1] for r in done]
    return [_cell([_grounded(arm, r) for r in last])] + [_cell([_category(arm, r, g) for r in last])
                                                          for g in GROUNDED]


def _standard_errors(task: str, finals: list[dict]) -> str:
    """The bootstrap standard error of one run's score, averaged over the finished runs of the table."""
    keys = [(p, k) for p, k in WEBNLG_PARTS] if task == "webnlg" else [(None, "rouge_l")]
    cells = []
    for part, key in keys:
        ses = [_gen(r, part, f"{key}_se") for r in finals]
        ses = [x for x in ses if x is not None]
        if ses:
            cells.append(f"{part + ' ' if part else ''}{key} ±{statistics.fmean(ses):.1f}")
    if not cells:
        return "Bootstrap standard errors: no finished run yet."
    what = "all test entries" if task == "webnlg" else "all test entries (not only the grounded categories)"
    line = (f"Bootstrap standard error of one run's score on {what} ({len(finals)} finished runs scored with a "
            f"global adapter, mean): {', '.join(cells)}.")
    groups = len(TASKS[task]["categories"]) if "categories" in TASKS[task] else TASKS[task]["clients"]
    if task == "webnlg":  # own category: the mean over the clients of corpus BLEU on their own seen entries
        return line + (" Own-category BLEU is the mean of the 10 clients' corpus BLEU on the same seen test entries, "
                       "split by category: its standard error is about that of seen BLEU; one category's score "
                       f"rests on a tenth of them, about √10 ≈ {math.sqrt(10):.1f}× that.")
    return line + (f" A category's ROUGE-L rests on about 1/{groups} of the test entries: its standard error is about "
                   f"√{groups} ≈ {math.sqrt(groups):.1f}× the pooled one; the grounded mean of 4 about "
                   f"√{groups}/2 ≈ {math.sqrt(groups) / 2:.1f}×.")


ZERO_SHOT = "zero-shot"  # round 0 of the fedit run of the same seed


def _scaled(loss: float | None) -> float | None:
    """A loss in hundredths of a nat, so that the paired table's one decimal reads it to 0.001."""
    return None if loss is None else 100 * loss


LOSS = "test loss, mean over the clients' categories (×100)"
METRICS = {"own-category BLEU": lambda arm, r: _own(r, "bleu", arm.startswith("local-only")),
           "seen BLEU": lambda arm, r: _part(arm, r, "seen", "bleu"),
           "unseen BLEU": lambda arm, r: _part(arm, r, "unseen", "bleu"),
           "grounded ROUGE-L": _grounded,
           LOSS: lambda arm, r: _scaled(_own_loss(arm, r))}
SUPERSEDED = "local-only LoRA, wd 0.1"  # the first local-only run, at weight decay 0.1: what the confound cost
# the questions of the results paragraph, as (arm, against, metrics): arms named by the start of their label
PAIRED = {"webnlg": [("fedit", "local-only", ("own-category BLEU", "unseen BLEU", LOSS)),
                     ("fedit", "centralised", ("seen BLEU", "unseen BLEU", LOSS)),
                     ("fedit", ZERO_SHOT, ("seen BLEU", "unseen BLEU", LOSS)),
                     ("local-only", ZERO_SHOT, ("own-category BLEU", "unseen BLEU")),
                     ("soft prompt", "fedit", ("seen BLEU", "unseen BLEU")),
                     ("deep prompt", "fedit", ("seen BLEU", "unseen BLEU")),
                     ("head-pruned", "fedit", ("seen BLEU", "unseen BLEU")),
                     (SUPERSEDED, "local-only", ("own-category BLEU", "unseen BLEU"))],
          "dolly": [("fedit", "local-only", ("grounded ROUGE-L", LOSS)),
                    ("fedit", "centralised", ("grounded ROUGE-L", LOSS)),
                    ("fedit", ZERO_SHOT, ("grounded ROUGE-L", LOSS)),
                    ("local-only", ZERO_SHOT, ("grounded ROUGE-L", LOSS)),
                    (SUPERSEDED, "local-only", ("grounded ROUGE-L", LOSS))]}


def _label(start: str) -> str:
    return start if start == ZERO_SHOT else next(a for a in ARMS if a.startswith(start))


def _paired(args, task: str) -> list[str]:
    """The table of paired differences by seed that the results paragraph reads (``PAIRED``): each seed's final
    rounds (zero-shot: round 0 of fedit), each run read once."""
    categories, fedit = _categories(args, task), _label("fedit")
    runs: dict[tuple[str, int], list[dict] | None] = {}

    def scored(arm: str, seed: int) -> dict | None:
        source = fedit if arm == ZERO_SHOT else arm
        if (source, seed) not in runs:
            runs[source, seed] = _load(Path(args.runs_dir) / job_name(task, source, seed), categories)
        recs = runs[source, seed]
        if not recs:
            return None
        return (recs[0] if recs[0]["round"] == 0 else None) if arm == ZERO_SHOT else recs[-1]

    rows = []
    for start, against, metrics in PAIRED[task]:
        arm, ref = _label(start), _label(against)
        if any((fedit if a == ZERO_SHOT else a) not in args.arms for a in (arm, ref)):
            continue
        pairs = [(scored(arm, s), scored(ref, s)) for s in args.seeds]
        for m in metrics:
            values = [(METRICS[m](arm, a), METRICS[m](ref, b)) for a, b in pairs if a and b]
            d = [x - y for x, y in values if x is not None and y is not None]
            rows.append(f"| {arm} − {ref} | {m} | {paired_cell(d)} |")
    return ["Paired differences by seed, final round, in points: mean [95 % CI] over the seeds both arms "
            "finished (n); one seed: the difference alone.", "", "| arms | metric | Δ |", "|---|---|---|", *rows]


HEADERS = {"webnlg": ["own category BLEU (mean of 10 clients)", "own category chrF", "seen BLEU", "seen chrF",
                      "seen ROUGE-L", "unseen BLEU", "unseen chrF", "unseen ROUGE-L"],
           "dolly": ["ROUGE-L, grounded (mean of 4)", *(f"ROUGE-L {g}" for g in GROUNDED)]}
ROWS = {"webnlg": _webnlg_rows, "dolly": _dolly_rows}


def render(args) -> Path:
    lines = ["# Federated instruction tuning: WebNLG and Dolly on SmolLM2-135M-Instruct", "",
             (Path(args.notes).read_text() if Path(args.notes).exists() else ""), "",
             f"Command: `python -m benchmarks.generation --runs-dir {args.runs_dir} --rounds {args.rounds} --steps "
             f"{args.steps} --batch {args.batch} --train-per-category {args.train_per_category} --test-per-category "
             f"{args.test_per_category} --bootstrap {args.bootstrap}` (resumable). Budget per run: {args.rounds} "
             f"rounds × {args.steps} local steps (batch {args.batch}) per client; train {args.train_per_category} "
             f"entries per category, test {args.test_per_category} per category; final round. Cells: mean ± std over "
             "the finished seeds (n in the \"seeds done\" column); BLEU/chrF/ROUGE-L on 0-100; test loss per "
             "response token. The test set "
             "is evaluated after the last round, and at round 0 in the fedit runs (the zero-shot row). WebNLG's \"own "
             "category\" columns average the clients' scores on their own category's 10 test entries (local-only: "
             "each client's own adapter; the others: the global adapter); \"seen\"/\"unseen\" pool the test "
             "entries of the training categories / of the 5 categories no client holds (local-only: the mean over "
             "the clients of each own adapter's score on the unseen entries, decoded post hoc from the final "
             "checkpoint). Test loss: all test entries, a token-weighted mean (local-only: the mean of the "
             "clients' losses on their own category, so the column does not compare local-only with the others: "
             "Dolly's per-category table and the paired differences do).", ""]
    for task in args.tasks:
        heads, categories = HEADERS[task], _categories(args, task)
        lines += [f"## {task}", "", f"| arm | {' | '.join(heads)} | test loss | bytes up / client-round | seeds done "
                  "| budget / client-round | device |", "|" + "---|" * (len(heads) + 6)]
        zero: list[list[dict]] = []
        finals: list[dict] = []
        for arm in [a for a in args.arms if task == "webnlg" or a in DOLLY_ARMS]:
            recs = [_load(Path(args.runs_dir) / job_name(task, arm, s), categories) for s in args.seeds]
            done = [r for r in recs if r]
            if arm.startswith("fedit"):
                zero = [[r[0]] for r in done if r[0]["round"] == 0]
            last = [r[-1] for r in done]
            cells = ROWS[task](arm, done)
            finals += [] if arm.startswith("local-only") else last
            loss = _cell([_own_loss(arm, r) if arm.startswith("local-only") else r.get("loss") for r in last], 3)
            up = _cell([r["bytes_up_per_client_round"] for r in last], 0)
            outs = [Path(args.runs_dir) / job_name(task, arm, s) for s, r in zip(args.seeds, recs) if r]
            devices = sorted({_device(out) for out in outs})
            lines.append(f"| {arm} | {' | '.join(cells)} | {loss} | {up} | {len(done)}/{len(args.seeds)} | "
                         f"{budget_cell([measured(out) for out in outs])} | {', '.join(devices) or '–'} |")
        if zero:
            cells = ROWS[task]("zero-shot", zero)
            lines.append(f"| zero-shot (round 0 of fedit) | {' | '.join(cells)} | "
                         f"{_cell([r[0].get('loss') for r in zero], 3)} | 0 | {len(zero)}/{len(args.seeds)} | "
                         "none (round 0) | as fedit |")
        lines += ["", _standard_errors(task, finals), "", *(_loss_table(args, categories) if task == "dolly" else []),
                  *_paired(args, task), ""]
    return write_results(args.results, lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = grid_parser("generation", __doc__.split("\n\n")[0], threads=2, workers=1)
    p.add_argument("--tasks", nargs="+", default=["webnlg", "dolly"], choices=list(TASKS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), metavar="ARM")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="local steps per client and round")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--train-per-category", type=int, default=100)
    p.add_argument("--test-per-category", type=int, default=10)
    p.add_argument("--max-response", type=int, default=64)
    p.add_argument("--bootstrap", type=int, default=200)
    p.add_argument("--device", default="cpu")
    p.add_argument("--paper-scale", action="store_true", help="the full grid: 20 rounds, 500 entries per category, "
                                                             "all test entries (a GPU machine)")
    args = parse_grid_args(p, argv)
    if args.paper_scale:
        args.rounds, args.steps, args.batch, args.train_per_category, args.test_per_category = 20, 10, 8, 500, 100000
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    run_grid(args, run_job, plan(args), render)


if __name__ == "__main__":
    main()
