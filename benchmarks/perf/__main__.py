"""``python -m benchmarks.perf``: run the chosen figures and rewrite the table."""

from __future__ import annotations

import argparse
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch


import benchmarks.perf as perf
from benchmarks.perf.common import Figure, OUT
from benchmarks.perf.fig1_overhead import figure_1
from benchmarks.perf.fig2_vectorised import figure_2
from benchmarks.perf.fig3_evaluation_once import figure_3
from benchmarks.perf.fig4_6_whole_runs import figure_4, figure_6, figure_6c
from benchmarks.perf.fig5_black_box import figure_5
from benchmarks.perf.fig8_startup import figure_8
from benchmarks.perf.fig9_dpo import figure_9
from benchmarks.perf.fig10_sft import figure_10
from benchmarks.perf.report import write

def main() -> None:
    ap = argparse.ArgumentParser(description=perf.__doc__.split("\n\n")[0])
    runs = {"1": figure_1, "2": figure_2, "3": figure_3, "4": figure_4, "5": figure_5,
            "2s": lambda a: figure_2(a, "2s"), "6": figure_6, "6c": figure_6c, "8": figure_8, "9": figure_9,
            "10": figure_10}
    ap.add_argument("--figures", nargs="+", default=list(runs), choices=list(runs))
    ap.add_argument("--reps", type=int, default=3, help="alternating repetitions of each figure's two arms")
    ap.add_argument("--clients", type=int, default=20, help="clients of the BBC federation (data per client)")
    ap.add_argument("--round-clients", type=int, default=2, help="clients in figure 1's whole round")
    ap.add_argument("--vector-clients", type=int, default=4, help="figure 2: clients whose rows go together")
    ap.add_argument("--eval-examples", type=int, default=200, help="figure 3: the BBC test set evaluated")
    ap.add_argument("--bb-examples", type=int, default=32, help="figure 5a: examples the candidates are scored on")
    ap.add_argument("--lm-batch", type=int, default=8, help="figure 5b: inputs in the SmolLM2 batch")
    ap.add_argument("--scale-clients", type=int, default=1000, help="figure 4: the largest federation")
    ap.add_argument("--dist-clients", type=int, default=100, help="figure 6: clients of the BBC federation")
    ap.add_argument("--dist-rounds", type=int, default=2, help="figure 6: rounds")
    ap.add_argument("--dist-train", type=int, default=200, help="figure 6: BBC training examples (6c: a third)")
    ap.add_argument("--dist-reps", type=int, default=1, help="figure 6: repetitions of the whole runs")
    ap.add_argument("--jobs", type=int, default=1, help="processes for the one-thread figures (1-5), side by side "
                                                        "(faster, noisier ratios); figures 6 and 6c use every core "
                                                        "and run alone after them")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    alone = ("2s", "6", "6c", "8")  # these use every core (8: whole processes timed)
    single = [k for k in runs if k in args.figures and k not in alone]
    done: dict[str, list[Figure]] = {}
    if args.jobs > 1 and len(single) > 1:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=torch.set_num_threads,
                                 initargs=(1,)) as pool:
            futures = {k: pool.submit(runs[k], args) for k in single}  # figure 1, the longest, starts first
            done = {k: f.result() for k, f in futures.items()}
    else:
        done = {k: runs[k](args) for k in single}
    done |= {k: runs[k](args) for k in alone if k in args.figures}
    write([f for k in runs if k in done for f in done[k]], args, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
