"""Seeded zeroth-order federated tuning on real data (benchmarks/results/zeroth_order.md): DeComFL and FedKSeed on
SmolLM2-135M-Instruct (every weight tuned from forward passes), beside first-order FedAvg of the same weights, LoRA
(``fedit``) and FedBPT, on SST-2 and RTE with DeComFL's federation (3 Dirichlet clients, 2 a round).

Criteria, fixed before the runs: the final round (never a best round); test = the task's labelled dev set, whole, the
same for every arm and seed; accuracy with its standard error, mean ± std over >= 3 seeds, and a 95 % paired
t-interval over the seeds for every contrast; the trivial rows beside the methods: majority class and per-client
majority (from the seeded partition) and the zero-shot verbalizer (round 0 of ``decomfl``: the untouched model with
DeComFL's prompt and label words). The seed fixes the partition, the clients a round and the data order of every arm
alike. Columns read from the runs: bytes up and down per client-round and in total (the codec's counts), the forward
passes per client-round (a zeroth-order step: P + 1 (forward) or 2P (central); a gradient step: one forward and one
backward), each arm's budget (steps, examples, learning rate per client-round) and device.

Equal budgets: every trained arm sees the same examples per client-round (``--batch``: one step of 32 for DeComFL,
FedAvg and LoRA; 32 steps of one for FedKSeed, whose recipe is single-example steps) over the same rounds; FedBPT
keeps its own recipe (CMA-ES over a projected prompt), read per forward pass and per byte.

    python -m benchmarks.zeroth_order --runs-dir runs/zeroth_order --workers 1      # CPU, resumable
    python -m benchmarks.zeroth_order --render-only                                  # rewrite the table
    python -m benchmarks.zeroth_order --rounds 1000 --device cuda                    # DeComFL's 1000 iterations (GPU)
    python -m benchmarks.zeroth_order --arms decomfl --anchors --rounds 50 --eval-every 25 --seeds 0  # + authors' code

``--anchors`` adds DeComFL's own code (``benchmarks/zo_decomfl_anchor.py`` on a checkout at ``--anchor-checkout``)
for every task and seed, at the same iterations, clients, Dirichlet α, batch, P, η and μ as the ``decomfl`` arm; its
seeds draw other clients and perturbations than fedpeft's (their RNG is Python's ``random``), so fedpeft − authors is
an unpaired (Welch) interval over the seeds, never a paired one.

Every run is a fedpeft run directory under --runs-dir; finished runs are skipped, interrupted ones resumed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.budget import budget_cell, measured
from benchmarks.grids import load_grid
from benchmarks.lora_family import majorities
from benchmarks.runner import grid_parser, parse_grid_args, run_config, run_grid, write_results
from benchmarks.stats import accuracy_se, mean_std, paired_cell, welch_cell
from benchmarks.zo_decomfl_anchor import AUTHORS_COMMIT, AUTHORS_REPO

GRID = load_grid("zeroth_order")
TASKS, ARMS = GRID["tasks"], GRID["arms"]
DECOMFL = "decomfl"
ANCHOR = "DeComFL, authors' code"  # benchmarks/zo_decomfl_anchor.py (not a fedpeft config: no grid arm)
AUTHORS = f"{AUTHORS_REPO} @ {AUTHORS_COMMIT}, decomfl_main.py"
ZERO_SHOT = "zero-shot verbalizer (round 0)"
PAIRED = [(DECOMFL, ZERO_SHOT), ("fedkseed", ZERO_SHOT), ("fedkseed", DECOMFL),
          ("FO FedAvg (SGD, all weights)", DECOMFL), ("fedit LoRA (AdamW)", DECOMFL), ("FedBPT", DECOMFL)]


def job_name(task: str, arm: str, seed: int) -> str:
    slug = "".join(ch if ch.isalnum() else "-" for ch in arm.lower()).strip("-")
    return f"{task}__{slug}__s{seed}"


def overrides(args, task: str, arm: str, seed: int) -> list[str]:
    return [*TASKS[task], f"task.max_train={args.max_train}", f"task.max_test={args.max_test}",
            *([f"task.max_length={args.max_length}"] if args.max_length else []),
            "model.name=smollm2", "model.readout=verbalizer", f"seed={seed}",
            f"federation.num_clients={args.clients}", f"federation.clients_per_round={args.per_round}",
            "federation.partition.scheme=dirichlet", f"federation.partition.alpha={args.alpha}",
            f"federation.rounds={args.rounds}", f"evaluation.every={args.eval_every}", "evaluation.local=false",
            "evaluation.batch_size=32", f"evaluation.round_zero={arm == DECOMFL}", "runtime.progress=false",
            f"runtime.threads={args.threads}", f"runtime.device={args.device}",
            *(["method.trainer.batch_size=" + str(args.batch)] if arm == DECOMFL else []), *ARMS[arm]]


def contrasts(args) -> list[tuple[str, str, list[str], list[str]]]:
    """(arm, reference, overrides of each) of every paired contrast between trained arms the results file reads."""
    task = next(iter(TASKS))
    return [(a, b, overrides(args, task, a, 0), overrides(args, task, b, 0)) for a, b in PAIRED if b != ZERO_SHOT]


def anchor_argv(args, task: str, seed: int) -> list[str]:
    """The authors'-code launcher's options: the ``decomfl`` arm's federation, rounds, batch and ZO settings (the
    preset's P, η, μ are DeComFL's README values, which the launcher passes by default)."""
    return ["--task", task, "--seed", str(seed), "--iterations", str(args.rounds), "--threads", str(args.threads),
            "--eval-iterations", str(args.eval_every), "--num-clients", str(args.clients), "--num-sample-clients",
            str(args.per_round), "--train-batch-size", str(args.batch), "--no-iid", "--dirichlet-alpha",
            str(args.alpha)]


def run_anchor(args, task: str, seed: int) -> str:
    """One run of DeComFL's own code into ``<runs-dir>/<task>__decomfl-authors-code__s<seed>`` (skipped when its
    ``decomfl.json`` holds a run of the same options; not resumable: their script keeps no checkpoint)."""
    out = Path(args.runs_dir) / job_name(task, ANCHOR, seed)
    opts = anchor_argv(args, task, seed)
    done = out / "decomfl.json"
    if done.exists():
        if json.loads(done.read_text()).get("launcher_argv") == opts:
            return f"{out.name}: done before"
        raise ValueError(f"{out} holds an authors'-code run with other options; use another --runs-dir")
    cmd = [sys.executable, "-m", "benchmarks.zo_decomfl_anchor", str(args.anchor_checkout), "--out", str(out), *opts]
    out.mkdir(parents=True, exist_ok=True)
    with (out / "launcher.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    result = json.loads(done.read_text())
    done.write_text(json.dumps(result | {"launcher_argv": opts}, indent=1))
    return f"{out.name}: {result['wall_seconds']:.0f} s"


def run_job(args, task: str, arm: str, seed: int) -> str:
    if arm == ANCHOR:
        return run_anchor(args, task, seed)
    return run_config(Path(args.runs_dir) / job_name(task, arm, seed), overrides(args, task, arm, seed))


def plan(args) -> list[tuple[str, str, int]]:
    arms = [*args.arms, *([ANCHOR] if args.anchors else [])]
    return [(t, a, s) for s in args.seeds for t in args.tasks for a in arms]


def _anchor(args, task: str, seed: int) -> dict | None:
    path = Path(args.runs_dir) / job_name(task, ANCHOR, seed) / "decomfl.json"
    return json.loads(path.read_text()) if path.exists() else None


def anchor_lines(args, task: str, runs: dict) -> list[str]:
    """The authors'-code table: DeComFL's decomfl_main.py beside fedpeft's ``decomfl`` preset at the same
    iterations, final dev accuracy (theirs: correct answers over the dev set; their own log's mean of per-batch
    accuracies beside it) and the bytes each side moves per client-round and in total."""
    theirs = {s: a for s in args.seeds if (a := _anchor(args, task, s))}
    ours = {s: r for s in args.seeds if (r := runs.get((DECOMFL, s)))}
    if not theirs:
        return []
    lines = [f"### {task}: DeComFL in fedpeft and in the authors' code ({AUTHORS})", "",
             "| side | dev accuracy % | their log's accuracy % | bytes up / client-round | bytes down / client-round "
             "| bytes in total | seeds done | iterations | wall seconds / iteration (evaluations included) |", "|---|---|---|---|---|---|---|---|---|"]
    for side, rows in (("fedpeft `decomfl`", ours), ("authors' code", theirs)):
        if side == "authors' code":
            acc = [r["final_dev_accuracy_exact"] for r in rows.values()]
            log = mean_std([r["final_dev_accuracy"] for r in rows.values()])
            t = [r["traffic"] for r in rows.values()]
            cells = [statistics.fmean(x[k] for x in t) for k in ("mean_up_bytes_per_client_round",
                                                                   "mean_down_bytes_per_client_round", "total_bytes")]
            iters = {r["options"].get("iterations") for r in rows.values()}
            secs = statistics.fmean(r["wall_seconds"] / max(r["options"].get("iterations") or 1, 1)
                                    for r in rows.values())
        else:
            acc, log = [_accuracy(DECOMFL, r) for r in rows.values()], "–"
            b = [_bytes(r) for r in rows.values()]
            cells = [statistics.fmean(x[i] for x in b) for i in range(3)] if b else [None] * 3
            iters = {r["last"].get("round") for r in rows.values()}
            secs = statistics.fmean(r["summary"]["wall_seconds"] / max(r["last"].get("round") or 1, 1)
                                    for r in rows.values()) if rows else None
        lines.append(f"| {side} | {mean_std(acc)} | {log} | "
                     + " | ".join(_human(c) if c is not None else "–" for c in cells)
                     + f" | {len(rows)}/{len(args.seeds)} | {', '.join(map(str, sorted(iters, key=str))) or '–'} | "
                       f"{f'{secs:.0f}' if secs is not None else '–'} |")
    diff = welch_cell([100 * _accuracy(DECOMFL, r) for r in ours.values()],
                      [100 * r["final_dev_accuracy_exact"] for r in theirs.values()])
    return lines + ["", f"fedpeft − authors' code, final dev accuracy in points: {diff}.", ""]


def _final(args, task: str, arm: str, seed: int) -> dict | None:
    out = Path(args.runs_dir) / job_name(task, arm, seed)
    if not (out / "summary.json").exists():
        return None
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"first": recs[0], "last": recs[-1], "recs": recs, "out": out,
            "summary": json.loads((out / "summary.json").read_text())}


def _accuracy(arm: str, run: dict) -> float | None:
    return run["first" if arm == ZERO_SHOT else "last"].get("accuracy")


def _per_client_round(run: dict, key: str) -> float | None:
    vals = [c[key] for r in run["recs"] for c in r.get("clients") or [] if c.get("status") == "ok" and key in c]
    return statistics.fmean(vals) if vals else None


def _passes(run: dict) -> float | None:
    """Forward passes per client-round: the zeroth-order trainer's count, or a gradient step's one forward (and one
    backward) per step; FedBPT's candidates scored."""
    zo = _per_client_round(run, "forward_passes")
    if zo is not None:
        return zo
    return _per_client_round(run, "steps") or _per_client_round(run, "candidates")


