"""What each arm of a benchmark trained with: planned from its config before anything runs, measured from its run
directories after, so that a results table shows every arm's budget beside its score and a contrast between two
arms cannot hide a difference in how long or how hard they trained.

- ``planned(cfg)``: the budget keys of a resolved config: rounds, clients a round, training examples, the local
  trainer and each of its settings (the gradient trainers' learning rate of the adapter's tensors, ``lr``, and of the
  linear readout head, ``head lr``, which is ``lr`` unless ``head_lr`` is set), the tiers' step caps and the
  post-tuning settings. ``differences(a, b)`` lists the keys two arms differ in; ``tests/unit/test_grid_budgets.py``
  fails on any difference between the arms of a paired contrast that the grid does not declare (``budget_differences``
  in ``benchmarks/grids/<name>.yaml``: arm -> {key: why}).
- ``measured(run_dir)``: from ``metrics.jsonl`` the mean local optimizer steps and examples seen per client-round
  over every accepted reply of the run (forward-only trainers: the candidates and examples their forwards scored), from
  ``config.yaml`` each trained part's learning rate, the weight decay and the device. ``budget_cell`` writes the runs of
  one arm as one table cell.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# trainer settings that change how a step is computed, not what it trains on (rows per forward pass)
LAYOUT = ("batched", "max_rows")
# a gradient trainer's constant rate without warm-up: what every trainer did before these keys (no budget key)
NO_SCHEDULE = (("schedule", "constant"), ("warmup_ratio", 0.0))


def _head(cfg) -> bool:
    """Whether the config trains a linear readout head (a classification task read by ``model.readout: linear``)."""
    return cfg.model.readout == "linear" and cfg.task.kind != "generation"


def planned(cfg) -> dict[str, Any]:
    """The budget keys of a resolved ``ExperimentConfig`` (see the module docstring)."""
    trainer = cfg.method.trainer.model_dump(mode="json")
    out: dict[str, Any] = {"rounds": cfg.federation.rounds, "clients per round": cfg.federation.clients_per_round,
                           "training examples": cfg.task.max_train, "trainer": trainer.pop("name")}
    head_lr = trainer.pop("head_lr", None)
    out |= {k: v for k, v in trainer.items() if k not in LAYOUT and (k, v) not in NO_SCHEDULE}
    if "lr" in trainer and _head(cfg):
        out["head lr"] = trainer["lr"] if head_lr is None else head_lr
    caps = [p.max_steps for p in cfg.federation.client_profiles]
    if any(c is not None for c in caps):
        out["tier step caps"] = caps
    post = cfg.method.post_tuning.model_dump(mode="json")
    if post.pop("name") != "none":
        out |= {f"post-tuning {k}": v for k, v in post.items() if k not in LAYOUT}
    return out


def differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """key -> (a's value, b's value) for every budget key the two planned budgets differ in (a key one lacks counts)."""
    return {k: (a.get(k), b.get(k)) for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)}


@dataclass(frozen=True)
class Budget:
    """One run's measured budget: means per client-round over its accepted replies."""

    steps: float | None         # local optimizer steps (gradient trainers)
    examples: float | None      # examples a client-round trains on: gradient trainers steps × min(batch size, the
    #                             client's examples); forward-only trainers the examples their forwards scored
    rates: tuple[tuple[str, float], ...]  # (part, learning rate): the adapter's tensors, the readout head
    weight_decay: float | None
    device: str
    candidates: float | None = None  # forward-only trainers: candidates scored (CMA-ES, discrete search)


def measured(run_dir: str | Path) -> Budget:
    """The budget of the run in ``run_dir``, from its ``config.yaml`` and ``metrics.jsonl``."""
    import yaml

    out = Path(run_dir)
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    trainer = cfg["method"]["trainer"]
    batch = trainer.get("batch_size")
    steps, examples, candidates = [], [], []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        for c in json.loads(line).get("clients") or []:
            if c.get("status") != "ok":
                continue
            if c.get("steps") is not None:
                steps.append(c["steps"])
                if batch and c.get("num_examples"):
                    examples.append(c["steps"] * min(batch, c["num_examples"]))
            elif c.get("candidates") is not None:  # a forward-only trainer reports what its forwards scored
                candidates.append(c["candidates"])
                if c.get("examples") is not None:
                    examples.append(c["examples"])
    rates: list[tuple[str, float]] = []
    if "lr" in trainer:
        rates.append(("adapter", trainer["lr"]))
        if cfg["model"].get("readout") == "linear" and cfg["task"].get("kind") != "generation":
            rates.append(("head", trainer["lr"] if trainer.get("head_lr") is None else trainer["head_lr"]))
    mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
    return Budget(mean(steps), mean(examples), tuple(rates), trainer.get("weight_decay"),
                  str(cfg["runtime"]["device"]), mean(candidates))


def rate(x: float) -> str:
    """A learning rate as people write it: 0.03, 1e-3, 2e-5."""
    if x >= 0.01:
        return f"{x:g}"
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def budget_cell(budgets: list[Budget], device: bool = False) -> str:
    """One arm's runs as a cell: 'steps · examples · lr (head lr) · wd' per client-round (forward-only trainers:
    'candidates · examples' their forwards scored), the means over its runs (values that differ between the runs are
    all listed); with ``device`` the devices too; '–' for no run."""
    if not budgets:
        return "–"

    def joined(values: list[str]) -> str:
        return "/".join(dict.fromkeys(values))

    parts = []
    steps = [b.steps for b in budgets if b.steps is not None]
    if steps:
        parts.append(f"{statistics.fmean(steps):.1f} steps")
    candidates = [b.candidates for b in budgets if b.candidates is not None]
    if candidates:
        parts.append(f"{statistics.fmean(candidates):.0f} candidates")
    examples = [b.examples for b in budgets if b.examples is not None]
    if examples:
        parts.append(f"{statistics.fmean(examples):.0f} ex.")
    rates = joined([" / ".join(f"{part} {rate(r)}" if part != "adapter" else f"lr {rate(r)}" for part, r in b.rates)
                    for b in budgets if b.rates])
    if rates:
        parts.append(rates)
    wd = joined([f"wd {b.weight_decay:g}" for b in budgets if b.weight_decay is not None])
    if wd:
        parts.append(wd)
    if device:
        parts.append(joined([b.device for b in budgets]))
    return " · ".join(parts) or "–"


def mixed_pairs(devices_a: dict[int, str], devices_b: dict[int, str]) -> int:
    """How many seeds both arms finished on two different devices (pairs a table must flag)."""
    return sum(devices_a[s] != devices_b[s] for s in devices_a if s in devices_b)
