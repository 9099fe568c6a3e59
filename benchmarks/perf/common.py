"""What every figure shares: its table row (``Figure``), the alternating arms, the federation a figure
runs on (``local_work``), and the table's constants."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from fedpeft.build import build
from fedpeft.resolve import load_config


OUT = Path(__file__).parents[1] / "results" / "perf.md"
ADAPTERS = {
    "soft prompt": "{name: soft_prompt, num_tokens: 20, init: vocab, position: after_first}",
    "deep prompt": "{name: deep_prompt, num_tokens: 20}",
    "LoRA": "{name: lora, r: 16, lora_alpha: 32}",
}
NOT_YET = [
    ("7", "GPU: figures 1-2 on the GPU, demo samples/s CPU vs GPU", "–"),
]


@dataclass
class Figure:
    """One row of the table: the arms' median seconds, the per-repetition ratios A/B, the goal, notes."""

    key: str
    what: str
    arms: tuple[str, str]
    seconds: tuple[float, float]
    ratios: list[float]
    goal: str
    met: bool
    note: str
    level_at: float | None = None  # a speed-up goal's no-effect ratio (1.0): a range that holds it reads "level"

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def status(self) -> str:
        """"met" / "NOT met" by the goal; a speed-up whose per-repetition range still holds the no-effect ratio
        (``level_at``) is "level", not met: a median above 1.0 alone is no speed-up."""
        if self.met and self.level_at is not None and min(self.ratios) <= self.level_at:
            return "level"
        return "met" if self.met else "NOT met"


def clock(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def rotate(arms: list[Callable[[], tuple[float, object]]], reps: int) -> list[tuple[list[float], object]]:
    """Each arm's seconds per repetition and its last output, the arms run in rotated order (A B C, B C A, C A B,
    ...; with two arms A B, B A) so that drifts of the machine's load hit every arm alike. An arm returns
    (seconds, output): its own clock, so an arm can time a window inside its call (``clock`` times the whole)."""
    times: list[list[float]] = [[] for _ in arms]
    outs: list[object] = [None] * len(arms)
    for r in range(reps):
        for j in [(r + i) % len(arms) for i in range(len(arms))]:
            seconds, outs[j] = arms[j]()
            times[j].append(seconds)
    return list(zip(times, outs))


def alternate(a: Callable[[], object], b: Callable[[], object], reps: int) -> tuple[list[float], list[float]]:
    """Seconds of ``a`` and ``b`` per repetition, run A B, B A, A B, ... (``rotate``); the figure reports the
    median ratio, so the first repetition's one-time costs (the first arm's kernel setup for new shapes) move only
    the range."""
    (ta, _), (tb, _) = rotate([lambda: clock(a), lambda: clock(b)], reps)
    return ta, tb


def figure(key: str, what: str, arms: tuple[str, str], ta: list[float], tb: list[float], goal: str,
           met: Callable[[float], bool], note: str = "", level_at: float | None = None) -> Figure:
    """The row of arms A and B: the median of the per-repetition ratios A/B, checked by ``met``; ``level_at``: the
    no-effect ratio of a speed-up goal (see ``Figure.status``)."""
    ratios = [x / y for x, y in zip(ta, tb)]
    fig = Figure(key, what, arms, (statistics.median(ta), statistics.median(tb)), ratios, goal,
                 met(statistics.median(ratios)), note, level_at)
    print(f"[{key}] {what}: {fig.ratio:.3f}x ({min(ratios):.3f}-{max(ratios):.3f}) "
          f"{arms[0]} {fig.seconds[0]:.2f} s / {arms[1]} {fig.seconds[1]:.2f} s {note}", flush=True)
    return fig


def local_work(args, adapter: str, *extra: str):
    """FedPrompt's local work on BBC with MiniLM (batch 16, one epoch), with ``adapter``; ``--round-clients``
    train in a round; ``extra`` overrides."""
    cfg = load_config(None, ["method.name=fedprompt", "task.name=bbc", "model.name=minilm", "runtime.threads=1",
                             "runtime.progress=false", f"federation.num_clients={args.clients}",
                             f"federation.clients_per_round={args.round_clients}",
                             "method.trainer.batch_size=16", "method.trainer.local_epochs=1",
                             f"method.adapter={ADAPTERS[adapter]}", *extra])
    return build(cfg)


def step_rows(b, cid: int, round: int) -> list[list[int]]:
    """The example rows of each local step of client ``cid`` in ``round``, in the order the gradient trainers draw
    them (``gradient.train_local``: its shuffling stream, a new pass when the last one runs short)."""
    from fedpeft.rng import torch_rng
    from fedpeft.trainers.gradient import num_steps

    data, s = b.exp.client(cid).train, b.method.trainer.settings
    gen, n = torch_rng(b.plan.seed, round, cid, "local-train"), len(data)
    order, out = torch.empty(0, dtype=torch.long), []
    for _ in range(num_steps(n, s)):
        if len(order) < s.batch_size:
            order = torch.cat([order, torch.randperm(n, generator=gen)])
        idx, order = order[: min(s.batch_size, n)], order[min(s.batch_size, n):]
        out.append(idx.tolist())
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