def _bytes(run: dict) -> tuple[float, float, float]:
    s = run["summary"]
    return (s.get("bytes_up_per_client_round") or 0.0, s.get("bytes_down_per_client_round") or 0.0,
            (s.get("bytes_up_total") or 0) + (s.get("bytes_down_total") or 0))


def _human(x: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B"


def render(args) -> Path:
    lines = ["# Seeded zeroth-order federated tuning: DeComFL and FedKSeed on SmolLM2-135M-Instruct", "",
             (Path(args.notes).read_text() if Path(args.notes).exists() else ""), "",
             f"Command: `python -m benchmarks.zeroth_order --runs-dir {args.runs_dir} --rounds {args.rounds} "
             f"--clients {args.clients} --per-round {args.per_round} --alpha {args.alpha} --batch {args.batch} "
             f"--max-train {args.max_train}` (resumable). {args.clients} Dirichlet (α = {args.alpha}) clients, "
             f"{args.per_round} a round, {args.rounds} rounds; final-round dev accuracy in percent, mean ± std over "
             "the finished seeds; bytes as the codec counted them.", ""]
    for task in args.tasks:
        runs = {(a, s): _final(args, task, a, s) for a in ARMS for s in args.seeds}
        runs |= {(ZERO_SHOT, s): runs[DECOMFL, s] for s in args.seeds}
        ref = [r for s in args.seeds if (r := runs[DECOMFL, s])]
        hist = ref[0]["summary"].get("label_histograms") if ref else None
        n = sum(map(sum, hist["test"])) if hist else None
        lines += [f"## {task}" + (f" (dev n = {n}; standard error of one accuracy ≤ {accuracy_se(n):.1f} points)"
                                  if n else ""), ""]
        if ref:
            maj = [majorities(r["summary"]["label_histograms"]) for r in ref]
            lines += [f"Majority class: {mean_std([m[0] for m in maj])} %; per-client majority (each client's "
                      f"training majority on its own dev shard): {mean_std([m[1] for m in maj])} %.", ""]
        lines += ["| arm | accuracy % | bytes up / client-round | bytes down / client-round | bytes in total | "
                  "forward passes / client-round | seeds done | budget / client-round | device |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for arm in [ZERO_SHOT, *args.arms]:
            done = [runs[arm, s] for s in args.seeds if runs.get((arm, s))]
            if arm == ZERO_SHOT:
                lines.append(f"| {arm} | {mean_std([_accuracy(arm, r) for r in done])} | 0 | 0 | 0 | – | "
                             f"{len(done)}/{len(args.seeds)} | none | {args.device if done else '–'} |")
                continue
            b = [_bytes(r) for r in done]
            cells = [_human(statistics.fmean(x[i] for x in b)) if b else "–" for i in range(3)]
            passes = [p for r in done if (p := _passes(r)) is not None]
            lines.append(f"| {arm} | {mean_std([_accuracy(arm, r) for r in done])} | {' | '.join(cells)} | "
                         f"{statistics.fmean(passes) if passes else '–'} | {len(done)}/{len(args.seeds)} | "
                         f"{budget_cell([measured(r['out']) for r in done])} | {args.device if done else '–'} |")
        lines += ["", "Paired differences by seed, final round, accuracy in points: mean [95 % CI] over the seeds "
                  "both arms finished (n).", "", "| arms | Δ accuracy |", "|---|---|"]
        for a, b in PAIRED:
            d = [100 * (_accuracy(a, runs[a, s]) - _accuracy(b, runs[b, s])) for s in args.seeds
                 if runs.get((a, s)) and runs.get((b, s))]
            lines.append(f"| {a} − {b} | {paired_cell(d)} |")
        lines += ["", *anchor_lines(args, task, runs)]
    return write_results(args.results, lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = grid_parser("zeroth_order", __doc__.split("\n\n")[0], threads=1, workers=1)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), metavar="ARM")
    p.add_argument("--rounds", type=int, default=100, help="rounds (DeComFL's iterations: one local step each)")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--per-round", type=int, default=2)
    p.add_argument("--alpha", type=float, default=1.0, help="Dirichlet concentration of the clients' labels")
    p.add_argument("--batch", type=int, default=32, help="examples per client-round of every trained arm")
    p.add_argument("--max-train", type=int, default=6000)
    p.add_argument("--max-test", type=int, default=1000, help="cap on the dev set (SST-2 872, RTE 277: whole)")
    p.add_argument("--max-length", type=int, default=None, help="tokens per input (default: the grid's, "
                                                                    "DeComFL's cut of each task)")
    p.add_argument("--anchors", action="store_true", help="also run DeComFL's own code for every task and seed")
    p.add_argument("--anchor-checkout", type=Path, default=Path("runs/decomfl/checkout"),
                   help="a checkout of ZidongLiu/DeComFL at 0c426e6 (see benchmarks/zo_decomfl_anchor.py)")
    p.add_argument("--device", default="cpu")
    return parse_grid_args(p, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    run_grid(args, run_job, plan(args), render)


if __name__ == "__main__":
    main()
