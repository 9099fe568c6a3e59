"""One CMA-ES step of a projected prompt on a causal LM: suffix placement with the text's key/value cache shared by
the lambda candidates, against the same suffix-placed sequences run whole (``method.adapter.kv_cache=false``).

A step is ``BlackBox.losses`` of lambda candidates z on the local set: one batched forward of lambda x n rows.
Three arms, timed in interleaved repetitions (the order rotates every repetition) in ONE process, so the ratios
share the machine's load at that moment (the build machine has 2 cores and other jobs):

- ``whole``: lambda x n sequences of text + m prompt rows, right-padded (the uncached suffix forward);
- ``cached``: the text once (n rows) to a key/value cache, tiled lambda times, then m + 1 rows per candidate
  (``kv_cache_keep=0``: the text runs in every step, as in the first local iteration of a round);
- ``kept``: the same with the text cache kept from an earlier step on the same rows (``kv_cache_keep=8``: the
  later local iterations of a round, which score the same local set).

It also reports the largest difference of the per-candidate losses between the arms (same numbers up to float
rounding). Writes ``benchmarks/results/suffix_cache.md``.

    nice -n 10 .venv/bin/python -m benchmarks.suffix_cache                      # SmolLM2-135M, AG News, m = 5 and 50
    .venv/bin/python -m benchmarks.suffix_cache --model tiny-llama --reps 3     # smoke test
"""

from __future__ import annotations

import argparse
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from fedpeft.adapters.projected_prompt import ProjectedPrompt, ProjectedPromptSettings
from fedpeft.model.blackbox import BlackBox
from fedpeft.model.classifier import Classifier
from fedpeft.backbones.loading import load_backbone
from fedpeft.data import load_task
from fedpeft.resolve import load_config

HERE = Path(__file__).resolve().parent
ARMS = {"whole": {"kv_cache": False}, "cached": {"kv_cache": True, "kv_cache_keep": 0},
        "kept": {"kv_cache": True, "kv_cache_keep": 8}}


def black_boxes(args, tokens: int) -> tuple[dict[str, BlackBox], object]:
    """One black box per arm over the same backbone, projection seed and local set of ``args.rows`` examples."""
    cfg = load_config(None, [f"task.name={args.task}", f"task.max_length={args.max_length}",
                             f"model.name={args.model}"])
    task = load_task(cfg.task, 0)
    backbone = load_backbone(args.model)
    boxes = {}
    for arm, extra in ARMS.items():
        adapter = ProjectedPrompt(ProjectedPromptSettings(num_tokens=tokens, intrinsic_dim=args.dim, seed=0,
                                                          placement="suffix", **extra))
        clf = Classifier(backbone, adapter, task, "verbalizer", max_length=args.max_length)
        boxes[arm] = BlackBox(clf, max_rows=args.popsize * args.rows)  # one forward per step
    return boxes, clf.encode(task.train[:args.rows])  # every arm encodes alike


def step_times(boxes: dict[str, BlackBox], data, args) -> tuple[dict[str, list[float]], float]:
    """Seconds per step of every arm over ``args.reps`` interleaved repetitions (after one warm-up step each),
    and the largest per-candidate loss difference to ``whole``."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(args.popsize, args.dim, generator=gen)
    losses = {arm: box.losses(z, data) for arm, box in boxes.items()}  # warm-up; fills the kept text cache
    diff = max(float((losses[a] - losses["whole"]).abs().max()) for a in boxes)
    times: dict[str, list[float]] = {arm: [] for arm in boxes}
    order = list(boxes)
    for rep in range(args.reps):
        z = torch.randn(args.popsize, args.dim, generator=gen)
        for arm in order[rep % len(order):] + order[:rep % len(order)]:
            start = time.perf_counter()
            boxes[arm].losses(z, data)
            times[arm].append(time.perf_counter() - start)
    return times, diff


def row(tokens: int, times: dict[str, list[float]], diff: float, lengths: list[int]) -> str:
    med = {arm: statistics.median(t) for arm, t in times.items()}
    ratio = {arm: statistics.median(w / c for w, c in zip(times["whole"], times[arm])) for arm in ("cached", "kept")}
    return (f"| {tokens} | {statistics.mean(lengths):.1f} ({min(lengths)}-{max(lengths)}) | {med['whole']:.3f} | "
            f"{med['cached']:.3f} | {med['kept']:.3f} | **{ratio['cached']:.2f}x** | **{ratio['kept']:.2f}x** | "
            f"{diff:.1e} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--task", default="agnews")
    p.add_argument("--rows", type=int, default=40, help="examples in the local set (n)")
    p.add_argument("--max-length", type=int, default=64, help="task.max_length (text tokens, prompt excluded)")
    p.add_argument("--popsize", type=int, default=5, help="lambda")
    p.add_argument("--dim", type=int, default=500, help="intrinsic dimension d")
    p.add_argument("--tokens", type=int, nargs="+", default=[5, 50], help="prompt lengths m to measure")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=HERE / "results" / "suffix_cache.md")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lines = []
    for tokens in args.tokens:
        boxes, data = black_boxes(args, tokens)
        times, diff = step_times(boxes, data, args)
        lines.append(row(tokens, times, diff, [len(r) for r in data.input_ids]))
        print(lines[-1], flush=True)
    command = shlex.join([".venv/bin/python", "benchmarks/suffix_cache.py", *sys.argv[1:]])
    text = f"""# Suffix placement: the text's key/value cache shared by the CMA-ES candidates

Command: `nice -n 10 {command}` ({args.model}, {args.task} train rows, n = {args.rows}, task.max_length =
{args.max_length}, lambda = {args.popsize}, d = {args.dim}, {args.reps} interleaved repetitions,
torch threads = {args.threads}, {platform.processor() or platform.machine()}, torch {torch.__version__}).

One CMA-ES step = the losses of lambda candidates on the n rows (``BlackBox.losses``, one batched forward).
Seconds are medians; speedups are medians of the per-repetition ratios whole / arm (same repetition, so the
machine's load at that moment cancels). ``cached``: the text runs every step (first local iteration of a round);
``kept``: its cache is reused (later iterations on the same local set). Max |diff|: largest difference of a
per-candidate loss from ``whole``.

| m | text tokens per row, mean (range) | whole s | cached s | kept s | speedup cached | speedup kept | max abs diff |
|---|---|---|---|---|---|---|---|
""" + "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
