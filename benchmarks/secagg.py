"""Secure aggregation's cost (benchmarks/results/secagg.md): the same runs with and without SecAgg+, and under
client dropouts.

Criteria, fixed before the runs: MiniLM on SST-2, IID, ``--rounds`` rounds, 10 and 100 clients (all train every
round); arms: FedPrompt's soft prompt, FedIT-style LoRA (LoRA on every linear layer, AdamW, FedAvg) and FedPepTAO
(deep prompts, layer selection after 2 warm-up rounds from the securely averaged layer scores, server momentum
without control variates: the server-held control variates need each client's update, so the paper's full server
is refused under SecAgg+). Each arm plain, under SecAgg+ (num_shares 3,
threshold 2, Flower's quantization), and under SecAgg+ with 10 % and 30 % of the clients failing each round
(``faults.fail_rate``, drawn from the seed, the same clients in every arm; with 10 clients and the soft prompt also
dropped at the protocol's other stages, ``faults.secure_stage``: setup, key sharing, unmasking), and with 30 %
dropouts under the
complete graph (every client holds a share of every other's secrets, half of them needed: the setting that
tolerates that many dropouts, added in session 25 after the 3-share rows halted). Reported: the final round's test
accuracy (never the best round, and the only round evaluated; the plain-vs-secure difference is the quantization
error), bytes per client-round (every protocol stage counted), wall seconds per round on this machine (training and
protocol, the rounds without evaluation), the rounds completed and each row's budget per client-round. Round 0 is
not evaluated; a run whose rounds all halted is scored on the starting model, which gives a seed's untrained row.
>= 3 paired seeds. Local work: 3 steps of batch 16 per client-round with 10 clients, 1 with 100 (100 clients x 3
steps would take this 2-core machine over an hour per run); the 10-client runs come first.

    python -m benchmarks.secagg --runs-dir runs/secagg --workers 1      # CPU, resumable
    python -m benchmarks.secagg --runs-dir runs/secagg --render-only    # rewrite the table
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.budget import budget_cell, measured, mixed_pairs
from benchmarks.grids import load_grid
from benchmarks.runner import grid_parser, parse_grid_args, run_config, run_grid, write_results
from benchmarks.stats import accuracy_se, mean_std, paired_cell, resolved

GRID = load_grid("secagg")
METHODS, SECURE, MODES = GRID["methods"], GRID["secure"], GRID["modes"]
SCOPE = GRID.get("mode_scope", {})
PLAIN = "plain"  # the mode every other is paired with


def in_scope(method: str, clients: int, mode: str) -> bool:
    """Whether the grid runs ``mode`` for this method and federation size (``mode_scope``; default: always)."""
    scope = SCOPE.get(mode, {})
    return clients in scope.get("clients", [clients]) and method in scope.get("methods", [method])


def job_name(method: str, clients: int, mode: str, seed: int) -> str:
    slug = lambda s: "".join(ch if ch.isalnum() else "-" for ch in s.lower()).strip("-")  # noqa: E731
    return f"{slug(method)}__k{clients}__{slug(mode)}__s{seed}"


def overrides(args, method: str, clients: int, mode: str, seed: int) -> list[str]:
    return ["task.name=sst2", f"task.max_train={args.max_train}", f"task.max_test={args.max_test}",
            "task.max_length=64", "model.name=minilm", f"seed={seed}", f"federation.num_clients={clients}",
            f"federation.rounds={args.rounds}", "federation.min_clients=2",
            f"method.trainer.max_steps={args.steps if clients <= 10 else args.steps_many}",
            "method.trainer.batch_size=16", "evaluation.local=false", "evaluation.batch_size=128",
            f"evaluation.every={args.rounds}",  # the final round is the one reported
            "evaluation.round_zero=false", "runtime.progress=false", f"runtime.threads={args.threads}",
            *METHODS[method], *MODES[mode]]


def plan(args) -> list[tuple[str, int, str, int]]:
    return [(m, k, mode, s) for k in args.clients for s in args.seeds for m in METHODS for mode in MODES
            if in_scope(m, k, mode)]


def contrasts(args) -> list[tuple[str, str, list[str], list[str]]]:
    """(arm, reference, the arm's overrides, the reference's) of every paired contrast the results file reads (each
    method's modes against its plain run, at every federation size), for the budget test over the grids."""
    label = lambda m, k, mode: f"{m}, {k} clients, {mode}"  # noqa: E731
    return [(label(m, k, mode), label(m, k, PLAIN), overrides(args, m, k, mode, 0), overrides(args, m, k, PLAIN, 0))
            for k in args.clients for m in METHODS for mode in MODES if mode != PLAIN and in_scope(m, k, mode)]


def run_job(args, *job) -> str:
    return run_config(Path(args.runs_dir) / job_name(*job), overrides(args, *job))


def _load(out: Path) -> dict | None:
    if not (out / "summary.json").exists():
        return None
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((out / "summary.json").read_text())
    done = [r for r in recs if "round_failed" not in r]
    return {"final": recs[-1]["accuracy"], "hist": summary["label_histograms"],
            "layers": recs[-1].get("server_vectors", {}).get("selected_layers"),  # FedPepTAO's selection
            # per selected client and round, halted rounds included (their keys and shares were sent too)
            "up": sum(r["bytes_up"] for r in recs) / max(1, sum(len(r["clients"]) for r in recs)),
            "down": sum(r["bytes_down"] for r in recs) / max(1, sum(len(r["clients"]) for r in recs)),
            "wall": statistics.fmean(r["wall_seconds"] for r in recs if r["accuracy"] is None),
            "completed": len(done), "rounds": len(recs), "budget": measured(out)}


def _paired(done: dict[int, dict], ref: dict[int, dict | None]) -> tuple[str, list[float]]:
    """The paired cell of the rows' final accuracies minus the reference's in points over the seeds both finished
    (the pairs that mix devices counted), and the differences."""
    both = [s for s in done if ref.get(s)]
    d = [(done[s]["final"] - ref[s]["final"]) * 100 for s in both]
    return paired_cell(d, mixed_pairs({s: done[s]["budget"].device for s in both},
                                      {s: ref[s]["budget"].device for s in both})), d


def starting_model(runs: dict[str, dict[int, dict]]) -> dict[int, dict]:
    """Seed -> a run of one method and size whose rounds all halted: its final accuracy is the starting model's
    (the global state before any round; round 0 itself is not evaluated)."""
    return {s: r for mode in runs for s, r in runs[mode].items() if r["completed"] == 0}


def render(args) -> Path:
    runs = Path(args.runs_dir)
    lines = ["# Secure aggregation (SecAgg+): what it costs", "",
             f"Rendered with: `python -m benchmarks.secagg {' '.join(args.argv)}`", "",
             f"MiniLM on SST-2 (IID, train capped at {args.max_train}, test {args.max_test}), {args.rounds} rounds, "
             f"every client every round, {args.steps} local steps of batch 16 per client-round with 10 clients, "
             f"{args.steps_many} with 100; SecAgg+ with num_shares 3, threshold 2 "
             "and Flower's quantization (clipping range 8, 2^22 levels, max weight 1000). Accuracy: the final round "
             "(the only one evaluated), mean ± std over the finished seeds; Δ: paired by seed against the plain run. "
             "Bytes: per selected client and round (halted rounds included), every protocol message counted. "
             "Wall: mean seconds per round without "
             "evaluation (training and protocol) on this machine, shared with other benchmarks.", "",
             "Δ: mean [95 % t-interval] over the seeds both rows finished (n; pairs whose runs ran on two devices "
             "counted). Budget: the mean local steps and examples a client-round trained on, over the replies of "
             "completed rounds (none where every round halted), the learning rate, the weight decay and the "
             "device.", ""]
    if args.notes and Path(args.notes).exists():
        lines += [Path(args.notes).read_text().strip(), ""]
    for k in args.clients:
        lines += [f"## {k} clients", ""]
        any_run = next((r for m in METHODS for mode in MODES for s in args.seeds
                        if (r := _load(runs / job_name(m, k, mode, s)))), None)
        if any_run:  # the trivial baseline: the majority class of the (shared) test set
            test = [sum(col) for col in zip(*any_run["hist"]["test"])]
            n = sum(test)
            lines += [f"Test n = {n} (standard error of one accuracy ≤ {accuracy_se(n):.1f} points); majority class "
                      f"{max(test) / n * 100:.1f} %.", ""]
        lines += ["| method | mode | seeds done | accuracy % | Δ vs plain, paired | "
                  "KB up / client-round | KB down / client-round | s / round | rounds completed | "
                  "budget / client-round |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        unresolved = []
        for method in METHODS:
            runs_of = {mode: {s: r for s in args.seeds if (r := _load(runs / job_name(method, k, mode, s)))}
                       for mode in MODES if in_scope(method, k, mode)}
            plain = runs_of[PLAIN]
            for mode, done in runs_of.items():
                if not done:
                    lines.append(f"| {method} | {mode} | 0/{len(args.seeds)} |" + " – |" * 7)
                    continue
                completed = ", ".join(f"{r['completed']}/{r['rounds']}" for r in done.values())
                same = [r["layers"] == plain[s]["layers"] for s, r in done.items() if r["layers"] and plain.get(s)]
                if same and mode != "plain":  # did the securely averaged layer scores pick the plain run's layers?
                    completed += f"; selected layers as plain: {sum(same)}/{len(same)}"
                mean = lambda key: statistics.fmean(r[key] for r in done.values())  # noqa: E731
                lines.append(
                    f"| {method} | {mode} | {len(done)}/{len(args.seeds)} | "
                    f"{mean_std([r['final'] for r in done.values()])} | "
                    f"{_paired(done, plain)[0] if mode != PLAIN else '0'} | "
                    f"{mean('up') / 1e3:.1f} | {mean('down') / 1e3:.1f} | {mean('wall'):.1f} | "
                    f"{completed} | {budget_cell([r['budget'] for r in done.values()], device=True)} |")
            start = starting_model(runs_of)
            if start:
                cell, d = _paired(start, plain)
                lines.append(f"| {method} | no round completed (the starting model) | {len(start)}/{len(args.seeds)} "
                             f"| {mean_std([r['final'] for r in start.values()])} | {cell} |" + " – |" * 5)
                if resolved(d) == "not resolved":
                    unresolved.append(f"{method} ({cell})")
        lines += ["", "Round 0 is not evaluated (`evaluation.round_zero=false`), so the table has no round-0 row; "
                  "the starting model's row is the final accuracy of a seed's runs whose rounds all halted (the "
                  "same in every mode of a seed, since a halted round changes nothing)."]
        if unresolved:
            lines += ["", f"At {k} clients the starting model's paired difference from the plain runs is not "
                      f"resolved for {', '.join(unresolved)}: the accuracy of these methods' dropout rows cannot tell "
                      "halted rounds from completed ones; the rounds-completed column does."]
        lines.append("")
    return write_results(args.results, lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = grid_parser("secagg", __doc__.split("\n\n")[0], workers=1)
    p.add_argument("--clients", nargs="+", type=int, default=[10, 100])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3, help="local steps per client-round with 10 clients or fewer")
    p.add_argument("--steps-many", type=int, default=1, help="local steps per client-round with more clients")
    p.add_argument("--max-train", type=int, default=4000)
    p.add_argument("--max-test", type=int, default=872)
    return parse_grid_args(p, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    run_grid(args, run_job, plan(args), render)


if __name__ == "__main__":
    main()
