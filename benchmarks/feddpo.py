"""Federated preference alignment on real data (benchmarks/results/feddpo.md): DPO of SmolLM2-135M-Instruct's LoRA on
Anthropic's HH-RLHF, its four subsets as natural clients (harmless-base pulls towards refusing, the three helpful
tranches towards answering).

Criteria, fixed before the runs: the final round (never a best round); held-out = a seeded sample of
``--test-per-client`` pairs of each subset's held-out split (the same pairs for every arm and seed); reward accuracy
(the chosen response's implicit reward above the rejected one's, ties ½) per subset and pooled, with a 95 % paired
t-interval over >= 3 seeds for every contrast; LLMBar's 419 pairs as a second held-out set and AdvBench's first
``--advbench`` behaviours' refusal rate (OpenFedLLM's judge) after the last round. Arms: the starting model (round
0 of feddpo: LoRA's B = 0, every implicit reward zero, so its reward accuracy is 0.5 by construction and its own
preference is read from the log-probabilities), local-only DPO (each client keeps its adapter; scored post hoc from
the final checkpoint on every subset's pairs, so the table shows what a client's adapter does on the other
clients' preferences), feddpo (FedAvg of the LoRA tensors) and centralised DPO (one client holding all the pairs,
with the steps of all the clients together). The seed fixes the training sample, the initial adapter and the data
order of every arm alike.

    python -m benchmarks.feddpo --runs-dir runs/feddpo --workers 1       # CPU, resumable
    python -m benchmarks.feddpo --render-only                              # rewrite the table
    python -m benchmarks.feddpo --paper-scale --device cuda                 # the larger grid, for a GPU machine

Every run is a fedpeft run directory under --runs-dir; finished runs are skipped, interrupted ones resumed; the post
hoc scores are written once into each finished run's directory (``posthoc.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.budget import budget_cell, measured
from benchmarks.feddpo_openfedllm import openfedllm_table
from benchmarks.grids import load_grid
from benchmarks.runner import grid_parser, parse_grid_args, run_config, run_grid, write_results
from benchmarks.stats import mean_std, paired_cell

GRID = load_grid("feddpo")
ARMS = GRID["arms"]
FED, LOCAL, CENTRAL = list(ARMS)
START = "starting model (round 0)"
SUBSETS = ("harmless-base", "helpful-base", "helpful-online", "helpful-rejection-sampled")
CLIENTS = len(SUBSETS)
POSTHOC = "posthoc.json"


def job_name(arm: str, seed: int) -> str:
    slug = "".join(ch if ch.isalnum() else "-" for ch in arm.lower()).strip("-")
    return f"hh-rlhf__{slug}__s{seed}"


def overrides(args, arm: str, seed: int) -> list[str]:
    central = "federation.num_clients=1" in ARMS[arm]
    steps = args.steps * (CLIENTS if central else 1)  # the same total steps as the federation's clients
    return ["task.name=hh-rlhf", f"task.max_train={args.train_per_client}", f"task.max_test={args.test_per_client}",
            f"task.max_length={args.max_length}", f"task.max_response_length={args.max_response}",
            "model.name=smollm2", f"seed={seed}", f"federation.num_clients={CLIENTS}",
            "federation.partition.scheme=by_column", f"federation.rounds={args.rounds}",
            f"method.trainer.max_steps={steps}", f"method.trainer.batch_size={args.batch}",
            f"method.trainer.lr={args.lr}", f"method.trainer.beta={args.beta}", "method.trainer.local_epochs=100",
            f"evaluation.every={args.eval_every}", "evaluation.batch_size=16", "evaluation.local=false",
            f"evaluation.round_zero={arm == FED}",  # the starting model's row: round 0 of feddpo
            f"evaluation.suites=[{{name: advbench, limit: {args.advbench}}}]",
            "runtime.progress=false", f"runtime.threads={args.threads}", f"runtime.device={args.device}",
            *ARMS[arm]]


def contrasts(args) -> list[tuple[str, str, list[str], list[str]]]:
    """(arm, reference, overrides of each) of every paired contrast the results file reads."""
    return [(a, b, overrides(args, a, 0), overrides(args, b, 0)) for a, b in PAIRED]


PAIRED = [(FED, LOCAL), (CENTRAL, FED)]


def posthoc(out: Path, llmbar_per_subset: int | None = None) -> dict:
    """From a finished run's final checkpoint: the global adapter's scores on LLMBar, and for a run that keeps the
    adapters on the clients (local-only) each client's own adapter on every subset's held-out pairs and on LLMBar
    (the DPO trainer's metrics, by subset). Written once to ``posthoc.json``; ``llmbar_per_subset``: the first this
    many pairs of each LLMBar subset (None: all 419)."""
    import numpy as np

    from fedpeft.build import build
    from fedpeft.data.paths import shared_data_dir
    from fedpeft.data.tasks.preference import read_llmbar
    from fedpeft.formats.base import floats
    from fedpeft.predict import adapter_params
    from fedpeft.resolve import load_config
    from fedpeft.tracking.rundir import RunDir

    if (out / POSTHOC).exists():
        return json.loads((out / POSTHOC).read_text())
    cfg = load_config(out / "config.yaml")
    b = build(cfg)
    exp, trainer = b.exp, b.method.trainer
    _, server, client_states, _ = RunDir(out).load_checkpoint()
    pairs = read_llmbar(shared_data_dir() / "LLMBar")
    if llmbar_per_subset is not None:
        pairs = [e for g in dict.fromkeys(e.group for e in pairs)
                 for e in [x for x in pairs if x.group == g][:llmbar_per_subset]]
    llmbar = exp.objective.encode(pairs)
    test = exp.test_encoded
    groups = np.array([e.group for e in exp.task.test])

    def scores(params) -> dict:
        whole = trainer.evaluate(floats(params), test, predictions=True)
        stats = whole.pop("predictions")
        by = {g: exp.objective.summarise(stats, np.flatnonzero(groups == g)) for g in SUBSETS}
        return {"test": whole, "by_group": by, "llmbar": trainer.evaluate(floats(params), llmbar)}

    local = cfg.method.sharing.name == "local"  # nothing shared: the clients' own adapters are the arm
    result = {} if local else {"global": scores(adapter_params(b.method, server, client_states))}
    if local:
        result["clients"] = {exp.client_names()[c]: scores(adapter_params(b.method, server, client_states, c))
                             for c in range(exp.num_clients)}
    (out / POSTHOC).write_text(json.dumps(result, indent=1))
    return result


def run_job(args, arm: str, seed: int) -> str:
    out = Path(args.runs_dir) / job_name(arm, seed)
    done = run_config(out, overrides(args, arm, seed))
    if (out / "summary.json").exists() and not (out / POSTHOC).exists():
        posthoc(out)
        done += f"; wrote {out / POSTHOC}"
    return done


def plan(args) -> list[tuple[str, int]]:
    return [(a, s) for s in args.seeds for a in args.arms]


def _final(args, arm: str, seed: int) -> dict | None:
    """What the table reads of one finished run: its records' first and last, its post hoc scores, its summary."""
    out = Path(args.runs_dir) / job_name(arm, seed)
    if not (out / "summary.json").exists() or not (out / POSTHOC).exists():
        return None
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"first": recs[0], "last": recs[-1], "posthoc": json.loads((out / POSTHOC).read_text()),
            "summary": json.loads((out / "summary.json").read_text()), "out": out}


