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
    python -m benchmarks.zeroth_order --arms decomfl --anchors --rounds 25 --eval-every 25 --seeds 0  # + authors

``--anchors [decomfl] [fedkseed]`` adds the authors' code of those arms (``benchmarks/zo_decomfl_anchor.py``,
``benchmarks/zo_fedkseed_anchor.py``: their scripts unchanged, on checkouts under ``runs/``) for every task and seed,
at the paired arm's iterations, clients, Dirichlet α, batch, local steps, P, η, μ and K, read from its config; their
seeds draw other clients and perturbations than fedpeft's (their own RNGs), so fedpeft − authors is an unpaired
(Welch) interval over the seeds, never a paired one.

Every run is a fedpeft run directory under --runs-dir; finished runs are skipped, interrupted ones resumed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.budget import budget_cell, measured
from benchmarks.grids import load_grid
from benchmarks.lora_family import majorities
from benchmarks.runner import grid_parser, parse_grid_args, run_config, run_grid, write_results
from benchmarks.stats import accuracy_se, mean_std, paired_cell, welch_cell
from benchmarks.zo_decomfl_anchor import AUTHORS_COMMIT as DECOMFL_COMMIT, AUTHORS_REPO as DECOMFL_REPO
from benchmarks.zo_fedkseed_anchor import AUTHORS_COMMIT as FEDKSEED_COMMIT, AUTHORS_REPO as FEDKSEED_REPO
from fedpeft.resolve import load_config

GRID = load_grid("zeroth_order")
TASKS, ARMS = GRID["tasks"], GRID["arms"]
DECOMFL = "decomfl"
ZERO_SHOT = "zero-shot verbalizer (round 0)"
PAIRED = [(DECOMFL, ZERO_SHOT), ("fedkseed", ZERO_SHOT), ("fedkseed", DECOMFL), ("fedkseed-pro", "fedkseed"),
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
            "evaluation.batch_size=32", f"evaluation.round_zero={arm in ANCHORS}", "runtime.progress=false",
            f"runtime.threads={args.threads}", f"runtime.device={args.device}",
            *(["method.trainer.batch_size=" + str(args.batch)] if arm == DECOMFL else []), *ARMS[arm]]


def contrasts(args) -> list[tuple[str, str, list[str], list[str]]]:
    """(arm, reference, overrides of each) of every paired contrast between trained arms the results file reads."""
    task = next(iter(TASKS))
    return [(a, b, overrides(args, task, a, 0), overrides(args, task, b, 0)) for a, b in PAIRED if b != ZERO_SHOT]


@dataclass(frozen=True)
class Anchor:
    """An authors' code run beside one fedpeft arm: its launcher module, the checkout it runs, the results file it
    writes and how to read accuracy and bytes from it."""

    arm: str  # the fedpeft arm it is compared with (the anchor's key in ANCHORS)
    label: str  # its rows' and run directories' name
    launcher: str
    checkout: str
    result: str
    repo: str

    def argv(self, args, task: str, seed: int) -> list[str]:
        """The launcher's options: the paired arm's federation, rounds and zeroth-order settings, read from its
        resolved config (never typed twice)."""
        zo = load_config(None, overrides(args, task, self.arm, seed)).method.trainer
        common = ["--task", task, "--seed", str(seed), "--threads", str(args.threads)]
        if self.arm == DECOMFL:
            return common + ["--iterations", str(args.rounds), "--eval-iterations", str(args.eval_every),
                             "--num-clients", str(args.clients), "--num-sample-clients", str(args.per_round),
                             "--train-batch-size", str(zo.batch_size), "--local-update-steps", str(zo.local_steps),
                             "--num-pert", str(zo.perturbations), "--lr", str(zo.lr), "--mu", str(zo.mu),
                             "--grad-estimate-method", f"rge-{zo.difference}", "--no-iid", "--dirichlet-alpha",
                             str(args.alpha)]
        return common + ["--rounds", str(args.rounds), "--num_clients", str(args.clients),
                         "-m", f"{(args.per_round + 0.5) / args.clients:.6f}", "--local_step", str(zo.local_steps),
                         "--batch_size", str(zo.batch_size), "--lr", str(zo.lr), "--zo_eps", str(zo.mu),
                         "-K", str(zo.pool_size), "--iid", f"dir{args.alpha}", "--max-train", str(args.max_train)]

    def accuracy(self, r: dict) -> float:
        """Final dev accuracy, correct answers over the whole dev set."""
        return r["final_dev_accuracy_exact"] if self.arm == DECOMFL else r["final_verbalizer_accuracy"]

    def initial(self, r: dict) -> float | None:
        """Dev accuracy of the untouched model in their pipeline (their eval before any step)."""
        return r.get("initial_dev_accuracy_exact" if self.arm == DECOMFL else "round0_verbalizer_accuracy")

    def their_metric(self, r: dict) -> str:
        """What their own code reports at the end (DeComFL: the mean of per-batch accuracies; FedKSeed: its loss)."""
        if self.arm == DECOMFL:
            return f"accuracy {100 * r['final_dev_accuracy']:.1f} %"
        return f"{r['final_metric']['name']} {r['final_metric']['value']:.4f}"

    def traffic(self, r: dict) -> tuple[float, float, float]:
        """Bytes up and down per client-round and in total, as their protocol sends them (FedKSeed: the paper's
        protocol, the pool entries changed since a client's last pull going down; their simulation deep-copies the
        model instead)."""
        t = r["traffic"]
        if self.arm == DECOMFL:
            return (t["mean_up_bytes_per_client_round"], t["mean_down_bytes_per_client_round"], t["total_bytes"])
        p = t["paper"]
        return (p["mean_up_bytes_per_client_round"], p["mean_down_bytes_sparse_per_client_round"],
                p["total_up_bytes"] + p["total_down_bytes_sparse"])

    def iterations(self, r: dict) -> int:
        return r["options"]["iterations" if self.arm == DECOMFL else "rounds"]


