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
The grid and each job's config overrides are in ``fedbpt_arms.py``, the results file in ``fedbpt_report.py``.

Cost on this 2-core CPU (one job per core, MiniLM, 1 thread; the finished runs' wall times): SST-2 4-10 minutes
per run (FedAvg-BBT ~4.5, FedBPT and the query-matched FedAvg-BBT ~7-10), ~85 minutes per seed of all 15 jobs;
AG News ~3x per run (FedAvg-BBT 13.5 minutes), ~4 hours per seed. SmolLM2 with the paper's prefix placement is
~15-20x MiniLM per round, a GPU job; with ``--placement suffix`` a SST-2 FedAvg-BBT run takes ~25 minutes (~6x
MiniLM). ``--plan`` lists the 150 jobs.

    nice -n 10 .venv/bin/python -m benchmarks.fedbpt --runs-dir runs/fedbpt --workers 2           # CPU, resumable
    nice -n 10 .venv/bin/python -m benchmarks.fedbpt --runs-dir runs/fedbpt --models smollm2 --placement suffix \
        --tasks sst2 --alphas 1.0 --arms manual manual-cal fedavg-bbt fedbpt fedbpt-rp0 --seeds 0 1 2 \
        --results benchmarks/results/fedbpt_smollm2.md                                     # SmolLM2 subset, own file
    .venv/bin/python -m benchmarks.fedbpt --runs-dir runs/fedbpt --render-only
    .venv/bin/python -m benchmarks.fedbpt --plan                                                  # list the jobs

Paper scale on a GPU (``--paper-scale``): d = 500, m = 50, I = 8, lambda = 5, T = 200 rounds (the authors'
default), evaluation every 10 rounds, ``runtime.device=cuda``; its own runs directory and results file
(runs/fedbpt-paper, benchmarks/results/fedbpt_paper_scale.md) unless given; any of --dim, --tokens,
--iterations, --popsize, --rounds, --every, --device overrides it, e.g.

    .venv/bin/python -m benchmarks.fedbpt --paper-scale --arms fedavg-bbt fedavg-bbt-2x fedbpt fedbpt-rp0 \\
        --workers 2 --threads 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks.fedbpt_arms import ALPHAS, ARMS, HEADLINE, MODELS, SCALES, TASKS, job_name, overrides, plan
from benchmarks.fedbpt_arms import contrasts  # noqa: F401 - where tests/unit/test_grid_budgets.py reads them
from benchmarks.fedbpt_report import completeness, render
from benchmarks.grids import load_grid
from benchmarks.runner import run_config, run_pool

# budget_differences: what a paired arm may differ in from its reference (``contrasts``), with why
DECLARED = load_grid("fedbpt")["budget_differences"]

# ---------------------------------------------------------------- jobs


def run_job(args, model: str, task: str, part: str, arm: str, seed: int) -> str:
    """Run (or resume, or skip) one job, then its post-hoc scoring; a line for the log."""
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
    exp, clf = built.exp, built.exp.objective
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
    print(f"wrote {render(args, DECLARED)}")
    print(completeness(args))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