def _score(arm: str, run: dict, subset: str | None, key: str = "accuracy") -> float | None:
    """An arm's score on one subset's held-out pairs (None: pooled), or on LLMBar (``subset`` "llmbar"): local-only
    is the mean over the four clients' own adapters; the starting model is round 0."""
    if arm == START:
        rec = run["first"]
        return rec.get(key) if subset is None else (rec.get("by_group") or {}).get(subset, {}).get(key)
    if arm == LOCAL:
        per = run["posthoc"]["clients"].values()
        vals = [c["llmbar"][key] if subset == "llmbar" else c["test"][key] if subset is None
                else c["by_group"][subset][key] for c in per]
        return statistics.fmean(vals)
    if subset == "llmbar":
        return run["posthoc"]["global"]["llmbar"][key]
    rec = run["last"]
    return rec.get(key) if subset is None else (rec.get("by_group") or {}).get(subset, {}).get(key)


def _refusal(run: dict) -> float | None:
    return ((run["summary"].get("suites") or {}).get("advbench") or {}).get("harmless_rate")


def render(args) -> Path:
    runs = {(a, s): _final(args, a, s) for a in ARMS for s in args.seeds}
    runs |= {(START, s): runs[FED, s] for s in args.seeds}
    cols = [("pooled", None), *((s, s) for s in SUBSETS), ("LLMBar", "llmbar")]
    lines = ["# Federated preference alignment: DPO on HH-RLHF with SmolLM2-135M-Instruct", "",
             (Path(args.notes).read_text() if Path(args.notes).exists() else ""), "",
             f"Command: `python -m benchmarks.feddpo --runs-dir {args.runs_dir} --rounds {args.rounds} --steps "
             f"{args.steps} --batch {args.batch} --lr {args.lr} --beta {args.beta} --train-per-client "
             f"{args.train_per_client} --test-per-client {args.test_per_client}` (resumable). Reward accuracy in "
             "percent (ties ½), mean ± std over the finished seeds, final round; local-only: the mean over the "
             "four clients of each client's own adapter (scored post hoc).", "",
             "| arm | " + " | ".join(c for c, _ in cols) + " | log-prob. preference (pooled) | AdvBench refusal | "
             "bytes up / client-round | seeds done | budget / client-round | device |",
             "|" + "---|" * (len(cols) + 7)]
    for arm in [START, *ARMS]:
        done = [runs[arm, s] for s in args.seeds if runs.get((arm, s))]
        cells = [mean_std([_score(arm, r, sub) for r in done]) for _, sub in cols]
        pref = mean_std([_score(arm, r, None, "logp_preference") for r in done])
        refusal = "–" if arm == START else mean_std([_refusal(r) for r in done], scale=1.0)
        up = "0" if arm == START else mean_std([r["summary"].get("bytes_up_per_client_round") for r in done], 1.0, 0)
        budget = "none (round 0)" if arm == START else budget_cell([measured(r["out"]) for r in done])
        lines.append(f"| {arm} | {' | '.join(cells)} | {pref} | {refusal} | {up} | {len(done)}/{len(args.seeds)} | "
                     f"{budget} | {args.device if done else '–'} |")
    lines += ["", "Paired differences by seed, final round, reward accuracy in points: mean [95 % CI] over the seeds "
              "both arms finished (n).", "", "| arms | " + " | ".join(c for c, _ in cols) + " |",
              "|" + "---|" * (len(cols) + 1)]
    for a, b in [*PAIRED, (FED, START)]:
        cells = []
        for _, sub in cols:
            pairs = [(_score(a, runs[a, s], sub), _score(b, runs[b, s], sub)) for s in args.seeds
                     if runs.get((a, s)) and runs.get((b, s))]
            d = [100 * (x - y) for x, y in pairs if x is not None and y is not None]
            cells.append(paired_cell(d))
        lines.append(f"| {a} − {b} | " + " | ".join(cells) + " |")
    lines += ["", *openfedllm_table(Path(args.openfedllm_dir), args.seeds, matched=False)]
    return write_results(args.results, lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = grid_parser("feddpo", __doc__.split("\n\n")[0], threads=1, workers=1)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), metavar="ARM")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="local steps per client and round")
    p.add_argument("--batch", type=int, default=4, help="pairs per step")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--train-per-client", type=int, default=200)
    p.add_argument("--test-per-client", type=int, default=50)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--max-response", type=int, default=32)
    p.add_argument("--advbench", type=int, default=52, help="AdvBench behaviours scored after the last round")
    p.add_argument("--device", default="cpu")
    p.add_argument("--openfedllm-dir", default="runs/openfedllm", help="benchmarks.feddpo_openfedllm's runs")
    p.add_argument("--paper-scale", action="store_true", help="the larger grid: 20 rounds of 10 steps of 8 pairs, "
                                                             "1,000 training and 200 held-out pairs per subset, "
                                                             "all 520 AdvBench behaviours (a GPU machine)")
    args = parse_grid_args(p, argv)
    if args.paper_scale:
        args.rounds, args.steps, args.batch, args.train_per_client, args.test_per_client = 20, 10, 8, 1000, 200
        args.max_length, args.max_response, args.advbench, args.eval_every = 512, 128, 520, 5
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    run_grid(args, run_job, plan(args), render)


if __name__ == "__main__":
    main()