ANCHORS = {a.arm: a for a in (
    Anchor(DECOMFL, "DeComFL, authors' code", "benchmarks.zo_decomfl_anchor", "runs/decomfl/checkout",
           "decomfl.json", f"{DECOMFL_REPO} @ {DECOMFL_COMMIT}, decomfl_main.py"),
    Anchor("fedkseed", "FedKSeed, authors' code", "benchmarks.zo_fedkseed_anchor", "runs/fedkseed/checkout",
           "fedkseed.json", f"{FEDKSEED_REPO} @ {FEDKSEED_COMMIT}, main.py"))}
ANCHOR_LABELS = {a.label: a for a in ANCHORS.values()}


def run_anchor(args, task: str, label: str, seed: int) -> str:
    """One run of an authors' code into ``<runs-dir>/<task>__<label>__s<seed>`` (skipped when its results file
    holds a run of the same options; not resumable: their scripts keep no checkpoint)."""
    anchor = ANCHOR_LABELS[label]
    out = Path(args.runs_dir) / job_name(task, label, seed)
    opts = anchor.argv(args, task, seed)
    done = out / anchor.result
    if done.exists():
        if json.loads(done.read_text()).get("benchmark_argv") == opts:
            return f"{out.name}: done before"
        raise ValueError(f"{out} holds an authors'-code run with other options; use another --runs-dir")
    cmd = [sys.executable, "-m", anchor.launcher, anchor.checkout, "--out", str(out), *opts]
    out.mkdir(parents=True, exist_ok=True)
    with (out / "launcher.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    result = json.loads(done.read_text())
    done.write_text(json.dumps(result | {"benchmark_argv": opts}, indent=1))
    return f"{out.name}: {result['wall_seconds']:.0f} s"


def run_job(args, task: str, arm: str, seed: int) -> str:
    if arm in ANCHOR_LABELS:
        return run_anchor(args, task, arm, seed)
    return run_config(Path(args.runs_dir) / job_name(task, arm, seed), overrides(args, task, arm, seed))


def plan(args) -> list[tuple[str, str, int]]:
    arms = [*args.arms, *(ANCHORS[a].label for a in args.anchors or [] if a in args.arms)]
    return [(t, a, s) for s in args.seeds for t in args.tasks for a in arms]


def _anchor(args, task: str, anchor: Anchor, seed: int) -> dict | None:
    path = Path(args.runs_dir) / job_name(task, anchor.label, seed) / anchor.result
    return json.loads(path.read_text()) if path.exists() else None


def anchor_lines(args, task: str, runs: dict, anchor: Anchor) -> list[str]:
    """An authors'-code table: their script beside fedpeft's preset at the same iterations, final dev accuracy
    (correct answers over the dev set; their own final metric beside it) and the bytes each side moves per
    client-round and in total."""
    theirs = {s: a for s in args.seeds if (a := _anchor(args, task, anchor, s))}
    ours = {s: r for s in args.seeds if (r := runs.get((anchor.arm, s)))}
    if not theirs:
        return []
    lines = [f"### {task}: {anchor.arm} in fedpeft and in the authors' code ({anchor.repo})", "",
             "| side | dev accuracy % before training | dev accuracy %, final | their final metric | bytes up / "
             "client-round | bytes down / client-round | bytes in total | seeds done | iterations | wall seconds / "
             "iteration (evaluations included) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for side, rows in ((f"fedpeft `{anchor.arm}`", ours), ("authors' code", theirs)):
        if rows is theirs:
            acc, first = [anchor.accuracy(r) for r in rows.values()], [anchor.initial(r) for r in rows.values()]
            metric = "; ".join(anchor.their_metric(r) for r in rows.values())
            t = [anchor.traffic(r) for r in rows.values()]
            iters = {anchor.iterations(r) for r in rows.values()}
            secs = statistics.fmean(r["wall_seconds"] / max(anchor.iterations(r), 1) for r in rows.values())
        else:
            acc, metric = [_accuracy(anchor.arm, r) for r in rows.values()], "–"
            first = [r["first"].get("accuracy") if r["first"].get("round") == 0 else None for r in rows.values()]
            t = [_bytes(r) for r in rows.values()]
            iters = {r["last"].get("round") for r in rows.values()}
            secs = statistics.fmean(r["summary"]["wall_seconds"] / max(r["last"].get("round") or 1, 1)
                                    for r in rows.values()) if rows else None
        cells = [_human(statistics.fmean(x[i] for x in t)) if t else "–" for i in range(3)]
        lines.append(f"| {side} | {mean_std(first)} | {mean_std(acc)} | {metric} | {' | '.join(cells)} | "
                     f"{len(rows)}/{len(args.seeds)} "
                     f"| {', '.join(map(str, sorted(iters, key=str))) or '–'} | "
                     f"{f'{secs:.0f}' if secs is not None else '–'} |")
    diff = welch_cell([100 * _accuracy(anchor.arm, r) for r in ours.values()],
                      [100 * anchor.accuracy(r) for r in theirs.values()])
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
             f"{args.per_round} a round; each arm's rounds as its runs ran them (the \"rounds\" column); "
             "final-round dev accuracy in percent, mean ± std over the finished seeds; bytes as the codec counted "
             "them.", ""]
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
        lines += ["| arm | rounds | accuracy % | bytes up / client-round | bytes down / client-round | bytes in total "
                  "| forward passes / client-round | seeds done | budget / client-round | device |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for arm in [ZERO_SHOT, *args.arms]:
            done = [runs[arm, s] for s in args.seeds if runs.get((arm, s))]
            rounds = ", ".join(sorted({str(r["last"].get("round")) for r in done})) or "–"
            if arm == ZERO_SHOT:
                lines.append(f"| {arm} | 0 | {mean_std([_accuracy(arm, r) for r in done])} | 0 | 0 | 0 | – | "
                             f"{len(done)}/{len(args.seeds)} | none | {args.device if done else '–'} |")
                continue
            b = [_bytes(r) for r in done]
            cells = [_human(statistics.fmean(x[i] for x in b)) if b else "–" for i in range(3)]
            passes = [p for r in done if (p := _passes(r)) is not None]
            lines.append(f"| {arm} | {rounds} | {mean_std([_accuracy(arm, r) for r in done])} | {' | '.join(cells)} | "
                         f"{statistics.fmean(passes) if passes else '–'} | {len(done)}/{len(args.seeds)} | "
                         f"{budget_cell([measured(r['out']) for r in done])} | {args.device if done else '–'} |")
        lines += ["", "Paired differences by seed, final round, accuracy in points: mean [95 % CI] over the seeds "
                  "both arms finished (n).", "", "| arms | Δ accuracy |", "|---|---|"]
        for a, b in PAIRED:
            d = [100 * (_accuracy(a, runs[a, s]) - _accuracy(b, runs[b, s])) for s in args.seeds
                 if runs.get((a, s)) and runs.get((b, s))]
            lines.append(f"| {a} − {b} | {paired_cell(d)} |")
        lines += ["", *(x for a in ANCHORS.values() for x in anchor_lines(args, task, runs, a))]
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
    p.add_argument("--anchors", nargs="*", choices=list(ANCHORS), default=None, metavar="ANCHOR",
                   help="also run the authors' code of these arms (all when given bare) for every task and seed "
                        "(DeComFL's from runs/decomfl/checkout, FedKSeed's from runs/fedkseed/checkout; see "
                        "benchmarks/zo_decomfl_anchor.py and zo_fedkseed_anchor.py)")
    p.add_argument("--device", default="cpu")
    args = parse_grid_args(p, argv)
    if args.anchors == []:
        args.anchors = list(ANCHORS)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    run_grid(args, run_job, plan(args), render)


if __name__ == "__main__":
    main()
